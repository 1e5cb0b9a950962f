"""The PIU paper's Tables 1-6 rebuilt from the workflow's metrics table, each cell beside the paper's value, and a
generated summary of whether each qualitative claim of the paper holds in these numbers.

A table is configured (``study`` config section) as named rows -> run names (``rows``; the run name ``before``
means the original model) or as an ablation sweep (``sweep``; rows are the sweep's values).
"""

from __future__ import annotations

from importlib import resources

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from .config import ConfigError, sweep_runs
from .evaluation.aggregate import mean_ci

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


def build_table(rows: list[tuple[str, str]], metric_names: list[str], metrics: pd.DataFrame,
                paper_rows: dict) -> pd.DataFrame:
    """One row per (label, run): identities, then per metric our mean over forget identities, its 95% half width
    and the paper's value. ``*_delta`` metrics are after - before; others are after-unlearning values, or the
    original model's (``before`` row: every forget identity of the table's runs, once)."""
    runs = [run for _, run in rows if run != BEFORE]
    missing = sorted(set(runs) - set(metrics["run"]))
    if missing:
        raise ValueError(f"the metrics table has no rows for run(s) {missing}: run them first (snakemake)")
    records = []
    for label, run in rows:
        if run == BEFORE:
            part = metrics[metrics["run"].isin(runs)].drop_duplicates("forget_identity")
        else:
            part = metrics[metrics["run"] == run]
        record = {"row": label, "run": run, "n_identities": len(part)}
        for name in metric_names:
            if name.endswith("_delta"):
                column = None if run == BEFORE else name
            else:
                column = f"{name}_before" if run == BEFORE else f"{name}_after"
            mean, half = mean_ci(part[column]) if column else (float("nan"), float("nan"))
            record[name], record[f"{name}_ci95"] = mean, half
            record[f"{name}_paper"] = paper_rows.get(label, {}).get(name, float("nan"))
        records.append(record)
    return pd.DataFrame.from_records(records)


def build_study(metrics: pd.DataFrame, config: dict) -> dict[str, pd.DataFrame]:
    """Every table of the ``study`` config section, keyed by its name (table1 ... table6)."""
    paper = paper_tables()
    tables = {}
    for name, spec in config["study"].items():
        if name not in paper:
            raise ConfigError(f"config key 'study.{name}': no such paper table; use one of {', '.join(paper)}")
        tables[name] = build_table(table_rows(spec, config), paper[name]["metrics"], metrics,
                                   paper[name]["rows"])
    return tables


# ----- qualitative claims of the paper (Sections 4.1-4.2), checked on our numbers ---------------------------------

def _value(table: pd.DataFrame, row: str, metric: str) -> float:
    return float(table.set_index("row").loc[row, metric])


def _claim(claim: str, table: str, holds: bool, apart: bool, evidence: str) -> dict:
    """``apart``: the rows the verdict rests on differ by more than the sum of their 95% half widths over forget
    identities (non-overlapping intervals); otherwise the verdict is within the noise of so few identities."""
    return {"claim": claim, "table": table, "holds": "yes" if holds else "no",
            "beyond_noise": "yes" if apart else "no", "evidence": evidence}


def _apart(table: pd.DataFrame, row_a: str, row_b: str, metric: str) -> bool:
    """Whether two rows' 95% intervals of ``metric`` do not overlap."""
    t = table.set_index("row")
    gap = abs(float(t.loc[row_a, metric]) - float(t.loc[row_b, metric]))
    return bool(gap > float(t.loc[row_a, f"{metric}_ci95"]) + float(t.loc[row_b, f"{metric}_ci95"]))


def _ends_apart(table: pd.DataFrame, metric: str) -> bool:
    """A sweep's trend beyond noise: its first and last rows' intervals do not overlap."""
    return _apart(table, table["row"].iloc[0], table["row"].iloc[-1], metric)


def _ranked(rows: pd.DataFrame, metric: str, largest: bool) -> list[str]:
    """Row labels from the largest (or smallest) ``metric`` down; ties keep table order."""
    return rows.sort_values(metric, ascending=not largest, kind="stable")["row"].tolist()


def _trend(table: pd.DataFrame, metric: str) -> float:
    """Spearman correlation of a metric with the (numeric) sweep value of each row."""
    return float(stats.spearmanr(table["row"].astype(float), table[metric]).statistic)


def _fmt(table: pd.DataFrame, metric: str) -> str:
    return ", ".join(f"{r}: {v:.3f}" for r, v in zip(table["row"], table[metric]))


def _table1_claims(t: pd.DataFrame) -> list[dict]:
    methods = t[t["run"] != BEFORE]
    if "PIU" not in set(methods["row"]) or len(methods) < 2:
        return []
    before_retain = _value(t, BEFORE, "ism_retain") if BEFORE in set(t["row"]) else float("nan")
    piu_retain = _value(t, "PIU", "ism_retain")
    best, second = _ranked(methods, "srk", largest=True)[:2]
    lowest, next_lowest = _ranked(methods, "ism_forget", largest=False)[:2]
    return [
        _claim("PIU reaches the highest SRK of all methods while keeping retain ISM (>= 0.9 x before)", "table1",
               best == "PIU" and piu_retain >= 0.9 * before_retain, _apart(t, best, second, "srk"),
               f"SRK {_fmt(methods, 'srk')}; PIU retain ISM {piu_retain:.3f} vs before {before_retain:.3f}"),
        _claim("PIU has the lowest forget ISM of all methods", "table1", lowest == "PIU",
               _apart(t, lowest, next_lowest, "ism_forget"), f"forget ISM {_fmt(methods, 'ism_forget')}"),
    ]


def _table2_claims(t: pd.DataFrame) -> list[dict]:
    needed = {"Naive", "+ Preservation", "+ Neg. guidance"}
    if not needed <= set(t["row"]):
        return []
    naive, pres = _value(t, "Naive", "ism_retain"), _value(t, "+ Preservation", "ism_retain")
    f_pres, f_neg = _value(t, "+ Preservation", "ism_forget"), _value(t, "+ Neg. guidance", "ism_forget")
    return [
        _claim("Adding the preservation term raises retain ISM over naive unlearning", "table2", pres > naive,
               _apart(t, "Naive", "+ Preservation", "ism_retain"),
               f"retain ISM naive {naive:.3f}, + preservation {pres:.3f}"),
        _claim("Adding negative guidance lowers forget ISM", "table2", f_neg < f_pres,
               _apart(t, "+ Preservation", "+ Neg. guidance", "ism_forget"),
               f"forget ISM + preservation {f_pres:.3f}, + negative guidance {f_neg:.3f}"),
    ]


def _table3_claims(t: pd.DataFrame) -> list[dict]:
    if "0" not in set(t["row"]) or len(t) < 3:
        return []
    others = t[t["row"] != "0"]
    zero = _value(t, "0", "ism_retain")
    nearest = _ranked(others, "ism_retain", largest=False)[0]
    return [
        _claim("lambda = 0 collapses retain ISM (lowest of the sweep)", "table3", zero < others["ism_retain"].min(),
               _apart(t, "0", nearest, "ism_retain"), f"retain ISM {_fmt(t, 'ism_retain')}"),
        _claim("Larger lambda weakens forgetting (forget ISM rises with lambda)", "table3",
               _trend(t, "ism_forget") > 0, _ends_apart(t, "ism_forget"),
               f"Spearman {_trend(t, 'ism_forget'):+.2f}; forget ISM {_fmt(t, 'ism_forget')}"),
    ]


def _table4_claims(t: pd.DataFrame) -> list[dict]:
    if len(t) < 3:
        return []
    rho = _trend(t, "ism_forget")
    return [_claim("A farther anchor (lower tau) forgets more (forget ISM rises with tau)", "table4", rho > 0,
                   _ends_apart(t, "ism_forget"), f"Spearman {rho:+.2f}; forget ISM {_fmt(t, 'ism_forget')}")]


def _table5_claims(t: pd.DataFrame) -> list[dict]:
    if "0" not in set(t["row"]) or len(t) < 3:
        return []
    others = t[t["row"] != "0"]
    rho = _trend(t, "ism_forget")
    weakest, lowest_srk = _ranked(others, "ism_forget", largest=True)[0], _ranked(others, "srk", largest=False)[0]
    return [
        _claim("eta = 0 forgets weakly (highest forget ISM and lowest SRK of the sweep)", "table5",
               _value(t, "0", "ism_forget") > others["ism_forget"].max() and _value(t, "0", "srk") < others["srk"].min(),
               _apart(t, "0", weakest, "ism_forget") and _apart(t, "0", lowest_srk, "srk"),
               f"forget ISM {_fmt(t, 'ism_forget')}; SRK {_fmt(t, 'srk')}"),
        _claim("Larger eta strengthens forgetting (forget ISM falls with eta)", "table5", rho < 0,
               _ends_apart(t, "ism_forget"), f"Spearman {rho:+.2f}; forget ISM {_fmt(t, 'ism_forget')}"),
    ]


def _table6_claims(t: pd.DataFrame) -> list[dict]:
    if not {"full", "all_cross_attention", "surgical"} <= set(t["row"]):
        return []
    full = _value(t, "full", "ism_retain")
    rest = t[t["row"] != "full"]
    nearest = _ranked(rest, "ism_retain", largest=False)[0]
    s_srk, ca_srk = _value(t, "surgical", "srk"), _value(t, "all_cross_attention", "srk")
    return [
        _claim("Fine-tuning the full UNet degrades retain ISM most", "table6", full < rest["ism_retain"].min(),
               _apart(t, "full", nearest, "ism_retain"), f"retain ISM {_fmt(t, 'ism_retain')}"),
        _claim("The surgical subset reaches an SRK at least that of all cross-attention layers", "table6",
               s_srk >= ca_srk, _apart(t, "surgical", "all_cross_attention", "srk"),
               f"SRK surgical {s_srk:.2f}, all cross-attention {ca_srk:.2f}"),
    ]


CLAIMS = {"table1": _table1_claims, "table2": _table2_claims, "table3": _table3_claims, "table4": _table4_claims,
          "table5": _table5_claims, "table6": _table6_claims}


def check_claims(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per qualitative claim of the paper whose table is configured: holds yes/no, and the numbers."""
    rows = [claim for name, table in tables.items() for claim in CLAIMS[name](table)]
    return pd.DataFrame(rows, columns=["claim", "table", "holds", "beyond_noise", "evidence"])


def claims_markdown(claims: pd.DataFrame, n_identities: int) -> str:
    lines = [f"# Do the PIU paper's claims hold on this world? ({n_identities} forget identities)", "",
             "Generated by idunlearn.study from results/tables/metrics.parquet; every number below is a mean over",
             "forget identities in the table it names (results/tables/study/<table>.csv). \"beyond noise\": the",
             "rows the verdict rests on have non-overlapping 95% intervals over forget identities; \"within noise\":",
             "they overlap, so more identities are needed to settle it.", ""]
    for row in claims.itertuples():
        noise = "beyond noise" if row.beyond_noise == "yes" else "within noise"
        lines.append(f"- **{row.holds}** ({noise}) — {row.claim} ({row.table}): {row.evidence}")
    if claims.empty:
        lines.append("- no claim could be checked: the configured tables lack the rows the claims compare")
    return "\n".join(lines) + "\n"


def identities_in(metrics: pd.DataFrame) -> int:
    return int(np.unique(metrics["forget_identity"]).size)
