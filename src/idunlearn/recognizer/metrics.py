"""Metrics of the recognizer track (GSUO Section 5.1), the tidy tables and the paper-style tables and plot.

Accuracies are fractions in [0, 1] in the tidy tables and percentages in the paper-style tables (GSUO Tables 1-2).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..evaluation.aggregate import mean_ci, summarise

ACCURACY_COLUMNS = ["acc_retain", "acc_retain_test", "acc_forget", "acc_forget_test", "acc_test"]
ULIRA_COLUMNS = ["ulira_auc", "ulira_acc"]  # from the U-LiRA stage (recognizer.ulira), random-subset only
VALUE_COLUMNS = [*ACCURACY_COLUMNS, "diff", "f_acc", "mia_auc", "mia_auc_loss", "svm_asr", *ULIRA_COLUMNS]
COST_COLUMNS = ["time_s", "wall_s", "speedup"]
METHOD_ORDER = ["original", "retrain", "ft", "ga", "rl", "rl_with_retain", "iu", "eu_k", "cf_k", "l1_sparse", "salun",
                "bad_t", "scrub", "b_shrink", "b_expand", "unsir", "rl_eupmu", "gsuo"]
METHOD_LABELS = {"original": "Original", "retrain": "Retrain", "ft": "FT", "ga": "GA", "rl": "RL",
                 "rl_with_retain": "RL+D_r", "iu": "IU", "eu_k": "EU-k", "cf_k": "CF-k", "l1_sparse": "l1-sparse",
                 "salun": "SalUn", "bad_t": "Bad-T", "scrub": "SCRUB", "b_shrink": "B-Shrink", "b_expand": "B-Expand",
                 "unsir": "UNSIR", "rl_eupmu": "RL+EUPMU", "gsuo": "GSUO"}
SETTINGS = ("paper", "tuned")  # the configured setting and the tuning protocol's choice (recognizer.tuning)


def abs_diff(acc_forget: float, acc_test: float) -> float:
    """GSUO Section 5.1: |Diff| = |Acc(D_f) - Acc(D_t)|."""
    return abs(acc_forget - acc_test)


def acc_index(acc_forget: float, acc_test: float) -> float:
    """GSUO Section 5.1 (Acc-index): F_acc(D_t, D_f) = Acc(D_t) - |Diff|."""
    return acc_test - abs_diff(acc_forget, acc_test)


def speedup(retrain_seconds: float, method_seconds: float) -> float:
    """GSUO Section 5.1: Speedup = time of Retrain / time of the method (NaN for a zero-time row such as Original)."""
    return retrain_seconds / method_seconds if method_seconds > 0 else float("nan")


def add_speedup(rows: pd.DataFrame) -> pd.DataFrame:
    """Speedup of every row against the Retrain row of the same experiment."""
    out = rows.copy()
    keys = ["task", "dataset", "experiment"]
    retrain = out[out["method"] == "retrain"].set_index(keys)["time_s"]
    ref = out.set_index(keys).index.map(lambda k: retrain.get(k, np.nan))
    out["speedup"] = [speedup(r, t) for r, t in zip(ref, out["time_s"])]
    out.loc[out["method"] == "original", "speedup"] = np.nan  # nothing was unlearned
    return out


def method_order(methods) -> list[str]:
    known = [m for m in METHOD_ORDER if m in set(methods)]
    return known + sorted(set(methods) - set(known))


def variants(group: pd.DataFrame) -> list[tuple[str, str, str, pd.DataFrame]]:
    """(method, setting, label, rows) per method and setting present, in method order, paper setting first; tuned
    rows are labelled 'X (tuned)'."""
    out = []
    for m in method_order(group["method"].unique()):
        for setting in SETTINGS:
            g = group[(group["method"] == m) & (group["setting"] == setting)]
            if len(g):
                label = METHOD_LABELS.get(m, m) + (" (tuned)" if setting == "tuned" else "")
                out.append((m, setting, label, g))
    return out


def summary_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean, 95% Student-t half width and count per (task, dataset, method, setting), over experiments (seeds or
    identities)."""
    return summarise(rows, ["task", "dataset", "method", "setting"], [*VALUE_COLUMNS, *COST_COLUMNS])


def _cell(values, percent: bool, digits: int) -> str:
    mean, half = mean_ci(values)
    if np.isnan(mean):
        return "-"
    scale = 100.0 if percent else 1.0
    text = f"{mean * scale:.{digits}f}"
    return text + (f" ± {half * scale:.{digits}f}" if not np.isnan(half) else "")


RANDOM_SUBSET_ROWS = [("Acc(D_r) %", "acc_retain", True, 2), ("Acc(D_t) %", "acc_test", True, 2),
                      ("Acc(D_f) %", "acc_forget", True, 2), ("|Diff| %", "diff", True, 2),
                      ("F_acc %", "f_acc", True, 2), ("MIA AUC (LiRA)", "mia_auc", False, 3),
                      ("MIA AUC (loss)", "mia_auc_loss", False, 3), ("MIA AUC (U-LiRA)", "ulira_auc", False, 3),
                      ("MIA acc (U-LiRA)", "ulira_acc", False, 3), ("MIA ASR (SVM, loss)", "svm_asr", False, 3),
                      ("Time (CPU s)", "time_s", False, 2), ("Speedup", "speedup", False, 1)]
CLASSWISE_ROWS = [("Acc(D_r) %", "acc_retain", True, 2), ("Acc(D_rt) %", "acc_retain_test", True, 2),
                  ("Acc(D_f) %", "acc_forget", True, 2), ("Acc(D_ft) %", "acc_forget_test", True, 2),
                  ("MIA AUC (LiRA)", "mia_auc", False, 3), ("MIA ASR (SVM, loss)", "svm_asr", False, 3),
                  ("Time (CPU s)", "time_s", False, 2), ("Speedup", "speedup", False, 1)]


def random_subset_table(rows: pd.DataFrame) -> pd.DataFrame:
    """GSUO Table 1 layout: one block per dataset, metrics as rows, methods (paper setting, then tuned) as columns,
    'mean ± 95% half width' over the seeds; a metric no row of the dataset has (U-LiRA not run) is left out."""
    rows = rows[rows["task"] == "random_subset"]
    blocks = []
    for dataset, group in rows.groupby("dataset", sort=True):
        columns = variants(group)
        for label, col, pct, digits in RANDOM_SUBSET_ROWS:
            if col not in group or group[col].isna().all():
                continue
            record = {"dataset": dataset, "metric": label, "n": group["experiment"].nunique()}
            for m, _, name, g in columns:
                no_cost = m == "original" and col in COST_COLUMNS
                record[name] = "-" if no_cost else _cell(g[col], pct, digits)
            blocks.append(record)
    return pd.DataFrame(blocks)


def classwise_table(rows: pd.DataFrame) -> pd.DataFrame:
    """GSUO Table 2 layout: methods (paper setting, then tuned) as rows, metrics as columns, 'mean ± 95% half width'
    over forget identities."""
    rows = rows[rows["task"] == "classwise"]
    records = []
    for dataset, group in rows.groupby("dataset", sort=True):
        for m, _, name, g in variants(group):
            record = {"dataset": dataset, "method": name, "n": len(g)}
            for label, col, pct, digits in CLASSWISE_ROWS:
                record[label] = "-" if m == "original" and col in COST_COLUMNS else _cell(g[col], pct, digits)
            records.append(record)
    return pd.DataFrame(records)


def markdown(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (no extra dependency)."""
    cols = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def plot_speedup_vs_facc(rows: pd.DataFrame, path) -> None:
    """GSUO Fig. 2 (a)-(b): speedup w.r.t. Retrain (log scale) against F_acc, one panel per random-subset dataset,
    mean over seeds with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io import save_figure

    rows = rows[(rows["task"] == "random_subset") & ~rows["method"].isin(["original", "retrain"])]
    datasets = sorted(rows["dataset"].unique())
    fig, axes = plt.subplots(1, max(len(datasets), 1), figsize=(5.5 * max(len(datasets), 1), 4.2), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        group = rows[rows["dataset"] == dataset]
        for m, setting, name, g in variants(group):
            (fx, fh), (sx, sh) = mean_ci(g["f_acc"] * 100), mean_ci(g["speedup"])
            ax.errorbar(sx, fx, xerr=None if np.isnan(sh) else sh, yerr=None if np.isnan(fh) else fh,
                        fmt="o" if setting == "paper" else "s", capsize=3, label=name,
                        markersize=8 if m == "gsuo" else 5)
            ax.annotate(name, (sx, fx), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("speedup w.r.t. Retrain")
        ax.set_ylabel("F_acc = Acc(D_t) - |Diff| (%)")
        ax.set_title(f"random-subset forgetting, {dataset} (mean, 95% CI over seeds)", fontsize=9)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
