"""Held out means held out: which audit attacks each run's method trains against, read from the configs as the
workflow reads them (audit/heldout.py, the schema's x-trains-against), and the marks in the tables and targets."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import REPO

from idunlearn.audit.heldout import (audit_attacks, declared_training_attacks, mark_trained_against,
                                     trained_against, training_attacks, worstcase_probe)
from idunlearn.audit.tables import audit_markdown, audit_summary
from idunlearn.audit.targets import audit_targets
from idunlearn.config import deep_update, load_config, load_schema, method_settings

OVERLAYS = [[], ["study.yaml"], ["study.yaml", "robust.yaml"], ["study.yaml", "worstcase.yaml"],
            ["study.yaml", "robust.yaml", "worstcase.yaml"]]


def overlaid(overlays: list[str], extra: dict | None = None) -> dict:
    """config.yaml with ``overlays`` merged over it key by key (lists replaced), as snakemake --configfile does."""
    merged = {}
    for name in overlays:
        merged = deep_update(merged, yaml.safe_load((REPO / "config" / name).read_text()))
    return load_config(REPO / "config" / "config.yaml", deep_update(merged, extra or {}))


def training_ranges(cfg: dict) -> list[tuple[str, str, float, float]]:
    """(run, attack kind, lr low, lr high) of every unlearning run of ``cfg``, audited or not."""
    return [(run, a["attack"], a["lr_low"], a["lr_high"]) for run in cfg["unlearning"]["runs"]
            for a in training_attacks(cfg, run)]


@pytest.fixture(scope="module")
def robust() -> dict:
    return overlaid(["study.yaml", "robust.yaml", "worstcase.yaml"],
                    {"audit": {"runs": ["piu_100", "piu_robust", "piu_meta", "retrain"]}})


@pytest.fixture(scope="module")
def marks(robust) -> pd.DataFrame:
    training = {run: training_attacks(robust, run) for run in robust["audit"]["runs"]}
    return trained_against(training, robust["audit"]["probes"]).set_index(["run", "probe"])["trained_against"]


def test_piu_meta_trains_against_the_relearning_probe_at_1e4_and_nothing_else_does(robust, marks):
    # robust.yaml: piu_meta's simulated attacker draws its lr log-uniformly in [1e-4, 5e-4]
    assert training_attacks(robust, "piu_meta") == [
        {"attack": "embedding_search", "lr_low": 0.01, "lr_high": 0.01, "data": "forget_train",
         "setting": "attack_lr", "seeds": "stream 15 of the run seed"},
        {"attack": "relearning", "lr_low": 1e-4, "lr_high": 5e-4, "data": "forget_train",
         "setting": "meta_inner_lr", "seeds": "stream 37 of the run seed"}]
    for probe in ("relearning", "relearning_heldout:lr_x1", worstcase_probe("full", 1e-4),
                  worstcase_probe("all_cross_attention", 1e-4)):
        assert marks[("piu_meta", probe)], probe
        assert not marks[("piu_robust", probe)] and not marks[("piu_100", probe)] and not marks[("retrain", probe)]
    # x0.1 and x10 (1e-5, 1e-3), the LoRA at 1e-3 and benign fine-tuning (other people's photos) stay held out
    for probe in ("relearning_heldout:lr_x0.1", "relearning_heldout:lr_x10", "relearning_heldout:lora_r4",
                  "relearning_heldout:benign", worstcase_probe("full", 1e-5), worstcase_probe("full", 1e-3)):
        assert not marks[("piu_meta", probe)], probe


def test_the_heldout_embedding_attack_is_trained_against_by_the_robust_methods(marks):
    # the same search (unlearning/adversarial.py), lr 0.01 and forget-train photos as piu_robust's inner attack:
    # twice the budget and six restarts from other seeds are the same attack run longer
    for run in ("piu_robust", "piu_meta"):
        assert marks[(run, "attack")] and marks[(run, "attack_heldout")]
    assert not marks[("piu_100", "attack_heldout")] and not marks[("retrain", "attack_heldout")]


@pytest.mark.parametrize("overlays", OVERLAYS)
def test_heldout_relearning_rates_lie_outside_every_training_range_in_the_configs_as_read(overlays):
    cfg = overlaid(overlays)
    probes = {**cfg["audit"]["probes"], "relearning": cfg["audit"]["probes"].get("relearning", {"lr": 1e-4}),
              "relearning_worstcase": cfg["audit"]["probes"].get("relearning_worstcase", {
                  "lrs": [1e-5, 1e-4, 1e-3], "regimes": ["full"]})}
    held_out = [1e-5, 1e-3]  # the protocol's outer rates; the variants' x0.1 and x10 of the probe's 1e-4
    rates = {spec["lr"] for spec in audit_attacks(probes).values() if spec["attack"] == "relearning"}
    assert all(any(np.isclose(rate, r) for r in rates) for rate in held_out)
    relearning = [r for r in training_ranges(cfg) if r[1] == "relearning"]
    for run, _, low, high in relearning:
        for rate in held_out:
            assert not low <= rate <= high, (run, rate, low, high)
    assert bool(relearning) == ("robust.yaml" in overlays)  # piu_meta is the only relearning-trained run


def test_a_widened_attacker_range_makes_the_outer_rates_trained_against_too(robust):
    widened = overlaid(["study.yaml", "robust.yaml", "worstcase.yaml"],
                       {"unlearning": {"runs": {"piu_meta": {"meta_inner_lr": [1.0e-5, 1.0e-3]}}}})
    training = {"piu_meta": training_attacks(widened, "piu_meta")}
    got = trained_against(training, widened["audit"]["probes"]).set_index("probe")["trained_against"]
    assert got[worstcase_probe("full", 1e-5)] and got[worstcase_probe("full", 1e-3)]
    assert got["relearning_heldout:lr_x0.1"] and got["relearning_heldout:lr_x10"]


def test_switched_off_inner_attacks_and_tuning_grids_are_read_from_the_settings(robust):
    off = overlaid(["study.yaml", "robust.yaml"], {"unlearning": {"runs": {
        "piu_meta": {"meta_inner_steps": [0, 0]}, "piu_robust": {"attack_every": None}}}})
    assert [a["attack"] for a in training_attacks(off, "piu_meta")] == ["embedding_search"]
    unweighted = overlaid(["study.yaml", "robust.yaml"], {"unlearning": {"runs": {"piu_meta": {"meta_weight": 0.0}}}})
    assert [a["attack"] for a in training_attacks(unweighted, "piu_meta")] == ["embedding_search"]
    assert [a["attack"] for a in training_attacks(off, "piu_meta_at_theta")] == ["embedding_search"]  # 0 steps
    assert training_attacks(off, "piu_robust") == [] and training_attacks(off, "retrain") == []
    # a tuned run may train at any lr its grid offers: the range covers the grid
    tuned = overlaid(["study.yaml", "robust.yaml"], {"tuning": {"methods": {
        "piu_robust": {"grid": {"attack_lr": [0.003, 0.03]}}}}})
    search = training_attacks(tuned, "piu_robust.tuned")
    assert [(a["attack"], a["lr_low"], a["lr_high"]) for a in search] == [("embedding_search", 0.003, 0.03)]


def test_every_declared_training_range_names_settings_its_method_reads():
    declared = load_schema()["properties"]["unlearning"]["properties"]["defaults"]["x-trains-against"]
    assert set(declared) >= {"piu_robust", "piu_meta"}
    for method in declared:
        reads = method_settings(method, {}).declared
        for kind, entry in declared_training_attacks(method).items():
            switches = entry["switch"] if isinstance(entry["switch"], list) else [entry["switch"]]
            assert {entry["lr"], *switches} <= reads, (method, kind)


def test_tables_and_targets_mark_trained_against_cells_and_the_headline_shows_them_as_such():
    rows = []
    for identity in (1, 2, 3):
        for run, recovery, success in (("original", np.nan, 0.9), ("meta", 0.2, 0.1), ("piu", 0.8, 0.5)):
            base = {"run": run, "identity": identity, "ci_low": np.nan, "ci_high": np.nan, "n": 8, "cosine": np.nan}
            rows += [{**base, "probe": "relearning_heldout:lr_x1", "setting": "k=50", "metric": "recovery",
                      "value": recovery},
                     {**base, "probe": "attack_heldout", "setting": "best", "metric": "fa", "value": success},
                     {**base, "probe": "evaluation", "setting": "retain", "metric": "ism", "value": 0.6}]
    marks = pd.DataFrame({"run": ["meta", "meta", "piu"], "probe": ["relearning_heldout:lr_x1", "attack_heldout",
                                                                      "relearning_heldout:lr_x1"],
                          "trained_against": [True, False, False]})
    table = mark_trained_against(pd.DataFrame(rows), marks)
    assert table.groupby(["run", "probe"])["trained_against"].all().to_dict() == {
        ("meta", "attack_heldout"): False, ("meta", "evaluation"): False, ("meta", "relearning_heldout:lr_x1"): True,
        ("original", "attack_heldout"): False, ("original", "evaluation"): False,
        ("original", "relearning_heldout:lr_x1"): False, ("piu", "attack_heldout"): False,
        ("piu", "evaluation"): False, ("piu", "relearning_heldout:lr_x1"): False}
    page = audit_markdown(audit_summary(table, seed=0), {"tau": 0.4, "far_target": 0.01, "far_heldout": 0.01})
    meta = next(line for line in page.splitlines() if line.startswith("| meta |"))
    piu = next(line for line in page.splitlines() if line.startswith("| piu |"))
    assert "trained against: 0.20" in meta and "trained against" not in meta.replace("trained against: 0.20", "")
    assert "trained against" not in piu
    targets = audit_targets(table, {"attack_success_max": 0.15, "relearning": [{"steps": 50, "max": 0.3}],
                                    "retain_ratio_min": 0.95}, None, None, seed=0).set_index(["run", "probe"])
    assert targets.loc[("meta", "relearning_heldout:lr_x1"), "trained_against"]
    assert not targets.loc[("meta", "attack_heldout"), "trained_against"]
    assert not targets.loc[("piu", "relearning_heldout:lr_x1"), "trained_against"]
