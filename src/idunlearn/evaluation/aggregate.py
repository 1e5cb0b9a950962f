"""Aggregation of per-run metrics: means with Student-t confidence intervals (the wide summary), before/after
columns, the tidy per-run summary with the pooled SRK and identity-bootstrap intervals, its headline table, and runs
paired by forget identity on their evaluation (``paired_runs``).

NaN handling: a NaN value means "not measured" and is left out, so each statistic is over the non-NaN values only
(``summarise`` reports that count as ``<col>_n`` beside the group's row count ``n``). No values left gives a NaN
mean; fewer than two gives a NaN half width."""

from __future__ import annotations

import json
import re
from typing import Iterable, Mapping

import pandas as pd

from .statistics import (COUNT_COLUMNS, bootstrap_mean, bootstrap_pooled, holm, mean_ci, paired_with,
                         pooled_difference, pooled_srk)


def summarise(metrics: pd.DataFrame, group_cols: list[str], value_cols: list[str]) -> pd.DataFrame:
    """One row per group (sorted by ``group_cols``): ``n`` rows, then per value column ``<col>_mean``,
    ``<col>_ci95`` (95 % half width) and ``<col>_n`` (its non-NaN count). Empty ``group_cols``: one overall row."""
    groups = metrics.groupby(group_cols, sort=True, dropna=False) if group_cols else [((), metrics)]
    records = []
    for key, group in groups:
        record = dict(zip(group_cols, key if isinstance(key, tuple) else (key,)))
        record["n"] = len(group)
        for col in value_cols:
            record[f"{col}_mean"], record[f"{col}_ci95"] = mean_ci(group[col], 0.95)
            record[f"{col}_n"] = int(group[col].notna().sum())
        records.append(record)
    columns = [*group_cols, "n", *(f"{col}_{stat}" for col in value_cols for stat in ("mean", "ci95", "n"))]
    return pd.DataFrame.from_records(records, columns=columns)


def before_after(before: Mapping, after: Mapping, keys: Iterable[str]) -> dict:
    """One run's row: ``<key>_before``, ``<key>_after`` and ``<key>_delta`` for each metric key."""
    row = {}
    for key in keys:
        row[f"{key}_before"] = before[key]
        row[f"{key}_after"] = after[key]
        # Delta = after - before (PIU reports Delta KD this way, section 4)
        row[f"{key}_delta"] = after[key] - before[key]
    return row


def metrics_row(run: str, run_settings: dict, selection_row: dict, before: Mapping, after: Mapping,
                keys: Iterable[str]) -> dict:
    """One row of the metrics table: the run, its settings and configuration hash, the experiment, and the metrics
    before and after unlearning. Costs (timings) live in their own table, so that metrics are reproducible."""
    from ..config import config_hash

    settings = {f"hp_{k}": (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in sorted(run_settings.items())}
    return {"run": run, "config_hash": config_hash(run_settings), **selection_row, **settings,
            **before_after(before, after, keys)}


# ----- tidy per-run summary and its headline ---------------------------------------------------------------------

PHASES = ("before", "after", "delta")
HEADLINE = {"ism_forget": "forget ISM", "ism_retain": "retain ISM", "srk": "SRK (pooled)",
            "detection_rate_forget": "detection forget", "detection_rate_retain": "detection retain",
            "kd_forget": "KD forget", "kd_retain": "KD retain", "quality_forget": "quality forget",
            "quality_retain": "quality retain"}
SUMMARY_NOTE = ("Cells: value (95% interval) over the run's forget identities; SRK is pooled over all samples of all "
                "forget identities (PIU eqs. 8-10), every other metric is a mean over identities; the intervals are "
                "percentile bootstraps over identities. Per-identity SRK is the separate metric srk_identity.")


def identity_counts(counts: pd.DataFrame, run: str | None, phase: str) -> pd.DataFrame:
    """One run's and phase's ``sample_counts`` per forget identity (index), from the counts table; ``run`` None:
    one row per identity from any run (the before phase is the same original model for every run)."""
    part = counts[counts["phase"] == phase]
    part = part.drop_duplicates("forget_identity") if run is None else part[part["run"] == run]
    return part.set_index("forget_identity")[COUNT_COLUMNS].sort_index()


def summary_long(metrics: pd.DataFrame, counts: pd.DataFrame, keys: Iterable[str], seed: int) -> pd.DataFrame:
    """Tidy summary, one row per (run, metric, phase): ``mean``, ``ci_low``, ``ci_high`` and ``n`` (identities).
    Metric ``srk`` is the pooled SRK of the run's per-sample counts with its identity-bootstrap interval (delta:
    paired over identities); every other metric is the mean over identities with its identity-bootstrap interval
    (``bootstrap_mean``: inside the values' range, so rates keep their bounds)."""
    records = []
    for run, part in metrics.groupby("run", sort=True):
        before, after = identity_counts(counts, run, "before"), identity_counts(counts, run, "after")
        pooled = {"before": (len(before), *bootstrap_pooled(before, pooled_srk, seed)),
                  "after": (len(after), *bootstrap_pooled(after, pooled_srk, seed)),
                  "delta": pooled_difference(before, after, pooled_srk, seed)}
        for phase, (n, value, low, high) in pooled.items():
            records.append({"run": run, "metric": "srk", "phase": phase, "mean": value, "ci_low": low,
                            "ci_high": high, "n": n})
        for key in keys:
            for phase in PHASES:
                column = part[f"{key}_{phase}"]
                mean, low, high = bootstrap_mean(column, seed)
                records.append({"run": run, "metric": key, "phase": phase, "mean": mean, "ci_low": low,
                                "ci_high": high, "n": int(column.notna().sum())})
    return pd.DataFrame.from_records(records, columns=["run", "metric", "phase", "mean", "ci_low", "ci_high", "n"])


def _cell(row) -> str:
    return f"{row['mean']:.3f} ({row['ci_low']:.3f} to {row['ci_high']:.3f})"


def headline_table(long: pd.DataFrame) -> list[list[str]]:
    """Header and one row per (run, before/after) of the headline metrics, cells formatted by ``_cell``."""
    cells = long.set_index(["run", "phase", "metric"])
    rows = [["run", "phase", "identities", *HEADLINE.values()]]
    for run in long["run"].unique():
        for phase in ("before", "after"):
            n = int(cells.loc[(run, phase, "srk"), "n"])
            rows.append([run, phase, str(n), *(_cell(cells.loc[(run, phase, m)]) for m in HEADLINE)])
    return rows


def headline_sentences(long: pd.DataFrame, run: str, identities: Iterable[int]) -> str:
    """Two sentences on ``run``: what was forgotten, and what it cost everyone else."""
    v = long[long["run"] == run].set_index(["metric", "phase"])["mean"]
    ids = [str(i) for i in identities]
    return (f"Run {run} made the generator forget {len(ids)} identities ({', '.join(ids)}): their forget ISM went "
            f"from {v['ism_forget', 'before']:.3f} to {v['ism_forget', 'after']:.3f} and the pooled SRK from "
            f"{v['srk', 'before']:.2f} to {v['srk', 'after']:.2f}. "
            f"Everyone else paid with retain ISM going from {v['ism_retain', 'before']:.3f} to "
            f"{v['ism_retain', 'after']:.3f}, the retain detection rate from "
            f"{v['detection_rate_retain', 'before']:.3f} to {v['detection_rate_retain', 'after']:.3f}, "
            f"a retain KD change of {v['kd_retain', 'delta']:+.4f} and a retain quality change of "
            f"{v['quality_retain', 'delta']:+.4f}.")


ATX_HEADING = re.compile(r"#{1,5} ")


def nested_markdown(text: str) -> str:
    """``text`` as a subsection: every ATX heading one level deeper (``# A`` -> ``## A``), code fences left alone,
    so that a stage's own Markdown page (e.g. ``audit_summary.md``) can sit under ``summary.md``'s title."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        lines.append("#" + line if not fenced and ATX_HEADING.match(line) else line)
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def summary_markdown(long: pd.DataFrame, run: str, identities: Iterable[int]) -> str:
    """``summary.md``: the two sentences on ``run`` and the headline table of every run."""
    header, *rows = headline_table(long)
    lines = ["# What was forgotten, and at what cost", "", headline_sentences(long, run, identities), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join([*lines, "", SUMMARY_NOTE]) + "\n"


# what an unlearning job's time measures, by the timings.json key it is read from (job_seconds)
SECONDS_MEASURES = {"seconds_total": "every step summed", "seconds_this_session": "wall time of the job's last start"}


def job_seconds(timings: dict) -> float:
    """An unlearning job's time from its timings.json: every step's seconds summed (``seconds_total``); timings
    without it (written before it existed, or a merge's, which is never resumed) give their last session's wall
    time, the whole job unless it was resumed (``job_seconds_measure`` says which)."""
    return float(timings["seconds_total"] if "seconds_total" in timings else timings["seconds_this_session"])


def job_seconds_measure(timings: dict) -> str:
    """What ``job_seconds`` of these timings measures (``SECONDS_MEASURES``), for the tables' labels."""
    return SECONDS_MEASURES["seconds_total" if "seconds_total" in timings else "seconds_this_session"]


# ----- runs paired by forget identity on their evaluation --------------------------------------------------------

# measure -> the metrics column compared (a mean over identities); SRK is pooled from the sample counts instead
PAIRED_MEASURES = {"forget ISM": "ism_forget_after", "retain ISM": "ism_retain_after", "SRK (pooled)": None,
                   "KD change, forget samples": "kd_forget_delta", "KD change, retain samples": "kd_retain_delta",
                   "quality change, retain samples": "quality_retain_delta",
                   "unlearning seconds per identity": "unlearning_seconds"}
PAIRED_SIDES = ("compare", "reference")
PAIRED_COLUMNS = ["run", "measure", "n", "mean", "ci_low", "ci_high", "difference_interval", "measured",
                  *[f"{side}_{column}" for side in PAIRED_SIDES
                    for column in ("run", "n", "diff", "low", "high", "p_wilcoxon", "p_holm")]]


def _difference(values: pd.Series | None, counts: pd.DataFrame, run: str, other: str | None, seed: int) -> dict:
    """``run`` minus ``other`` on the identities both have: the mean of the paired differences of ``values``
    (indexed by run and forget identity; Student-t interval, two-sided Wilcoxon p) or, for SRK (``values`` None),
    the difference of the pooled values (paired bootstrap interval, no p)."""
    if values is not None:
        paired = paired_with(values, run, other, seed)
        return paired and {"run": other, "n": paired["n"], "diff": paired["mean_diff"], "low": paired["t_low"],
                           "high": paired["t_high"], "p_wilcoxon": paired["p_wilcoxon"]}
    if other is None or other == run or other not in set(counts["run"]):
        return {}
    n, diff, low, high = pooled_difference(identity_counts(counts, other, "after"),
                                           identity_counts(counts, run, "after"), pooled_srk, seed)
    return {"run": other, "n": n, "diff": diff, "low": low, "high": high, "p_wilcoxon": float("nan")}


def paired_runs(metrics: pd.DataFrame, counts: pd.DataFrame, costs: pd.DataFrame, against: Mapping[str, str | None],
                seed: int) -> pd.DataFrame:
    """One row per (run, measure of ``PAIRED_MEASURES`` the run has): its value over its forget identities with a
    95% identity-bootstrap interval (SRK pooled over every sample of every identity, PIU eqs. 8-10; every other
    measure a mean over identities), and for each side of ``against`` ("compare", "reference": a run or None) the
    run minus that run, paired by identity (``_difference``), Holm-corrected over the run's measures against it.
    ``metrics`` / ``counts``: the aggregate stage's metrics and sample-count tables; ``costs``: its costs table, whose
    ``unlearning_seconds`` is an unlearning job's time (``job_seconds``; external models have none) and
    ``seconds_measure``, where present, what that time measures: the run's row says it in ``measured``."""
    metrics = metrics.merge(costs[["run", "forget_identity", "unlearning_seconds"]], how="left",
                            on=["run", "forget_identity"])
    indexed = metrics.set_index(["run", "forget_identity"])
    records = []
    for run in sorted(metrics["run"].unique()):
        own = metrics[metrics["run"] == run]
        for measure, column in PAIRED_MEASURES.items():
            if column is None:
                after = identity_counts(counts, run, "after")
                n, (mean, low, high) = len(after), bootstrap_pooled(after, pooled_srk, seed)
            else:
                n, (mean, low, high) = int(own[column].notna().sum()), bootstrap_mean(own[column], seed)
            if not n:
                continue
            record = {"run": run, "measure": measure, "n": n, "mean": mean, "ci_low": low, "ci_high": high,
                      "difference_interval": "paired bootstrap" if column is None else "Student-t"}
            if column == "unlearning_seconds" and "seconds_measure" in costs:
                record["measured"] = "; ".join(sorted(set(costs.loc[costs["run"] == run, "seconds_measure"])))
            for side in PAIRED_SIDES:
                record.update({f"{side}_{k}": v for k, v in
                               _difference(None if column is None else indexed[column], counts, run,
                                           against.get(side), seed).items()})
            records.append(record)
    out = pd.DataFrame.from_records(records).reindex(columns=PAIRED_COLUMNS)
    for side in PAIRED_SIDES:  # Holm (1979) over the run's measures against that run
        out[f"{side}_p_holm"] = out.groupby("run")[f"{side}_p_wilcoxon"].transform(holm)
    return out
