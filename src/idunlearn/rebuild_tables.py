"""The rebuild's compute-robustness curve and its evaluation targets, from the rebuild jobs' ledgers and the
evaluation's per-identity metrics (the rebuilt generators are evaluated as external models, like `retrain`).

Targets on the evaluation (rebuild issue, paired by forget identity over the study's identities, Holm-corrected
within each rebuilt model's family): forget ISM <= retrain's + 0.05; retain ISM >= 0.95 x PIU's; KD of the retain
samples to the real images <= 1.10 x retrain's. With the worst-case relearning protocol's rows
(audit.probes.relearning_worstcase), also its targets: the forget-ISM excess over retrain at the worst held-out
learning rate and regime <= 0.15 at 50 steps and <= 0.20 at 200 steps, in the same Holm family. The embedding
attack's target comes from the audit's tables.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .audit.relearning_worstcase import worstcase_summary
from .evaluation.statistics import holm, mean_difference, paired_differences

CURVE_COLUMNS = ["model", "run", "budget_percent", "alpha", "fraction_of_retrain", "units", "passes_train",
                 "passes_forward", "passes_search", "seconds_cpu", "seconds_cpu_per_person", "identities",
                 "forget_ism", "retain_ism", "kd_retain", "forget_ism_retrain", "retain_ism_piu", "kd_retain_retrain"]
TARGET_COLUMNS = ["model", "target", "n", "mean_diff", "t_low", "t_high", "p_wilcoxon", "p_holm", "met", "margin"]
# (target, the metric, the comparison run, how the bar is set: difference to beat, or ratio) -- each is one-sided:
# the model's value minus the bar must be <= 0 (forget ISM, KD) or >= 0 (retain ISM)
TARGETS = [("forget ISM <= retrain + 0.05", "ism_forget", "retrain", ("add", 0.05), -1),
           ("retain ISM >= 0.95 x PIU", "ism_retain", "piu", ("times", 0.95), +1),
           ("retain KD <= 1.10 x retrain", "kd_retain", "retrain", ("times", 1.10), -1)]
# rebuild issue: worst-case relearning, steps -> the most forget-ISM excess over retrain allowed (measured in ISM, as
# the audit's relearning recovery is)
WORSTCASE_TARGETS = {50: 0.15, 200: 0.20}


def metrics_table(paths: dict[str, list[str]]) -> pd.DataFrame:
    """model -> its per-identity metrics.json files, as one table (model, identity, metrics...)."""
    rows = []
    for model, files in paths.items():
        for path in files:
            metrics = pd.read_json(path, typ="series")
            rows.append({"model": model, "identity": int(metrics["forget_identity"]),
                         **{k: metrics.get(k, np.nan) for k in ("ism_forget", "ism_retain", "kd_retain")}})
    return pd.DataFrame(rows)


def worstcase_target_rows(model: str, cells: pd.DataFrame, seed: int) -> list[dict]:
    """The worst-case relearning targets of ``model`` (``WORSTCASE_TARGETS``; ``cells``: ``worstcase_cells`` against
    `retrain`): at each step count, the held-out (learning rate, regime) with the largest mean forget-ISM excess
    (``worstcase_summary``, seed 0), and per identity that cell's excess minus the bar; n 0 and not met where the
    model has no such cell."""
    mine = cells[(cells["run"] == model) & (cells["metric"] == "ism")]
    summary = worstcase_summary(mine, "retrain", seed).set_index("steps") if len(mine) else None
    rows = []
    for steps, bar in WORSTCASE_TARGETS.items():
        name = f"worst-case relearning ISM excess at {steps} steps <= {bar}"
        worst = summary.loc[steps] if summary is not None and steps in summary.index else None
        if worst is None or pd.isna(worst["excess"]):
            rows.append({"model": model, "target": name, "n": 0, "mean_diff": np.nan, "t_low": np.nan,
                         "t_high": np.nan, "p_wilcoxon": np.nan, "met": False, "margin": np.nan})
            continue
        cell = mine[(mine["steps"] == steps) & (mine["seed"] == 0) & ~mine["trained_against"]
                    & (mine["lr"] == worst["worst_lr"]) & (mine["regime"] == worst["worst_regime"])]
        # excess - bar per identity at the worst cell: one-sided, met below 0 (the rebuild issue's relearning target)
        stats = mean_difference(cell.dropna(subset=["excess"]).set_index("identity")["excess"].sort_index() - bar,
                                seed, direction=-1)
        rows.append({"model": model, "target": name, **{k: stats[k] for k in ("n", "mean_diff", "t_low", "t_high",
                                                                                  "p_wilcoxon")},
                     "met": bool(stats["t_high"] <= 0), "margin": float(stats["mean_diff"])})
    return rows


def target_rows(model: str, metrics: pd.DataFrame, piu: str, seed: int, cells: pd.DataFrame | None = None
                ) -> list[dict]:
    """The evaluation targets of ``model`` against `retrain` and ``piu`` (the compare_to run), paired by identity:
    the mean of (model - bar) per identity with its t-interval and the one-sided Wilcoxon p of the target being met
    (Holm over the model's targets); met when the whole 95% interval lies on the target's side and the Holm-corrected
    p is below 0.05 (the interval alone is uncorrected for the family). With the worst-case protocol's ``cells``
    (``worstcase_cells``), its targets too (``worstcase_target_rows``)."""
    by = {name: part.set_index("identity") for name, part in metrics.groupby("model")}
    rows = []
    for name, metric, against, (kind, value), side in TARGETS:
        reference = by["retrain" if against == "retrain" else piu][metric]
        bar = reference + value if kind == "add" else reference * value
        # one-sided paired difference model - bar (Student t interval over identities; Wilcoxon 1945 signed rank)
        diff = paired_differences(bar, by[model][metric])
        stats = mean_difference(diff, seed, direction=side)
        met = bool(stats["t_high"] <= 0) if side < 0 else bool(stats["t_low"] >= 0)
        rows.append({"model": model, "target": name, **{k: stats[k] for k in ("n", "mean_diff", "t_low", "t_high",
                                                                                  "p_wilcoxon")},
                     "met": met, "margin": float(stats["mean_diff"])})
    if cells is not None:
        rows += worstcase_target_rows(model, cells, seed)
    for row, p in zip(rows, holm([r["p_wilcoxon"] for r in rows])):
        row["p_holm"] = float(p)
        row["met"] = bool(row["met"] and p < 0.05)  # NaN (an untested target) compares False
    return rows


def rebuild_tables(ledgers: dict[str, dict], metrics: pd.DataFrame, piu: str, seed: int,
                   cells: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the curve: one row per rebuilt model with its compute and mean evaluation metrics, `retrain`'s and PIU's
    beside; the targets per rebuilt model). ``ledgers``: model -> its ledger.json; ``metrics``: ``metrics_table`` of
    the rebuilt models, `retrain` and ``piu``; ``cells``: the worst-case protocol's (``worstcase_cells``), or None
    when it did not run."""
    means = metrics.groupby("model")[["ism_forget", "ism_retain", "kd_retain"]].mean()
    curve, targets = [], []
    for model, ledger in ledgers.items():
        evaluated = model in means.index
        curve.append({
            "model": model, "run": model.rsplit(".b", 1)[0], "budget_percent": ledger["budget_percent"],
            "alpha": ledger["alpha"], "fraction_of_retrain": ledger["fraction_of_retrain"], "units": ledger["units"],
            "passes_train": ledger["passes"]["train"], "passes_forward": ledger["passes"]["forward"],
            "passes_search": ledger["passes"]["search"], "seconds_cpu": ledger["seconds_cpu"],
            "seconds_cpu_per_person": ledger["seconds_cpu_per_person"], "identities": ledger["identities"],
            "forget_ism": means.loc[model, "ism_forget"] if evaluated else np.nan,
            "retain_ism": means.loc[model, "ism_retain"] if evaluated else np.nan,
            "kd_retain": means.loc[model, "kd_retain"] if evaluated else np.nan,
            "forget_ism_retrain": means.loc["retrain", "ism_forget"],
            "retain_ism_piu": means.loc[piu, "ism_retain"], "kd_retain_retrain": means.loc["retrain", "kd_retain"]})
        if evaluated:
            targets += target_rows(model, metrics, piu, seed, cells)
    return (pd.DataFrame(curve, columns=CURVE_COLUMNS).sort_values(["run", "budget_percent"]),
            pd.DataFrame(targets, columns=TARGET_COLUMNS))
