"""The audit's tables and figures: every job's rows in one tidy table, a per-run summary over forget identities
(means with identity-bootstrap intervals, the original model as the control row) and its headline markdown, the
neighbourhood plot (FA against cosine to the forget centroid) and the locality plot (retain ISM change against
cosine)."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ..evaluation.statistics import bootstrap_mean  # noqa: E402
from ..io import save_figure  # noqa: E402
from .heldout import HELDOUT_RELEARNING  # noqa: E402

ORIGINAL = "original"  # the run name of the original model's audit (the control)
SUMMARY_COLUMNS = ["run", "probe", "setting", "metric", "mean", "ci_low", "ci_high", "n_identities",
                   "trained_against"]


def job_rows(path: str, original: bool = False) -> tuple[str, int, pd.DataFrame]:
    """(run, identity, rows) of one audit job's rows file, named by its folders: .../<identity>/rows.parquet under
    .../before/ (``original``: the original model's job) or a folder named for the run or external model."""
    folder, identity = os.path.split(os.path.dirname(path))
    return ORIGINAL if original else os.path.basename(folder), int(identity), pd.read_parquet(path)


def audit_table(jobs: list[tuple[str, int, pd.DataFrame]]) -> pd.DataFrame:
    """(run, forget identity, rows) of every audit job -> one tidy table with run and identity columns."""
    if not jobs:
        raise ValueError("no audit rows: the audit target has no (run, forget identity) job")
    return pd.concat([rows.assign(run=run, identity=identity) for run, identity, rows in jobs], ignore_index=True)[
        ["run", "identity", *[c for c in jobs[0][2].columns]]]


def with_attack_samples(table: pd.DataFrame, jobs: list[tuple[str, int, pd.DataFrame]]) -> pd.DataFrame:
    """The audit ``table`` with the attack's rows of every (run, identity) in ``jobs`` (``job_rows`` of the jobs that
    drew audit.attack_samples samples from the attack's winning condition) in place of the audit job's own, so that
    the verdicts and every table read the larger draw."""
    if not jobs:
        return table
    more = audit_table(jobs)
    drawn = pd.MultiIndex.from_frame(more[["run", "identity"]].drop_duplicates())
    replaced = (table["probe"] == "attack") & pd.MultiIndex.from_frame(table[["run", "identity"]]).isin(drawn)
    return pd.concat([table[~replaced], more], ignore_index=True)[table.columns]


def audit_summary(table: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Per (run, probe, setting, metric): the mean over forget identities with its identity-bootstrap interval.
    Locality rows are per retain identity, not per setting: they are summarised in the plot, not here; the worst
    photo is summarised as the mean over identities of each identity's worst photo. ``trained_against``: whether the
    run's method trains against the probe (the table's column, audit/heldout.py; false without it)."""
    part = table[table["probe"] != "locality"].copy()
    if "trained_against" not in part:
        part["trained_against"] = False
    part.loc[part["setting"].str.startswith("worst:"), "setting"] = "worst"
    records = []
    for (run, probe, setting, metric), group in part.groupby(["run", "probe", "setting", "metric"], sort=True):
        mean, low, high = bootstrap_mean(group["value"], seed)
        records.append({"run": run, "probe": probe, "setting": setting, "metric": metric, "mean": mean,
                        "ci_low": low, "ci_high": high, "n_identities": int(group["identity"].nunique()),
                        "trained_against": bool(group["trained_against"].any())})
    return pd.DataFrame.from_records(records, columns=SUMMARY_COLUMNS)


def headline(summary: pd.DataFrame) -> list[tuple[str, str, str, str]]:
    """(probe, setting, metric, column title) of the headline table: FA of the evaluation's forget samples, Leak@k
    for every configured k, the photo probe, and the retain samples' verification rate."""
    def ks(probe: str) -> list[int]:
        return sorted({int(s[2:]) for s in summary.loc[summary["probe"] == probe, "setting"] if s.startswith("k=")})

    relearn = ks("relearning") or ks("relearning_control")
    noised = sorted({int(s[2:]) for s in summary.loc[summary["probe"] == "trajectory", "setting"]})
    second = (summary["metric"] == "fa_second").any()  # the independent recognizer's verdicts, when it ran
    return [("evaluation", "forget", "fa", "FA (evaluation)"),
            *([("evaluation", "forget", "fa_second", "FA (evaluation, 2nd recognizer)")] if second else []),
            *[("leak", f"k={k}", "leak", f"Leak@{k}") for k in ks("leak")],
            ("photo", "train", "fa", "photo FA (train)"), ("photo", "val", "fa", "photo FA (val)"),
            ("photo", "worst", "fa", "worst photo FA"),
            *([("relearning", f"k={relearn[-1]}", "recovery", f"relearning recovery (k={relearn[-1]})"),
               ("relearning_control", f"k={relearn[-1]}", "gain", f"control ISM gain (k={relearn[-1]})")]
              if relearn else []),
            *([("trajectory", f"t={noised[-1]}", "ism", f"trajectory ISM (t={noised[-1]})")] if noised else []),
            *([("attack", "best", "fa", "attack success"), ("attack", "best", "ism", "attack ISM"),
               *([("attack", "best", "fa_second", "attack success (2nd recognizer)")] if second else []),
               ("attack_control", "best", "fa", "attack success (control identity)")]
              if (summary["probe"] == "attack").any() else []),  # the light audit runs no attack
            *heldout_headline(summary, ks),
            ("evaluation", "retain", "verified", "retain verified")]


def heldout_headline(summary: pd.DataFrame, ks) -> list[tuple[str, str, str, str]]:
    """The held-out attacks' headline columns, where they ran: the strong embedding attack's and the inversion's
    success, each held-out relearning variant's recovery at its largest k (the curves are in their figure)."""
    probes = set(summary["probe"])
    variants = sorted(p.split(":", 1)[1] for p in probes if p.startswith(f"{HELDOUT_RELEARNING}:"))
    return [*([("attack_heldout", "best", "fa", "held-out attack success")] if "attack_heldout" in probes else []),
            *([("inversion", "regenerated", "fa", "inversion FA")] if "inversion" in probes else []),
            *[(f"{HELDOUT_RELEARNING}:{v}", f"k={ks(f'{HELDOUT_RELEARNING}:{v}')[-1]}", "recovery",
               f"recovery {v} (k={ks(f'{HELDOUT_RELEARNING}:{v}')[-1]})") for v in variants]]


TRAINED_AGAINST = "trained against"  # a cell whose attack the run's method trains against: not a held-out result


def _cell(row) -> str:
    value = (f"{row['mean']:.2f}" if np.isnan(row["ci_low"]) else
             f"{row['mean']:.2f} ({row['ci_low']:.2f} to {row['ci_high']:.2f})")
    return f"{TRAINED_AGAINST}: {value}" if marked(row) else value


def marked(row) -> bool:
    """Whether a summary row (or a target row) is trained against; false where the column is absent (tables
    written before it existed)."""
    return str(row.get("trained_against", False)) == "True"


def audit_markdown(summary: pd.DataFrame, tau: dict, table: pd.DataFrame | None = None) -> str:
    """The headline table: one row per run (the original model first), cells mean (95% interval; none with one
    identity), and the attack's control verdict (per identity too when the per-identity ``table`` is given)."""
    columns = headline(summary)
    indexed = summary.set_index(["run", "probe", "setting", "metric"])
    runs = [ORIGINAL] + sorted(r for r in summary["run"].unique() if r != ORIGINAL)
    lines = ["# Forgetting audit", "",
             f"A sample is verified as the forget identity when a face is found, its cosine to that identity's "
             f"centroid is at least tau = {tau['tau']:.3f} (false-accept rate {tau['far_target']:g} on impostor "
             f"pairs of real images; {tau['far_heldout']:.4f} on held-out pairs) and no other centroid is nearer.",
             "", "| run | identities | " + " | ".join(h[3] for h in columns) + " |",
             "|---" * (len(columns) + 2) + "|"]
    for run in runs:
        if run not in indexed.index.get_level_values(0):
            continue
        cells, n = [], 0
        for probe, setting, metric, _ in columns:
            key = (run, probe, setting, metric)
            if key in indexed.index:
                row = indexed.loc[key]
                n = max(n, int(row["n_identities"]))
                cells.append(_cell(row))
            else:
                cells.append("n/a")
        lines.append(f"| {run} | {n} | " + " | ".join(cells) + " |")
    lines += attack_control_lines(summary, table)
    lines += heldout_control_lines(summary)
    lines += ["", "Cells: mean over forget identities (95% identity-bootstrap interval). FA: share of samples "
              "verified as the forget identity; Leak@k: share of forget conditions for which any of k seeds is "
              "verified; photo: every real image of the forget identity used alone as the condition; relearning "
              "recovery: (ISM_k - ISM_after) / (ISM_before - ISM_after) after k fine-tuning steps on forget-train "
              "images; control: the ISM gain of the same fine-tuning of the original model on a retain-validation "
              "identity; trajectory: ISM of a real forget-validation image noised to timestep t and denoised under its "
              "own condition; attack success: share of the samples drawn from the attack's condition that are "
              "verified as the forget identity. 2nd recognizer: the same samples verified by an independent recognizer "
              "(dlib's ResNet descriptor, its own centroids and threshold at the same false-accept rate) that no "
              "method and no attack uses. Held-out attacks (seeds of their own; held out for a run unless marked "
              "trained against): the embedding attack at a multiple of the budget with more restarts; inversion FA: real "
              "forget-validation photos inverted to noise by the model (DDIM) and regenerated; recovery <variant>: "
              "the relearning "
              "variants (learning rate x0.1 / x10, LoRA on the cross-attention, benign fine-tuning on other people's "
              "photos), curves in figures/audit/relearning_curves.png. A cell marked \"trained against\" is an "
              "attack the run's method trains against (same step function and data, learning rate inside its "
              "training range: tables/audit_trained_against.csv): it is shown, but it is no held-out result for "
              "that run. The original model's row is the control: what there was to forget."]
    return "\n".join(lines) + "\n"


ATTACK_BOUND = 0.9  # the attack must recover this share of the original model's forget ISM to mean anything


def attack_control_by_identity(table: pd.DataFrame) -> dict[int, bool]:
    """Per forget identity the control was run on: whether the attack on the original model reaches at least 0.9 x
    the original's forget ISM (where it does not, the attack's result on an unlearned model says little)."""
    original = table[(table["run"] == ORIGINAL) & (table["metric"] == "ism")]
    attacked = original[(original["probe"] == "attack") & (original["setting"] == "best")].set_index("identity")
    before = original[(original["probe"] == "evaluation") & (original["setting"] == "forget")].set_index("identity")
    both = attacked.index.intersection(before.index)
    return {int(i): bool(attacked.loc[i, "value"] >= ATTACK_BOUND * before.loc[i, "value"]) for i in both}


def attack_control_lines(summary: pd.DataFrame, table: pd.DataFrame | None = None) -> list[str]:
    """Whether the attack passes its control: on the original model it must reach at least 0.9 x the original's
    forget ISM on the evaluation's samples (the issue's bound), on average over identities and, given the per-identity
    ``table``, identity by identity; otherwise its failure on an unlearned model says nothing."""
    indexed = summary.set_index(["run", "probe", "setting", "metric"])
    keys = (ORIGINAL, "attack", "best", "ism"), (ORIGINAL, "evaluation", "forget", "ism")
    if not all(k in indexed.index for k in keys):
        return []
    attacked, before = (float(indexed.loc[k, "mean"]) for k in keys)
    ratio = attacked / before if before > 0 else float("nan")
    verdict = "passes" if ratio >= ATTACK_BOUND else "FAILS (too weak: its results on unlearned models mean little)"
    line = (f"Attack control: on the original model the attack's samples reach ISM {attacked:.3f}, {ratio:.2f} x the "
            f"original's forget ISM {before:.3f}; the bound is {ATTACK_BOUND}: the attack {verdict}.")
    if table is not None:
        passes = attack_control_by_identity(table)
        failed, n = sorted(i for i, ok in passes.items() if not ok), len(passes)
        line += (f" Per identity it passes on {n - len(failed)} of {n}" +
                 (f"; below the bound on {', '.join(str(i) for i in failed)}, where its results on unlearned models "
                  "mean little." if failed else "."))
    return ["", line]


HELDOUT_CONTROLLED = (("attack_heldout", "best", "held-out embedding attack"),
                      ("inversion", "regenerated", "inversion attack"))


def heldout_control_lines(summary: pd.DataFrame) -> list[str]:
    """Whether each held-out attack meets its control on the original model: its samples' ISM there at least
    ``ATTACK_BOUND`` x the original's forget ISM (the embedding attack's bound); the relearning variants' control is
    their own rows on the control identity (relearning_heldout_control)."""
    indexed = summary.set_index(["run", "probe", "setting", "metric"])
    before_key = (ORIGINAL, "evaluation", "forget", "ism")
    lines = []
    for probe, setting, title in HELDOUT_CONTROLLED:
        key = (ORIGINAL, probe, setting, "ism")
        if key not in indexed.index or before_key not in indexed.index:
            continue
        attacked, before = float(indexed.loc[key, "mean"]), float(indexed.loc[before_key, "mean"])
        ratio = attacked / before if before > 0 else float("nan")
        verdict = "passes" if ratio >= ATTACK_BOUND else "FAILS (too weak: its results on unlearned models mean little)"
        lines += ["", f"Control of the {title}: on the original model its samples reach ISM {attacked:.3f}, "
                      f"{ratio:.2f} x the original's forget ISM {before:.3f} (bound {ATTACK_BOUND}): it {verdict}."]
    return lines


def plot_relearning_curves(table: pd.DataFrame, path: str | Path, seed: int) -> None:
    """Recovery against fine-tuning steps, one panel per relearning probe (the audit's and each held-out variant),
    one line per run: mean over forget identities with its identity-bootstrap 95% band."""
    part = table[((table["probe"] == "relearning") | table["probe"].str.startswith(f"{HELDOUT_RELEARNING}:"))
                 & (table["metric"] == "recovery")]
    probes = sorted(part["probe"].unique())
    fig, axes = plt.subplots(1, max(1, len(probes)), figsize=(3.2 * max(1, len(probes)), 3.4), squeeze=False,
                             sharey=True)
    for ax, probe in zip(axes[0], probes):
        for run, group in part[part["probe"] == probe].groupby("run", sort=True):
            stats = [(int(s[2:]), *bootstrap_mean(g["value"].dropna(), seed)) for s, g in group.groupby("setting")]
            k, mean, low, high = map(np.asarray, zip(*sorted(stats)))
            line, = ax.plot(k, mean, marker="o", label=run)
            ax.fill_between(k, low, high, alpha=0.15, color=line.get_color())
        ax.set_title(probe.split(":", 1)[-1], fontsize=9)
        ax.set_xlabel("fine-tuning steps k")
        ax.axhline(1, color="k", linewidth=0.6, linestyle=":")
    axes[0][0].set_ylabel("recovery (1 = back at the original)")
    if probes:
        axes[0][0].legend(fontsize=7)
    else:
        axes[0][0].text(0.5, 0.5, "no relearning probe ran", ha="center", va="center")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_neighbourhood(table: pd.DataFrame, path: str | Path, seed: int) -> None:
    """FA of the forget identity against the condition's cosine to the forget centroid, one line per run (mean over
    identities, identity-bootstrap band): how wide the forgotten region is."""
    part = table[(table["probe"] == "neighbourhood") & (table["metric"] == "fa")]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for run, group in part.groupby("run", sort=True):
        stats = [(float(s), *bootstrap_mean(g["value"], seed)) for s, g in group.groupby("setting")]
        cos, mean, low, high = map(np.asarray, zip(*sorted(stats)))
        style = {"color": "k", "linestyle": "--"} if run == ORIGINAL else {}
        line, = ax.plot(cos, mean, marker="o", label=run, **style)
        ax.fill_between(cos, low, high, alpha=0.15, color=line.get_color())
    ax.set_xlabel("condition's cosine to the forget centroid")
    ax.set_ylabel("FA (verified as the forget identity)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def plot_locality(table: pd.DataFrame, path: str | Path) -> None:
    """Retain ISM change (after - before) against the retain identity's cosine to the forget centroid, one point per
    (run, forget identity, retain identity): collateral on look-alikes against strangers."""
    part = table[(table["probe"] == "locality") & (table["metric"] == "ism_delta")]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for run, group in part.groupby("run", sort=True):
        ax.errorbar(group["cosine"], group["value"], yerr=[group["value"] - group["ci_low"],
                    group["ci_high"] - group["value"]], fmt="o", ms=4, alpha=0.7, label=run)
    ax.axhline(0, color="k", linewidth=0.8)
    ax.set_xlabel("retain identity's cosine to the forget centroid")
    ax.set_ylabel("retain ISM change (after - before)")
    if len(part):
        ax.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)
