"""Worst-case relearning protocol: how much of a forgotten person fine-tuning brings back, beyond what it teaches a
model that never saw them, at the attacker's best learning rate and regime.

In a job of its own per audited model and identity (audit.probes.relearning_worstcase, rule audit_worstcase): one
fine-tuning run of a fresh copy of the model per (learning rate, regime, seed) on the forget-train photos (the
relearning probe's step, audit/relearning.py ``relearn`` with unlearning/finetune.py's recipe), measured on the
evaluation's forget samples (ISM and FA) at every step count, checkpoints of that one run. The seeds come from the held-out stream and are the same in every run's job, so the
never-trained reference (``retrain``) fine-tuned in its own job on the same identity meets the same batches and noise:
each cell (run, learning rate, regime, steps, seed, identity) stands beside the reference's, and the excess
run - reference is what the run still remembers (at 1e-3 fine-tuning teaches even the reference a new person).

Headline (``worstcase_summary``), per run, metric and step count: the worst case over learning rate and regime of the
mean excess over identities (seed 0, every identity), with its paired Student-t and bootstrap intervals over
identities and Wilcoxon p; cells inside a learning-rate range the run's method trains against (audit/heldout.py) are
marked and left out of its headline. The seed spread: on the identities run with several seeds, the range of the
excess across seeds at the worst cell.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd

from ..evaluation.statistics import mean_difference
from ..faces.analyser import FaceAnalyser
from ..models.generator import IdentityGenerator
from ..runlog import logs_duration
from .heldout import WORSTCASE, heldout_seed, worstcase_cell, worstcase_probe
from .relearning import forget_measure, image_pairs, relearn
from .tables import ORIGINAL

CELL_COLUMNS = ["run", "lr", "regime", "steps", "seed", "identity", "metric", "value", "reference", "excess",
                "trained_against"]
SUMMARY_COLUMNS = ["run", "metric", "steps", "reference", "n", "excess", "t_low", "t_high", "boot_low", "boot_high",
                   "p_wilcoxon", "worst_lr", "worst_regime", "held_out_cells", "trained_against_cells",
                   "spread_identities", "seed_spread"]
METRICS = ("ism", "fa")


def worstcase_records(generator: IdentityGenerator, latents, embeddings: np.ndarray, cfg: dict, seed: int, measure,
                      initial: dict) -> list[tuple[str, int, list[dict]]]:
    """(probe, seed index, ``relearn`` records) of every (seed index, learning rate, regime) of ``cfg`` (lrs,
    regimes, steps, batch, seeds): a fresh copy of ``generator`` (left as it is) fine-tuned on (``latents``,
    ``embeddings``) from the held-out seed of that seed index (the same for every learning rate and regime, and in
    every run's job), measured at every step count; ``initial``: the measurement of the model as given (k = 0)."""
    out = []
    for index in range(cfg["seeds"]):
        run_seed = heldout_seed(seed, WORSTCASE, index)
        for lr in cfg["lrs"]:
            for regime in cfg["regimes"]:
                settings = {"regime": regime, "batch": cfg["batch"], "lr": lr}
                records = relearn(copy.deepcopy(generator), latents, embeddings, cfg["steps"], settings, run_seed,
                                  measure, initial=initial)
                out.append((worstcase_probe(regime, lr), index, records))
    return out


@logs_duration("worst-case relearning protocol")
def worstcase_relearning_rows(generator: IdentityGenerator, analyser: FaceAnalyser, selection: dict,
                              manifest: pd.DataFrame, faces: pd.DataFrame, labels: pd.DataFrame,
                              centroids: pd.DataFrame, evaluation_cfg: dict, cfg: dict, tau: float,
                              seed: int) -> list[dict]:
    """The protocol's rows on one forget identity: probe ``relearning_worstcase:<regime>@<lr>``, setting
    ``seed=<i>,k=<steps>``, metrics ism and fa of the evaluation's forget samples (same conditions and noise as the
    evaluation stage); ``generator`` is left as it is."""
    measure, n = forget_measure(analyser, selection, faces, labels, centroids, evaluation_cfg, tau, seed)
    images = sorted(selection["forget_train_images"])[:cfg["images"]]
    generator.unet.eval()
    initial = measure(generator)
    rows = []
    for probe, index, records in worstcase_records(generator, *image_pairs(generator, manifest, faces, images), cfg,
                                                   seed, measure, initial):
        rows += [{"probe": probe, "setting": f"seed={index},k={record['k']}", "metric": metric,
                  "value": record[metric], "ci_low": float("nan"), "ci_high": float("nan"), "n": n}
                 for record in records for metric in METRICS]
    return rows


def worstcase_cells(table: pd.DataFrame, reference: str | None) -> pd.DataFrame:
    """Every worst-case cell of every audited run but the reference (and the original model), beside the
    ``reference`` run's value in the same cell (learning rate, regime, steps, seed, identity, metric) and the excess
    run - reference (NaN where the reference has no such cell) (``CELL_COLUMNS``; ``table``: the audit table,
    ``trained_against`` marked)."""
    part = table[table["probe"].str.startswith(f"{WORSTCASE}:")]
    if part.empty:
        return pd.DataFrame(columns=CELL_COLUMNS)
    regime, lr = zip(*map(worstcase_cell, part["probe"]))
    seed, steps = zip(*(([int(kv.split("=")[1]) for kv in s.split(",")]) for s in part["setting"]))
    cells = part.assign(regime=regime, lr=lr, seed=seed, steps=steps)
    keys = ["lr", "regime", "steps", "seed", "identity", "metric"]
    base = cells.loc[cells["run"] == reference, [*keys, "value"]].rename(columns={"value": "reference"})
    out = cells[~cells["run"].isin([reference, ORIGINAL])].merge(base, on=keys, how="left")
    out["excess"] = out["value"] - out["reference"]
    if "trained_against" not in out:
        out["trained_against"] = False
    return out.sort_values(["run", "metric", "steps", "lr", "regime", "seed", "identity"])[CELL_COLUMNS].reset_index(
        drop=True)


def worstcase_summary(cells: pd.DataFrame, reference: str | None, seed: int) -> pd.DataFrame:
    """Per (run, metric, steps): the (learning rate, regime) with the largest mean excess over identities among the
    cells not trained against (seed 0, identities where the reference has the cell), that mean with its paired
    intervals and Wilcoxon p (``mean_difference``), the held-out and trained-against cells counted, and the seed
    spread: the mean over identities with more than one seed of the range (max - min) of the excess across seeds at
    that worst cell (``SUMMARY_COLUMNS``)."""
    records = []
    measured = cells.dropna(subset=["excess"])
    for (run, metric, steps), group in measured.groupby(["run", "metric", "steps"], sort=True):
        first = group[group["seed"] == 0]
        held = first[~first["trained_against"]]
        means = held.groupby(["lr", "regime"])["excess"].mean()
        record = {"run": run, "metric": metric, "steps": int(steps), "reference": reference,
                  "held_out_cells": int(len(means)),
                  "trained_against_cells": int(first.loc[first["trained_against"], ["lr", "regime"]]
                                               .drop_duplicates().shape[0])}
        if len(means):
            lr, regime = means.idxmax()  # the worst case over learning rate and regime
            worst = held[(held["lr"] == lr) & (held["regime"] == regime)].set_index("identity")["excess"]
            stats = mean_difference(worst.sort_index(), seed)
            spread = group[(group["lr"] == lr) & (group["regime"] == regime)].groupby("identity")["excess"]
            several = spread.count() > 1
            ranges = (spread.max() - spread.min())[several]
            record.update(n=stats["n"], excess=stats["mean_diff"], t_low=stats["t_low"], t_high=stats["t_high"],
                          boot_low=stats["boot_low"], boot_high=stats["boot_high"], p_wilcoxon=stats["p_wilcoxon"],
                          worst_lr=lr, worst_regime=regime, spread_identities=int(several.sum()),
                          seed_spread=float(ranges.mean()) if len(ranges) else float("nan"))
        records.append(record)
    return pd.DataFrame.from_records(records).reindex(columns=SUMMARY_COLUMNS)


def worstcase_markdown(summary: pd.DataFrame, heading: bool = True) -> str:
    """The protocol's headline (``worstcase_summary``) as markdown: a section (``heading``) or its text and table
    alone; empty without a worst-case row."""
    if summary.empty:
        return ""
    reference = next(iter(summary["reference"].dropna()), None)
    lines = [*(["", "## Worst-case relearning", ""] if heading else []),
             f"Fine-tuning on the forget-train photos at every learning rate and regime, the same seeds in every run; "
             f"excess: the run's forget measure minus `{reference}`'s in the same cell (learning rate, regime, steps, "
             "seed, identity). Worst case: the learning rate and regime with the largest mean excess over identities "
             "(seed 0) among the cells the run's method does not train against.", "",
             "| run | metric | steps | worst lr, regime | excess (95% t interval) | Wilcoxon p | identities | "
             "held-out / trained-against cells | seed spread (identities) |", "|---" * 9 + "|"]
    for row in summary.itertuples(index=False):
        if pd.isna(row.excess):
            worst, excess, p = "none held out", "n/a", "n/a"
        else:
            worst = f"{row.worst_lr:g}, {row.worst_regime}"
            excess, p = f"{row.excess:.3f} ({row.t_low:.3f} to {row.t_high:.3f})", f"{row.p_wilcoxon:.3g}"
        spread = "n/a" if pd.isna(row.seed_spread) else f"{row.seed_spread:.3f} ({int(row.spread_identities)})"
        n = "0" if pd.isna(row.n) else str(int(row.n))
        lines.append(f"| {row.run} | {row.metric} | {row.steps} | {worst} | {excess} | {p} | {n} | "
                     f"{row.held_out_cells} / {row.trained_against_cells} | {spread} |")
    return "\n".join(lines) + "\n"
