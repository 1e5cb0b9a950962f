"""Aggregation of per-run metrics: means with Student-t confidence intervals, and before/after columns.

NaN handling: a NaN value means "not measured" and is left out, so each statistic is over the non-NaN values only
(``summarise`` reports that count as ``<col>_n`` beside the group's row count ``n``). No values left gives a NaN
mean; fewer than two gives a NaN half width."""

from __future__ import annotations

import json
from typing import Iterable, Mapping

import numpy as np
import pandas as pd
from scipy import stats


def mean_ci(values, confidence: float = 0.95) -> tuple[float, float]:
    """Mean and half width of its two-sided Student-t confidence interval, over the non-NaN ``values``."""
    x = np.asarray(values, np.float64).ravel()
    x = x[~np.isnan(x)]
    mean = float(x.mean()) if len(x) else float("nan")
    if len(x) < 2:
        return mean, float("nan")
    # half width = t_{(1 + confidence)/2, n-1} * s / sqrt(n), s the sample standard deviation (ddof = 1)
    half_width = stats.t.ppf((1.0 + confidence) / 2.0, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return mean, float(half_width)


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
