"""The PIU paper's Tables 1-6 rebuilt from the workflow's metrics and sample-count tables, each cell beside the
paper's value, and a generated, statistically tested summary of whether each qualitative claim of the paper holds.

A table is configured (``study`` config section) as named rows -> run names (``rows``; the run name ``before``
means the original model) or as an ablation sweep (``sweep``; rows are the sweep's values).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from .config import ConfigError, sweep_runs, tuned_base, tuned_run_name
from .evaluation.aggregate import identity_counts
from .evaluation.statistics import (bootstrap_mean, bootstrap_pooled, holm, mean_difference,
                                    paired_differences, pooled_difference, pooled_srk, verdict)

BEFORE = "before"


def paper_tables() -> dict:
    return yaml.safe_load((resources.files("idunlearn") / "paper" / "piu_tables.yaml").read_text())


def table_rows(spec: dict, config: dict) -> list[tuple[str, str]]:
    """(row label, run name) of one configured table."""
    if "sweep" in spec:
        sweeps = sweep_runs(config)
        if spec["sweep"] not in sweeps:
            raise ConfigError(f"config key 'study': sweep {spec['sweep']!r} is not in unlearning.sweeps "
                              f"({', '.join(sweeps) or 'none'})")
        return [(str(value), name) for value, name, _, _ in sweeps[spec["sweep"]]]
    return list(spec["rows"].items())


def _identity_values(metrics: pd.DataFrame, run: str, column: str) -> pd.Series:
    """Per forget identity (index): ``<column>_before`` of the original model (``run`` BEFORE: every identity of the
    metrics given, once) or ``<column>_after`` of ``run``."""
    if run == BEFORE:
        part = metrics.drop_duplicates("forget_identity")
        return part.set_index("forget_identity")[f"{column}_before"].sort_index()
    return metrics[metrics["run"] == run].set_index("forget_identity")[f"{column}_after"].sort_index()


def _identity_counts(counts: pd.DataFrame, run: str, identities) -> pd.DataFrame:
    """Per-identity sample counts (``statistics.sample_counts``) of the original model (``run`` BEFORE) or of ``run``
    after unlearning, on ``identities``."""
    part = identity_counts(counts, None, "before") if run == BEFORE else identity_counts(counts, run, "after")
    return part.loc[part.index.intersection(pd.Index(identities))].sort_index()


def build_table(rows: list[tuple[str, str]], metric_names: list[str], metrics: pd.DataFrame, counts: pd.DataFrame,
                paper_rows: dict, seed: int) -> pd.DataFrame:
    """One row per (label, run): identities, then per metric our value over forget identities with its 95% interval
    (``_ci_low``, ``_ci_high``) and the paper's value. ``srk`` is the pooled SRK (PIU eqs. 8-10) with an identity-
    bootstrap interval, beside the mean per-identity ``srk_identity``; other metrics are means with identity-
    bootstrap intervals. ``*_delta`` metrics are after - before; others are after-unlearning values, or the original model's
    (``before`` row: every forget identity of the table's runs, once)."""
    runs = [run for _, run in rows if run != BEFORE]
    missing = sorted(set(runs) - set(metrics["run"]))
    if missing:
        raise ValueError(f"the metrics table has no rows for run(s) {missing}: run them first (snakemake)")
    table_metrics = metrics[metrics["run"].isin(runs)]
    records = []
    for label, run in rows:
        record = {"row": label, "run": run, "n_identities": len(_identity_values(table_metrics, run, "ism_forget"))}
        for name in metric_names:
            paper = paper_rows.get(label, {}).get(name, float("nan"))
            if name == "srk":
                per_identity = _identity_values(table_metrics, run, "srk_identity")
                record["srk"], record["srk_ci_low"], record["srk_ci_high"] = bootstrap_pooled(
                    _identity_counts(counts, run, per_identity.index), pooled_srk, seed)
                record["srk_paper"] = paper
                _put(record, "srk_identity", per_identity, seed)
                continue
            if name.endswith("_delta"):
                values = [] if run == BEFORE else table_metrics.loc[table_metrics["run"] == run, name]
            else:
                values = _identity_values(table_metrics, run, name)
            _put(record, name, values, seed)
            record[f"{name}_paper"] = paper
        records.append(record)
    return pd.DataFrame.from_records(records)


def _put(record: dict, name: str, values, seed: int) -> None:
    """``name``, ``name_ci_low``, ``name_ci_high``: the mean of ``values`` (one per identity) and its identity-
    bootstrap 95% interval."""
    record[name], record[f"{name}_ci_low"], record[f"{name}_ci_high"] = bootstrap_mean(values, seed)


def build_study(metrics: pd.DataFrame, counts: pd.DataFrame, config: dict) -> dict[str, pd.DataFrame]:
    """Every table of the ``study`` config section, keyed by its name (table1 ... table6)."""
    paper = paper_tables()
    tables = {}
    for name, spec in config["study"].items():
        if name not in paper:
            raise ConfigError(f"config key 'study.{name}': no such paper table; use one of {', '.join(paper)}")
        tables[name] = build_table(table_rows(spec, config), paper[name]["metrics"], metrics, counts,
                                   paper[name]["rows"], config["seed"])
    return tables


# ----- qualitative claims of the paper (Sections 4.1-4.2), tested on our numbers ----------------------------------
#
# Each claim is one paired comparison of two rows of a table (b against a, claimed direction +1: b > a, -1: b < a)
# on the forget identities both rows have. Rows named by a ranking (the best competitor, the nearest row) are picked
# on the table's values; the test then asks whether the identities agree.


@dataclass
class Claims:
    """The data every claim of one study reads: metrics and sample counts per (run, forget identity), the tables."""

    metrics: pd.DataFrame
    counts: pd.DataFrame
    tables: dict[str, pd.DataFrame]
    seed: int

    def run(self, table: str, row: str) -> str:
        t = self.tables[table]
        return str(t.loc[t["row"] == row, "run"].iloc[0])

    def values(self, table: str, row: str, metric: str) -> pd.Series:
        """Per-identity values of a row; for ``srk`` the per-identity ``srk_identity``."""
        runs = [r for r in self.tables[table]["run"] if r != BEFORE]
        column = "srk_identity" if metric == "srk" else metric
        return _identity_values(self.metrics[self.metrics["run"].isin(runs)], self.run(table, row), column)

    def compare(self, claim: str, table: str, metric: str, row_a: str, row_b: str, direction: int,
                evidence: str, a: pd.Series | None = None) -> dict:
        """Row b against row a (or against the per-identity values ``a`` given). ``effect``: the mean per-identity
        difference, or for ``srk`` the difference of pooled SRKs on the shared identities with a paired bootstrap
        interval; t interval and Wilcoxon test are on the per-identity differences (``srk_identity`` for srk)."""
        a = self.values(table, row_a, metric) if a is None else a
        diffs = paired_differences(a, self.values(table, row_b, metric))
        paired = mean_difference(diffs, self.seed, direction)
        effect, low, high = paired["mean_diff"], paired["boot_low"], paired["boot_high"]
        if metric == "srk":
            _, effect, low, high = pooled_difference(
                _identity_counts(self.counts, self.run(table, row_a), diffs.index),
                _identity_counts(self.counts, self.run(table, row_b), diffs.index), pooled_srk, self.seed)
        return {"claim": claim, "table": table, "metric": metric, "row_a": row_a, "row_b": row_b,
                "direction": direction, "n_identities": paired["n"], "effect": effect,
                "effect_ci_low": low, "effect_ci_high": high, "mean_identity_diff": paired["mean_diff"],
                "t_ci_low": paired["t_low"], "t_ci_high": paired["t_high"], "p_wilcoxon": paired["p_wilcoxon"],
                "evidence": evidence}


def _value(table: pd.DataFrame, row: str, metric: str) -> float:
    return float(table.set_index("row").loc[row, metric])


def _ranked(rows: pd.DataFrame, metric: str, largest: bool) -> list[str]:
    """Row labels from the largest (or smallest) ``metric`` down; ties keep table order."""
    return rows.sort_values(metric, ascending=not largest, kind="stable")["row"].tolist()


def _trend(table: pd.DataFrame, metric: str) -> float:
    """Spearman correlation of a metric with the (numeric) sweep value of each row."""
    return float(stats.spearmanr(table["row"].astype(float), table[metric]).statistic)


def _fmt(table: pd.DataFrame, metric: str) -> str:
    return ", ".join(f"{r}: {v:.3f}" for r, v in zip(table["row"], table[metric]))


def _table1_claims(c: Claims, t: pd.DataFrame) -> list[dict]:
    """PIU against the other methods on equal terms: the paper-setting rows against each other, and,
    when the table has the tuning protocol's rows, PIU's tuned row against the other tuned rows."""
    methods = t[t["run"] != BEFORE]
    if "PIU" not in set(methods["row"]) or len(methods) < 2:
        return []
    piu = c.run("table1", "PIU")
    tuned = methods["run"].map(lambda run: tuned_base(run) is not None)
    claims = _piu_against(c, methods[~tuned], "PIU", "")
    piu_tuned = methods.loc[methods["run"] == tuned_run_name(piu), "row"]
    if len(piu_tuned) and tuned.sum() > 1:
        claims += _piu_against(c, methods[tuned], piu_tuned.iloc[0], " (every method at its tuned setting)")
    return claims


def _piu_against(c: Claims, methods: pd.DataFrame, piu_row: str, setting: str) -> list[dict]:
    """Table 1's three claims for PIU's row ``piu_row`` against the other rows of ``methods``."""
    others = methods[methods["row"] != piu_row]
    if others.empty:
        return []
    best_srk, lowest_forget = _ranked(others, "srk", largest=True)[0], _ranked(others, "ism_forget", False)[0]
    kept = 0.9 * _identity_values(c.metrics[c.metrics["run"] == c.run("table1", piu_row)], BEFORE, "ism_retain")
    return [
        c.compare(f"PIU reaches a higher SRK than every other method{setting}", "table1", "srk", best_srk, piu_row,
                  +1, f"SRK {_fmt(methods, 'srk')}"),
        c.compare(f"PIU keeps retain ISM (above 0.9 x the original model's){setting}", "table1", "ism_retain",
                  "0.9 x before", piu_row, +1, f"retain ISM {piu_row} {_value(methods, piu_row, 'ism_retain'):.3f}, "
                  f"0.9 x before {kept.mean():.3f}", a=kept),
        c.compare(f"PIU has a lower forget ISM than every other method{setting}", "table1", "ism_forget",
                  lowest_forget, piu_row, -1, f"forget ISM {_fmt(methods, 'ism_forget')}"),
    ]


def _table2_claims(c: Claims, t: pd.DataFrame) -> list[dict]:
    if not {"Naive", "+ Preservation", "+ Neg. guidance"} <= set(t["row"]):
        return []
    return [
        c.compare("Adding the preservation term raises retain ISM over naive unlearning", "table2", "ism_retain",
                  "Naive", "+ Preservation", +1, f"retain ISM {_fmt(t, 'ism_retain')}"),
        c.compare("Adding negative guidance lowers forget ISM", "table2", "ism_forget", "+ Preservation",
                  "+ Neg. guidance", -1, f"forget ISM {_fmt(t, 'ism_forget')}"),
    ]


def _sweep_ends(c: Claims, claim: str, name: str, t: pd.DataFrame, metric: str, direction: int) -> dict:
    """A sweep's trend: its last row against its first (Spearman of the row values in the evidence)."""
    return c.compare(claim, name, metric, t["row"].iloc[0], t["row"].iloc[-1], direction,
                     f"Spearman {_trend(t, metric):+.2f}; {metric} {_fmt(t, metric)}")


def _table3_claims(c: Claims, t: pd.DataFrame) -> list[dict]:
    if "0" not in set(t["row"]) or len(t) < 3:
        return []
    nearest = _ranked(t[t["row"] != "0"], "ism_retain", largest=False)[0]
    return [
        c.compare("lambda = 0 collapses retain ISM (lowest of the sweep)", "table3", "ism_retain", nearest, "0", -1,
                  f"retain ISM {_fmt(t, 'ism_retain')}"),
        _sweep_ends(c, "Larger lambda weakens forgetting (forget ISM rises with lambda)", "table3", t,
                    "ism_forget", +1),
    ]


def _table4_claims(c: Claims, t: pd.DataFrame) -> list[dict]:
    if len(t) < 3:
        return []
    return [_sweep_ends(c, "A farther anchor (lower tau) forgets more (forget ISM rises with tau)", "table4", t,
                        "ism_forget", +1)]


def _table5_claims(c: Claims, t: pd.DataFrame) -> list[dict]:
    if "0" not in set(t["row"]) or len(t) < 3:
        return []
    others = t[t["row"] != "0"]
    weakest, lowest_srk = _ranked(others, "ism_forget", largest=True)[0], _ranked(others, "srk", largest=False)[0]
    return [
        c.compare("eta = 0 forgets weakly (highest forget ISM of the sweep)", "table5", "ism_forget", weakest, "0",
                  +1, f"forget ISM {_fmt(t, 'ism_forget')}"),
        c.compare("eta = 0 forgets weakly (lowest SRK of the sweep)", "table5", "srk", lowest_srk, "0", -1,
                  f"SRK {_fmt(t, 'srk')}"),
        _sweep_ends(c, "Larger eta strengthens forgetting (forget ISM falls with eta)", "table5", t, "ism_forget", -1),
    ]


def _table6_claims(c: Claims, t: pd.DataFrame) -> list[dict]:
    if not {"full", "all_cross_attention", "surgical"} <= set(t["row"]):
        return []
    nearest = _ranked(t[t["row"] != "full"], "ism_retain", largest=False)[0]
    return [
        c.compare("Fine-tuning the full UNet degrades retain ISM most", "table6", "ism_retain", nearest, "full", -1,
                  f"retain ISM {_fmt(t, 'ism_retain')}"),
        c.compare("The surgical subset reaches a higher SRK than all cross-attention layers", "table6", "srk",
                  "all_cross_attention", "surgical", +1, f"SRK {_fmt(t, 'srk')}"),
    ]


CLAIMS = {"table1": _table1_claims, "table2": _table2_claims, "table3": _table3_claims, "table4": _table4_claims,
          "table5": _table5_claims, "table6": _table6_claims}


CLAIM_COLUMNS = ["claim", "table", "metric", "row_a", "row_b", "direction", "n_identities", "effect", "effect_ci_low",
                 "effect_ci_high", "mean_identity_diff", "t_ci_low", "t_ci_high", "p_wilcoxon", "p_holm", "holds",
                 "established", "evidence"]


def check_claims(tables: dict[str, pd.DataFrame], metrics: pd.DataFrame, counts: pd.DataFrame,
                 seed: int) -> pd.DataFrame:
    """One row per qualitative claim of the paper whose table is configured: the paired comparison it rests on,
    its Wilcoxon p-value Holm-corrected across the claims of its table, and the verdict (``holds``: the effect has
    the claimed sign; ``established``: also the per-identity mean, with a corrected p-value below 0.05)."""
    data = Claims(metrics, counts, tables, seed)
    parts = []
    for name, table in tables.items():
        part = pd.DataFrame(CLAIMS[name](data, table), columns=[c for c in CLAIM_COLUMNS if c not in
                                                                 ("p_holm", "holds", "established")])
        part["p_holm"] = holm(part["p_wilcoxon"])
        verdicts = [verdict(row.effect, row.p_holm, row.direction) for row in part.itertuples()]
        part["holds"] = [holds for holds, _ in verdicts]
        part["established"] = [established and np.sign(row.mean_identity_diff) == row.direction
                               for (_, established), row in zip(verdicts, part.itertuples())]
        parts.append(part)
    claims = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=CLAIM_COLUMNS)
    return claims[CLAIM_COLUMNS]


def _verdict_label(row) -> str:
    if row.established:
        return "established"
    return "holds in direction, not established" if row.holds else "does not hold"


def claims_markdown(claims: pd.DataFrame, n_identities: int) -> str:
    lines = [f"# Do the PIU paper's claims hold on this world? ({n_identities} forget identities)", "",
             "Generated by idunlearn.study from results/tables/metrics.parquet and sample_counts.parquet. Each claim",
             "compares two rows of the table it names (results/tables/study/<table>.csv), b against a, paired by",
             "forget identity on the n identities both rows have. Effect: b - a, the mean per-identity difference,",
             "or for SRK the difference of pooled SRKs (PIU eqs. 8-10), with a 95% identity-bootstrap interval; t:",
             "the Student-t 95% interval of the mean per-identity difference (per-identity SRK for SRK claims);",
             "p: one-sided Wilcoxon signed-rank test of the per-identity differences in the claimed direction,",
             "Holm-corrected across the claims of one table. \"established\": the corrected p is below 0.05 and",
             "the effect and the mean per-identity difference have the claimed sign; \"holds in direction\": the",
             "effect has the claimed sign, without that evidence.", ""]
    for row in claims.itertuples():
        sign = ">" if row.direction > 0 else "<"
        lines.append(
            f"- **{_verdict_label(row)}** — {row.claim} ({row.table}: {row.row_b} {sign} {row.row_a} in "
            f"{row.metric}, n = {row.n_identities}): effect {row.effect:+.4g} ({row.effect_ci_low:+.4g} to "
            f"{row.effect_ci_high:+.4g}); per-identity mean {row.mean_identity_diff:+.4g}, t {row.t_ci_low:+.4g} to "
            f"{row.t_ci_high:+.4g}; p {row.p_wilcoxon:.3g}, Holm {row.p_holm:.3g}. {row.evidence}")
    if claims.empty:
        lines.append("- no claim could be checked: the configured tables lack the rows the claims compare")
    return "\n".join(lines) + "\n"


def identities_in(metrics: pd.DataFrame) -> int:
    return int(np.unique(metrics["forget_identity"]).size)
