"""The worst-case relearning protocol (audit/relearning_worstcase.py): its headline on a hand-built table, the
trained-against cells left out of it, and the probe end to end on the tiny test world."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_world import tiny_generator

from idunlearn.audit import relearning_worstcase
from idunlearn.audit.heldout import WORSTCASE, heldout_seed, mark_trained_against, worstcase_probe
from idunlearn.audit.relearning_worstcase import (worstcase_cells, worstcase_markdown, worstcase_relearning_rows,
                                                  worstcase_summary)
from idunlearn.models.layers import is_cross_attention

FULL, XATTN = "full", "all_cross_attention"
# run "a"'s forget ISM at 50 steps, seed 0, on identities 1, 2, 3; retrain has 0.3 in every cell
A_ISM = {(1e-5, FULL): [0.35, 0.40, 0.30], (1e-5, XATTN): [0.30, 0.30, 0.33],
         (1e-3, FULL): [0.50, 0.60, 0.70], (1e-3, XATTN): [0.40, 0.45, 0.50]}
A_SPREAD = [0.55, 0.45]  # run "a" at (1e-3, full), seeds 1 and 2, identity 1 (retrain: 0.3 again)


def row(run, identity, lr, regime, seed, k, value):
    return {"run": run, "identity": identity, "probe": worstcase_probe(regime, lr), "setting": f"seed={seed},k={k}",
            "metric": "ism", "value": value, "ci_low": np.nan, "ci_high": np.nan, "n": 16, "cosine": np.nan}


@pytest.fixture
def table() -> pd.DataFrame:
    rows = []
    for (lr, regime), values in A_ISM.items():
        for identity, value in zip((1, 2, 3), values):
            rows += [row("a", identity, lr, regime, 0, 50, value), row("retrain", identity, lr, regime, 0, 50, 0.3)]
    for seed, value in zip((1, 2), A_SPREAD):
        rows += [row("a", 1, 1e-3, FULL, seed, 50, value), row("retrain", 1, 1e-3, FULL, seed, 50, 0.3)]
    rows.append(row("original", 1, 1e-3, FULL, 0, 50, 0.9))  # no run under test: no cells, no headline
    return pd.DataFrame(rows)


def test_each_cell_stands_beside_the_references_value_in_the_same_cell(table):
    cells = worstcase_cells(mark_trained_against(table, pd.DataFrame(columns=["run", "probe", "trained_against"])),
                            "retrain")
    assert set(cells["run"]) == {"a"}  # the original model is no run under test
    a = cells[cells["run"] == "a"]
    assert len(a) == 14 and (a["reference"] == 0.3).all()
    worst = a[(a["lr"] == 1e-3) & (a["regime"] == FULL) & (a["seed"] == 0)].set_index("identity")["excess"]
    np.testing.assert_allclose(worst.loc[[1, 2, 3]], [0.2, 0.3, 0.4])
    # a cell the reference lacks has no excess
    lone = worstcase_cells(table[~((table["run"] == "retrain") & (table["identity"] == 3))], "retrain")
    assert lone.loc[(lone["run"] == "a") & (lone["identity"] == 3), "excess"].isna().all()


def test_the_headline_is_the_largest_mean_excess_over_lr_and_regime_by_hand(table):
    cells = worstcase_cells(table, "retrain")
    assert set(worstcase_summary(cells, "retrain", seed=0)["run"]) == {"a"}
    summary = worstcase_summary(cells, "retrain", seed=0).iloc[0]
    # mean excess per (lr, regime): 0.05, 0.01, 0.30, 0.15: the worst case is 1e-3 full UNet
    assert (summary["worst_lr"], summary["worst_regime"], summary["steps"]) == (1e-3, FULL, 50)
    assert summary["excess"] == pytest.approx(0.30) and summary["n"] == 3
    # differences 0.2, 0.3, 0.4: sd 0.1, Student t(0.975, 2 df) = 4.302653 -> half width 0.248414
    assert (summary["t_low"], summary["t_high"]) == pytest.approx((0.051586, 0.548414), abs=1e-6)
    assert summary["p_wilcoxon"] == pytest.approx(0.25)  # exact signed-rank, n = 3, all positive: 2 / 2^3
    # seed spread at the worst cell on identity 1: excesses 0.2, 0.25, 0.15 -> range 0.10
    assert summary["spread_identities"] == 1 and summary["seed_spread"] == pytest.approx(0.10)
    assert (summary["held_out_cells"], summary["trained_against_cells"]) == (4, 0)


def test_a_trained_against_cell_is_left_out_of_that_runs_headline(table):
    marks = pd.DataFrame({"run": ["a"], "probe": [worstcase_probe(FULL, 1e-3)], "trained_against": [True]})
    cells = worstcase_cells(mark_trained_against(table, marks), "retrain")
    assert cells.loc[(cells["lr"] == 1e-3) & (cells["regime"] == FULL), "trained_against"].all()
    summary = worstcase_summary(cells[cells["run"] == "a"], "retrain", seed=0).iloc[0]
    assert (summary["worst_lr"], summary["worst_regime"]) == (1e-3, XATTN)
    assert summary["excess"] == pytest.approx(0.15)
    assert (summary["held_out_cells"], summary["trained_against_cells"]) == (3, 1)
    assert summary["spread_identities"] == 0  # the only multi-seed cell was trained against
    page = worstcase_markdown(worstcase_summary(cells, "retrain", seed=0))
    assert "| a | ism | 50 | 0.001, all_cross_attention | 0.150 (" in page and "`retrain`" in page
    everything = pd.DataFrame({"run": ["a"] * 4, "probe": [worstcase_probe(r, lr) for lr, r in A_ISM],
                               "trained_against": True})
    none_left = worstcase_summary(worstcase_cells(mark_trained_against(table, everything), "retrain"), "retrain", 0)
    assert np.isnan(none_left.set_index("run").loc["a", "excess"])  # no held-out cell: no headline, not zero


def distance(generator, reference: dict[str, torch.Tensor], cross: bool) -> float:
    """L2 distance of the (cross-attention or other) UNet weights of ``generator`` from ``reference``."""
    return float(sum(((p.detach() - reference[n]) ** 2).sum() for n, p in generator.unet.named_parameters()
                     if is_cross_attention(n) == cross) ** 0.5)


def test_the_probe_runs_end_to_end_on_the_tiny_world_cheaply(monkeypatch):
    """The real fine-tuning (audit/relearning.py relearn, unlearning/finetune.py step) on the tiny generator; the
    measurement stands in for the evaluation's face scoring: the distance the weights moved, cross-attention as "fa",
    the rest as "ism" (the evaluation set and its scoring are tested with the relearning probe)."""
    generator = tiny_generator(3)
    given = {n: p.detach().clone() for n, p in generator.unet.named_parameters()}

    def forget_measure(analyser, selection, faces, labels, centroids, evaluation_cfg, tau, seed):
        return (lambda g: {"ism": distance(g, given, cross=False), "fa": distance(g, given, cross=True)}), 16

    rng = np.random.default_rng(0)
    latents = torch.rand(5, *generator.latent_shape, generator=torch.Generator().manual_seed(1)) * 2 - 1
    embeddings = rng.standard_normal((5, 16)).astype(np.float32)
    used = []

    def image_pairs(g, manifest, faces, images):
        used.append(list(images))
        return latents[:len(images)], embeddings[:len(images)]

    monkeypatch.setattr(relearning_worstcase, "forget_measure", forget_measure)
    monkeypatch.setattr(relearning_worstcase, "image_pairs", image_pairs)
    # the protocol's rates and regimes; steps 2 and 5 for 10, 50 and 200 (a tiny step costs what a mini one does
    # on a loaded 2-core host: its overhead, not its arithmetic)
    cfg = {"lrs": [1e-5, 1e-4, 1e-3], "regimes": [FULL, XATTN], "steps": [0, 2, 5], "images": None,
           "batch": 4, "seeds": 1}
    selection = {"forget_train_images": ["f4", "f2", "f3", "f1", "f0"]}
    start = time.perf_counter()
    rows = pd.DataFrame(worstcase_relearning_rows(generator, None, selection, None, None, None, None, {}, cfg, 0.4,
                                                  seed=7))
    seconds = time.perf_counter() - start
    assert seconds < 60, seconds
    assert used == [["f0", "f1", "f2", "f3", "f4"]]  # every forget-train photo, in order
    for name, p in generator.unet.named_parameters():  # the model given is left as it is
        assert torch.equal(p, given[name]), name
    assert len(rows) == 3 * 2 * 3 * 2 and set(rows["n"]) == {16}
    value = rows.set_index(["probe", "setting", "metric"])["value"]
    for lr in cfg["lrs"]:
        assert value[(worstcase_probe(FULL, lr), "seed=0,k=0", "ism")] == 0  # k = 0: the model as given
        for k in (2, 5):  # cross-attention only: nothing else moves; the full UNet moves both
            assert value[(worstcase_probe(XATTN, lr), f"seed=0,k={k}", "ism")] == 0
            assert value[(worstcase_probe(XATTN, lr), f"seed=0,k={k}", "fa")] > 0
            assert value[(worstcase_probe(FULL, lr), f"seed=0,k={k}", "ism")] > 0
    for regime in (FULL, XATTN):  # a larger step moves further, and further with more steps
        moved = [value[(worstcase_probe(regime, lr), "seed=0,k=5", "fa")] for lr in cfg["lrs"]]
        assert moved == sorted(moved) and moved[0] < moved[2]
        curve = [value[(worstcase_probe(regime, 1e-3), f"seed=0,k={k}", "fa")] for k in (0, 2, 5)]
        assert curve == sorted(curve)
    # the same held-out seeds in every run's job: a second job draws the same batches and noise (here on the same
    # model: the same values), whatever else it runs; another seed index draws others
    assert heldout_seed(7, WORSTCASE, 0) != heldout_seed(7, WORSTCASE, 1)
    two = pd.DataFrame(worstcase_relearning_rows(generator, None, selection, None, None, None, None, {},
                                                 {**cfg, "lrs": [1e-3], "regimes": [XATTN], "steps": [0, 2],
                                                  "seeds": 2}, 0.4, seed=7)).set_index(["setting", "metric"])
    assert two.loc[("seed=0,k=2", "fa"), "value"] == value[(worstcase_probe(XATTN, 1e-3), "seed=0,k=2", "fa")]
    assert two.loc[("seed=0,k=2", "fa"), "value"] != two.loc[("seed=1,k=2", "fa"), "value"]
    print(f"worst-case protocol on the tiny world: {seconds:.1f} s for 6 runs of 5 steps")
