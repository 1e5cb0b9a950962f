"""User docs whose numbers regenerate. ``python -m idunlearn docs --results results/`` rewrites every generated block
of README.md and docs/**/*.md from the result tables the workflow wrote (a block whose tables are missing, or lack
the runs it names, keeps its text), and the configuration reference (docs/configuration.md) from the JSON schema.

A generated block sits between ``<!-- generated:NAME -->`` (or ``<!-- generated:NAME:ARGUMENT -->``) and
``<!-- /generated -->``; NAME picks a renderer of ``RENDERERS``, ARGUMENT (run names, comma-separated) narrows it."""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .audit.relearning_worstcase import worstcase_markdown
from .audit.tables import ORIGINAL, TRAINED_AGAINST, headline, marked
from .audit.verdicts import VERDICTS, design_sentence, small_gap_line
from .config import load_schema
from .evaluation.statistics import bootstrap_mean, mean_difference
from .io import atomic_path, read_json
from .many import FA_TARGET, RETAIN_TARGETS

BLOCK = re.compile(r"(?P<open><!-- generated:(?P<name>[\w.-]+)(?::(?P<argument>[^ >]*))? -->\n)(?P<body>.*?)"
                   r"(?P<close><!-- /generated -->)", re.S)


class MissingResults(LookupError):
    """A block's tables (or the runs it names) are not in the results folder: the block keeps its text."""


# Every written block keeps the result files it was rendered from under docs/results/data/<page>/<block>/ (paths as
# under the results folder), so that the suite renders each block again from them and finds the page unchanged.
SHIPPED = Path("docs", "results", "data")
_reading: list[Path] | None = None  # the files the renderer running now has read (regenerate_text collects them)


def _read_file(path: Path) -> Path:
    if _reading is not None:
        _reading.append(path)
    return path


# ----- cells -------------------------------------------------------------------------------------------------------

def number(value) -> str:
    """A value as the docs print it: 3 decimals below 10, 1 above, '-' for a missing one."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def interval(mean, low, high) -> str:
    """'mean (low to high)', or the mean alone when the interval is missing (one identity)."""
    if low is None or (isinstance(low, float) and np.isnan(low)):
        return number(mean)
    return f"{number(mean)} ({number(low)} to {number(high)})"


def p_value(p) -> str:
    """A p-value as the docs print it: 3 decimals, '< 0.001' below that."""
    return "< 0.001" if p < 0.001 else number(p)


def markdown_table(header: list[str], rows: Iterable[list[str]]) -> str:
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)]) + "\n"


def _read(results: Path, *parts: str, columns: Iterable[str] = ()) -> pd.DataFrame:
    """A result table; ``columns`` it must hold (a table an older version wrote may lack newer ones)."""
    path = results.joinpath(*parts)
    if not path.is_file():
        raise MissingResults(str(path))
    _read_file(path)
    table = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise MissingResults(f"{path} lacks the columns {missing}: an older version wrote it; rerun the stage "
                             "that writes it (snakemake reruns it after an upgrade, or use --forcerun RULE)")
    return table


def _runs(argument: str | None) -> list[str]:
    return [r for r in (argument or "").split(",") if r]


def _require_runs(table: pd.DataFrame, runs: list[str], what: str) -> None:
    missing = sorted(set(runs) - set(table["run"]))
    if missing:
        raise MissingResults(f"{what} has no rows of run(s) {missing}")


# ----- renderers: result tables -> Markdown ------------------------------------------------------------------------

HEADLINE_ROWS = {"ism_forget": "forget ISM", "ism_retain": "retain-validation ISM",
                 "srk": "SRK, pooled (PIU eqs. 8-10), identity bootstrap",
                 "detection_rate_forget": "face-detection rate, forget samples",
                 "kd_forget": "KD to the real retain-validation images, forget samples",
                 "kd_retain": "KD to the real retain-validation images, retain samples"}


def render_headline(results: Path, argument: str | None) -> str:
    """One run's before / after table (``tables/summary_long.csv``): mean over its forget identities with the
    95% identity-bootstrap interval; SRK pooled over samples."""
    run = argument or "piu"
    long = _read(results, "tables", "summary_long.csv")
    _require_runs(long, [run], "tables/summary_long.csv")
    cells = long[long["run"] == run].set_index(["metric", "phase"])
    n = int(cells.loc[("srk", "after"), "n"])
    rows = [[title, *(interval(*cells.loc[(metric, phase), ["mean", "ci_low", "ci_high"]])
                      for phase in ("before", "after"))]
            for metric, title in HEADLINE_ROWS.items() if (metric, "after") in cells.index]
    return (f"Run `{run}`, {n} forget identit{'y' if n == 1 else 'ies'}; mean (95% identity-bootstrap interval).\n\n"
            + markdown_table(["", "before unlearning", f"after `{run}`"], rows))


METRIC_TITLES = {"ism_forget": "forget ISM", "ism_retain": "retain ISM", "anchor_ism_retain": "anchor ISM (retain)",
                 "srk": "SRK (pooled)", "kd_forget_delta": "KD forget change", "kd_retain_delta": "KD retain change",
                 "quality_forget": "quality forget", "quality_retain": "quality retain"}


# the columns the docs show: the KD change of the retain samples in Table 1 (collateral), of the forget samples in the
# ablations (realism of what replaces the person)
STUDY_COLUMNS = {"table1": ["ism_forget", "ism_retain", "srk", "kd_retain_delta"],
                 "ablation": ["ism_forget", "ism_retain", "srk", "kd_forget_delta"]}


def render_study_table(results: Path, argument: str | None) -> str:
    """One of the PIU paper's Tables 1-6 (``tables/study/<table>.parquet``): value (95% interval) [paper's value]."""
    table = _read(results, "tables", "study", f"{argument}.parquet")
    metrics = [m for m in STUDY_COLUMNS.get(argument, STUDY_COLUMNS["ablation"]) if f"{m}_paper" in table.columns]
    rows = []
    for row in table.itertuples(index=False):
        record = row._asdict()
        label = record["row"] if record["run"] == "before" else f"{record['row']} (`{record['run']}`)"
        rows.append([label, str(record["n_identities"]),
                     *(f"{interval(record[m], record[f'{m}_ci_low'], record[f'{m}_ci_high'])} [{number(record[f'{m}_paper'])}]"
                       for m in metrics)])
    return markdown_table(["row", "n", *(METRIC_TITLES.get(m, m) for m in metrics)], rows)


def render_claims(results: Path, argument: str | None) -> str:
    """The study's claims (``tables/study/claims.csv``), one line each: verdict, effect with its interval, Holm p."""
    claims = _read(results, "tables", "study", "claims.csv")
    if argument:
        claims = claims[claims["table"].isin(argument.split(","))]
    lines = []
    for c in claims.itertuples(index=False):
        verdict = ("established" if c.established else
                   "holds in direction, not established" if c.holds else "does not hold")
        sign = ">" if c.direction > 0 else "<"
        lines.append(f"- **{verdict}**: {c.claim} ({c.table}: {c.row_b} {sign} {c.row_a} in {c.metric}, n = "
                     f"{c.n_identities}): effect {c.effect:+.3g} ({c.effect_ci_low:+.3g} to {c.effect_ci_high:+.3g}), "
                     f"Holm p {c.p_holm:.2g}")
    return "\n".join(lines) + "\n"


def _value(value) -> str:
    """A tuning knob's value: numbers short (1e-4 as 0.0001, 20.0 as 20), strings and booleans as they are."""
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _setting(point: dict) -> str:
    return ", ".join(f"{key} {_value(value)}" for key, value in point.items())


def render_tuning(results: Path, argument: str | None) -> str:
    """Per tuned method its grid and chosen setting (``tables/tuning/grid.csv``): pooled forget and retain ISM on the
    tuning identities (ratio to before) and how many of its settings forget."""
    grid = _read(results, "tables", "tuning", "grid.csv")
    rows = []
    for method, group in grid.groupby("method", sort=False):
        points = [json.loads(p) for p in group["point"]]
        axes = " x ".join(f"{key} " + ", ".join(_value(v) for v in dict.fromkeys(p[key] for p in points))
                          for key in points[0])
        chosen = group[group["chosen"]].iloc[0]
        setting = _setting(json.loads(chosen["point"]))
        setting = setting if chosen["eligible"] else f"{setting} (none eligible: least damaging)"
        rows.append([method, axes, setting, f"{number(chosen['ism_forget'])} ({chosen['forget_ratio']:.2f})",
                     f"{number(chosen['ism_retain'])} ({chosen['retain_ratio']:.2f})",
                     f"{int(group['forgets'].sum())} of {len(group)}"])
    return markdown_table(["method", "grid", "chosen setting", "forget ISM (x before)", "retain ISM (x before)",
                           "settings that forget"], rows)


def _audit_runs(summary: pd.DataFrame, argument: str | None) -> list[str]:
    runs = _runs(argument) or [ORIGINAL, *sorted(set(summary["run"]) - {ORIGINAL})]
    _require_runs(summary, runs, "tables/audit_summary.csv")
    return runs


def render_audit_probes(results: Path, argument: str | None) -> str:
    """The audit's headline measures (``tables/audit_summary.csv``), one row per measure, one column per run:
    mean over forget identities (95% identity-bootstrap interval), marked where the run's method trains against
    the attack."""
    summary = _read(results, "tables", "audit_summary.csv")
    runs = _audit_runs(summary, argument)
    cells = summary.set_index(["run", "probe", "setting", "metric"])

    def cell(key) -> str:
        if key not in cells.index:
            return "-"
        row = cells.loc[key]
        value = interval(*row[["mean", "ci_low", "ci_high"]])
        return f"{TRAINED_AGAINST}: {value}" if marked(row) else value

    rows = [[title, *(cell((run, probe, setting, metric)) for run in runs)]
            for probe, setting, metric, title in headline(summary)]
    return markdown_table(["measure", *(f"`{run}`" for run in runs)], rows)


def render_audit_verdicts(results: Path, argument: str | None) -> str:
    """Per audited run, how many forget identities get each verdict (``tables/audit_verdicts.csv``), and which; below
    it the equivalence test's design (margin, samples per arm drawn and needed, power) and the identities whose
    relearning recovery is not averaged, where the table has them."""
    verdicts = _read(results, "tables", "audit_verdicts.csv")
    runs = _runs(argument) or sorted(verdicts["run"].unique())
    _require_runs(verdicts, runs, "tables/audit_verdicts.csv")
    kinds = [kind for kind in VERDICTS if kind in set(verdicts["verdict"])]  # most to least cautious
    rows = []
    for run in runs:
        part = verdicts[verdicts["run"] == run]
        rows.append([f"`{run}`", *(_identities_with(part, kind) for kind in kinds)])
    listed = verdicts[verdicts["run"].isin(runs)]
    notes = [note for note in (design_sentence(listed), small_gap_line(listed)) if note]
    return markdown_table(["run", *kinds], rows) + "".join(f"\n{note}\n" for note in notes)


def _identities_with(part: pd.DataFrame, kind: str) -> str:
    ids = sorted(int(i) for i in part.loc[part["verdict"] == kind, "identity"])
    return f"{len(ids)} ({', '.join(map(str, ids))})" if ids else "0"


def render_audit_comparisons(results: Path, argument: str | None, table: str = "audit_comparisons.csv") -> str:
    """Each audited run minus the reference run (``tables/audit_comparisons.csv``; ``audit_pairs.csv``: each further
    pair, the run minus the run it is paired with), paired by identity: mean difference (95% identity-bootstrap
    interval) and two-sided Wilcoxon p."""
    comparisons = _read(results, "tables", table)
    runs = _runs(argument) or sorted(comparisons["run"].unique())
    _require_runs(comparisons, runs, f"tables/{table}")
    rows = [[f"`{c.run}` - `{c.reference}`", f"{c.probe} {c.setting} {c.metric}", str(c.n),
             interval(c.mean_diff, c.boot_low, c.boot_high), number(c.p_wilcoxon)]
            for c in comparisons[comparisons["run"].isin(runs)].itertuples(index=False)]
    return markdown_table(["runs", "measure", "n", "difference (95% interval)", "p"], rows)


def _against(row, side: str, columns: tuple[str, str, str] = ("mean_diff", "t_low", "t_high")) -> str:
    """'difference (interval), Holm p' of a row against the run named in its ``<side>_run`` column; ``columns``: the
    difference's and its interval's column names after the side's prefix; no p where the row has none."""
    if pd.isna(row[f"{side}_run"]):
        return "-"
    difference = interval(*(row[f"{side}_{column}"] for column in columns))
    p = row[f"{side}_p_holm"]
    return difference if pd.isna(p) else f"{difference}, p {p_value(p)}"


def render_audit_targets(results: Path, argument: str | None) -> str:
    """Per listed run (``tables/audit_targets.csv``): each removal target under the held-out attacks with the run's
    mean (95% identity-bootstrap interval), whether the mean meets it and by how much it misses (marked where the
    run's method trains against the attack: no held-out result), a recovery target's
    mean over the identities the run forgot, and the run minus compare_to and minus the never-trained reference
    (Student-t interval, Holm-corrected Wilcoxon p)."""
    table = _read(results, "tables", "audit_targets.csv")
    runs = _runs(argument) or sorted(table["run"].unique())
    _require_runs(table, runs, "tables/audit_targets.csv")
    rows = []
    for row in (r for run in runs for r in table[table["run"] == run].to_dict("records")):  # grouped by run
        sign = ">=" if row["kind"] == "retain_ratio" else "<="
        status = "met" if row["met"] else f"missed by {number(abs(row['margin']))}"
        status = f"{TRAINED_AGAINST} ({status})" if marked(row) else status
        forgotten = ("-" if pd.isna(row.get("forgotten_n")) else f"{int(row['forgotten_n'])}: " + (
            interval(row["forgotten_mean"], row["forgotten_ci_low"], row["forgotten_ci_high"])
            if row["forgotten_n"] else "none"))
        rows.append([f"`{row['run']}`", row["target"], f"{sign} {number(row['bound'])}", str(row["n"]),
                     interval(row["mean"], row["ci_low"], row["ci_high"]), status, forgotten,
                     *(_against(row, side) for side in ("compare", "reference"))])
    compare, reference = (next((r for r in table[f"{side}_run"].dropna().unique()), "-")
                          for side in ("compare", "reference"))
    return markdown_table(["run", "target", "bound", "identities", "mean (95% interval)", "status",
                           "identities it forgot: mean (95% interval)",
                           f"minus `{compare}` (t interval), Holm p", f"minus `{reference}` (t interval), Holm p"],
                          rows)


def render_audit_worstcase(results: Path, argument: str | None) -> str:
    """The worst-case relearning protocol's headline (``tables/audit_worstcase_summary.csv``) for the listed runs
    (all by default): per run, metric and step count the worst held-out learning rate and regime and its excess over
    the never-trained reference with paired intervals over identities."""
    summary = _read(results, "tables", "audit_worstcase_summary.csv")
    runs = _runs(argument) or sorted(summary["run"].unique())
    _require_runs(summary, runs, "tables/audit_worstcase_summary.csv")
    return worstcase_markdown(summary[summary["run"].isin(runs)], heading=False)


EXTERNAL_ROWS = {"ism_forget": "forget ISM", "acc_forget": "forget samples identified as the person (nearest centroid)",
                 "ism_retain": "retain-validation ISM",
                 "acc_retain": "retain samples identified as their identity (nearest centroid)",
                 "kd_retain": "KD to the real retain-validation images, retain samples",
                 "quality_forget": "quality, forget samples"}


def _evaluation_metrics(folder: Path) -> pd.DataFrame:
    """Every identity's metrics.json under an evaluation folder (one subfolder per forget identity)."""
    files = sorted(folder.glob("*/metrics.json"))
    if not files:
        raise MissingResults(f"{folder}/*/metrics.json")
    return pd.DataFrame([read_json(_read_file(f)) for f in files]).set_index("forget_identity")


def render_external_evaluation(results: Path, argument: str | None) -> str:
    """An external model (``argument``, an ``evaluation.external`` name) against the original model on the identities
    of its evaluation (``evaluation/external/<name>/`` and ``evaluation/before/``), paired by identity: means with
    95% identity-bootstrap intervals, the mean difference with its Student-t interval and two-sided Wilcoxon p."""
    name = argument or "retrain"
    external = _evaluation_metrics(results / "evaluation" / "external" / name)
    before = _evaluation_metrics(results / "evaluation" / "before")
    missing = sorted(set(external.index) - set(before.index))
    if missing:
        raise MissingResults(f"the original model's evaluation of identities {missing}")
    before = before.loc[external.index]
    rows = []
    for metric, title in EXTERNAL_ROWS.items():
        a, b = before[metric].astype(float), external[metric].astype(float)
        d = mean_difference(b - a, seed=0)
        rows.append([title, interval(*bootstrap_mean(a, seed=0)), interval(*bootstrap_mean(b, seed=0)),
                     interval(d["mean_diff"], d["t_low"], d["t_high"]), p_value(d["p_wilcoxon"])])
    n = len(external)
    return (f"`{name}` against the original model on the same {n} forget identit{'y' if n == 1 else 'ies'}, the same "
            "conditions and initial noise; mean (95% identity-bootstrap interval), the paired difference with its "
            "Student-t interval and two-sided Wilcoxon p.\n\n"
            + markdown_table(["", "original", f"`{name}`", "difference", "p"], rows))


def render_file_table(*parts: str) -> Callable[[Path, str | None], str]:
    """Every row and column of one table the workflow wrote (``parts`` under the results folder)."""
    def render(results: Path, argument: str | None) -> str:
        table = _read(results, *parts)
        if argument and "run" in table.columns:
            _require_runs(table, _runs(argument), "/".join(parts))
            table = table[table["run"].isin(_runs(argument))]
        return markdown_table(list(table.columns), [[number(v) for v in row] for row in table.itertuples(index=False)])
    render.__doc__ = f"Every row and column of results/{'/'.join(parts)}."
    return render


def render_many_jobs(name: str) -> Callable[[Path, str | None], str]:
    """One line per job of results/tables/``name`` (the many stage's per-identity rows): its identities' forget ISM
    after (before) and FA after, in the order they were forgotten, the pooled retain ISM against the original
    model's on the same samples, the retain samples' face-detection rate, pooled SRK and the seconds of every job it
    took."""
    def render(results: Path, argument: str | None) -> str:
        table = _read(results, "tables", name, columns=["detection_rate_retain", "detection_rate_retain_before"])
        rows = []
        for (strategy, order, size), job in table.groupby(["strategy", "order", "size"], sort=False):
            job = job.sort_values("forgotten_at")
            first = job.iloc[0]
            rows.append([strategy, number(order), number(size),
                         ", ".join(f"{i}: {number(a)} ({number(b)})" for i, a, b in
                                   zip(job["identity"], job["ism_forget"], job["ism_forget_before"])),
                         ", ".join(number(v) for v in job["fa_forget"]), number(job["fa_forget"].max()),
                         f"{number(first['ism_retain'])} / {number(first['ism_retain_before'])} "
                         f"({first['ism_retain'] / first['ism_retain_before']:.2f} x)",
                         f"{first['detection_rate_retain']:.0%} ({first['detection_rate_retain_before']:.0%})",
                         f"{number(first['srk_pooled'])} ({number(first['srk_pooled_before'])})",
                         f"{first['seconds_total']:,.0f}"])
        return markdown_table(["strategy", "order", "N or step", "forget ISM after (before), per identity",
                               "FA after, per identity", "worst FA", "retain ISM after / before",
                               "retain faces detected after (before)", "pooled SRK after (before)",
                               _seconds_header(table)], rows)
    render.__doc__ = f"One line per job of results/tables/{name}."
    return render


def _seconds_header(table: pd.DataFrame) -> str:
    """The seconds column's header, with what its jobs' times measure where the table says it."""
    if "seconds_measure" not in table:
        return "seconds, every job it took"
    return f"seconds, every job it took ({'; '.join(sorted(set(table['seconds_measure'].dropna())))})"


def render_many_strategies(results: Path, argument: str | None) -> str:
    """One line per strategy of results/tables/many_strategies.csv at its largest size: each metric's mean over the
    identity orders with its Student-t 95% interval, and per target how many orders meet it (FA and retain ratio)."""
    table = _read(results, "tables", "many_strategies.csv", columns=["detection_rate_retain"])
    rows = []
    for row in table.to_dict("records"):
        def cell(metric):
            return interval(row[metric], row[f"{metric}_low"], row[f"{metric}_high"])
        rows.append([row["strategy"], number(row["size"]), number(row["orders"]), cell("fa_max"),
                     cell("ism_forget_mean"), cell("retain_ratio"), cell("detection_rate_retain"), cell("srk_pooled"),
                     interval(*(None if pd.isna(row[f"seconds_total{end}"]) else f"{row[f'seconds_total{end}']:,.0f}"
                                for end in ("", "_low", "_high"))),  # whole seconds with thousands separators
                     *(f"{row[f'orders_meeting_{target}_target']} of {row['orders']}" for target in RETAIN_TARGETS)])
    return markdown_table(["strategy", "N", "orders", "worst FA", "mean forget ISM", "retain ISM / original",
                           "retain faces detected", "pooled SRK", "seconds, every job it took",
                           *(f"orders with every FA <= {FA_TARGET} and retain >= {bar} x" for bar in
                             RETAIN_TARGETS.values())], rows)


def _measured(row: dict) -> str:
    """A paired measure's name and, for a time, what it measures (``aggregate.job_seconds_measure``)."""
    measured = row.get("measured")
    return f"{row['measure']} ({measured})" if isinstance(measured, str) and measured else row["measure"]


def render_audit_evaluation(results: Path, argument: str | None) -> str:
    """Per listed run (``tables/audit_evaluation/comparisons.csv``): forget and retain ISM, pooled SRK, KD and
    quality changes and unlearning time per identity (95% identity-bootstrap interval), and the run minus compare_to
    and minus the never-trained reference (Student-t interval and Holm-corrected Wilcoxon p; SRK: paired bootstrap
    interval of the pooled values)."""
    table = _read(results, "tables", "audit_evaluation", "comparisons.csv")
    runs = _runs(argument) or sorted(table["run"].unique())
    _require_runs(table, runs, "tables/audit_evaluation/comparisons.csv")
    rows = [[f"`{row['run']}`", _measured(row), str(row["n"]), interval(row["mean"], row["ci_low"], row["ci_high"]),
             *(_against(row, side, ("diff", "low", "high")) for side in ("compare", "reference"))]
            for run in runs for row in table[table["run"] == run].to_dict("records")]
    compare, reference = (next((r for r in table[f"{side}_run"].dropna().unique()), "-")
                          for side in ("compare", "reference"))
    return markdown_table(["run", "measure", "identities", "mean (95% interval)",
                           f"minus `{compare}` (interval), Holm p", f"minus `{reference}` (interval), Holm p"], rows)


RENDERERS: dict[str, Callable[[Path, str | None], str]] = {
    "headline": render_headline,
    "study": render_study_table,
    "claims": render_claims,
    "tuning": render_tuning,
    "audit.probes": render_audit_probes,
    "audit.verdicts": render_audit_verdicts,
    "audit.comparisons": render_audit_comparisons,
    "audit.pairs": functools.partial(render_audit_comparisons, table="audit_pairs.csv"),
    "audit.targets": render_audit_targets,
    "audit.worstcase": render_audit_worstcase,
    "audit.evaluation": render_audit_evaluation,
    "evaluation.external": render_external_evaluation,
    "controllable.front": render_file_table("tables", "pareto_summary.csv"),
    "rebuild.curve": render_file_table("tables", "rebuild_curve.csv"),
    "rebuild.targets": render_file_table("tables", "rebuild_targets.csv"),
    "many.joint": render_many_jobs("many_joint.csv"),
    "many.sequential": render_many_jobs("many_sequential.csv"),
    "many.merge": render_many_jobs("many_merge.csv"),
    "many.strategies": render_many_strategies,
    "many.comparisons": render_file_table("tables", "many_comparisons.csv"),
    "recognizer.random_subset": render_file_table("recognizer", "tables", "random_subset.csv"),
    "recognizer.classwise": render_file_table("recognizer", "tables", "classwise.csv"),
}


# ----- the configuration reference, from the schema -----------------------------------------------------------------

@dataclass
class SettingRow:
    key: str
    type: str
    default: str
    meaning: str


def _resolve(node: dict, schema: dict) -> dict:
    """``node`` with a local ``$ref`` merged in (the node's own keys win)."""
    if "$ref" not in node:
        return node
    target = schema
    for part in node["$ref"].lstrip("#/").split("/"):
        target = target[part]
    return {**_resolve(target, schema), **{k: v for k, v in node.items() if k != "$ref"}}


def _type(node: dict) -> str:
    if "enum" in node:
        return "one of " + ", ".join(f"`{v}`" for v in node["enum"])
    kinds = node.get("type", "any")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return " or ".join(kinds)


def _default(node: dict) -> str:
    if "default" not in node:
        return "(none: absent)" if "properties" not in node else ""
    value = node["default"]
    if isinstance(value, dict) and not value and "properties" in node:
        return ""  # the keys below carry the defaults
    return f"`{json.dumps(value)}`"


def setting_rows(schema: dict | None = None) -> list[SettingRow]:
    """Every key of the schema, depth first: nested objects as ``a.b``, maps of named entries as ``a.<name>.b``,
    lists of objects as ``a[].b``."""
    schema = schema or load_schema()
    rows: list[SettingRow] = []

    def walk(node: dict, key: str) -> None:
        node = _resolve(node, schema)
        if key:
            rows.append(SettingRow(key, _type(node), _default(node), " ".join(node.get("description", "").split())))
        for name, child in node.get("properties", {}).items():
            walk(child, f"{key}.{name}" if key else name)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and ("properties" in extra or "$ref" in extra):
            walk(extra, f"{key}.<name>")
        items = node.get("items")
        if isinstance(items, dict) and "properties" in _resolve(items, schema):
            walk(items, f"{key}[]")

    walk(schema, "")
    return rows


RUN_SETTINGS = "unlearning.defaults."


def setting_readers() -> dict[str, list[str]]:
    """Run setting -> what reads it, as the schema declares it (``x-reads`` of ``unlearning.defaults``,
    ``config.run_setting_reads``): every run's job, every training run (the run loop and the AdamW base step), the
    workflow's rules, or named methods and optimisers (an entry's ``extends`` included)."""
    from .config import run_setting_names, run_setting_reads

    reads = run_setting_reads()
    readers: dict[str, list[str]] = {name: [] for name in run_setting_names()}
    for group, reader in (("job", "every run"), ("training", "every training run (run loop, AdamW step)"),
                          ("workflow", "the workflow's rules")):
        for setting in reads[group]:
            readers[setting].append(reader)
    for kind in ("methods", "optimisers"):
        entries = reads[kind]

        def entry_reads(name: str) -> set[str]:
            entry = entries[name]
            return set(entry.get("reads", ())) | (entry_reads(entry["extends"]) if "extends" in entry else set())

        for name in entries:
            for setting in sorted(entry_reads(name)):
                readers[setting].append(f"{kind[:-1]} `{name}`")
    return readers


def configuration_sections() -> dict[str, list[SettingRow]]:
    """The schema's top-level sections, in its order, each with its rows."""
    sections: dict[str, list[SettingRow]] = {}
    for row in setting_rows():
        sections.setdefault(row.key.split(".")[0].split("[")[0], []).append(row)
    return sections


def render_configuration(results: Path | None = None, argument: str | None = None) -> str:
    """The configuration reference: per top-level section a table of every key with its type, default and meaning;
    the run settings (``unlearning.defaults``) also say which methods and optimisers read them. ``argument``: the
    sections to show, comma-separated, in that order, or ``except=`` and the sections to leave out (None: all), so
    that the reference can span several pages and a new section lands on the page that takes the rest."""
    readers = setting_readers()
    sections = configuration_sections()
    if argument:
        left_out = argument.startswith("except=")
        named = argument.removeprefix("except=").split(",")
        unknown = [name for name in named if name not in sections]
        if unknown:
            raise ValueError(f"generated block configuration:{argument}: {', '.join(unknown)} is no top-level "
                             f"section of the schema; name some of {', '.join(sections)}")
        shown = [name for name in sections if name not in named] if left_out else named
        sections = {name: sections[name] for name in shown}
    out = []
    for section, rows in sections.items():
        out.append(f"### `{section}`\n")
        runs = any(r.key.startswith(RUN_SETTINGS) for r in rows)
        header = ["key", "type", "default", "meaning", *(["read by"] if runs else [])]
        body = []
        for r in rows:
            cells = [f"`{r.key}`", r.type, r.default, r.meaning]
            if runs:
                setting = r.key[len(RUN_SETTINGS):] if r.key.startswith(RUN_SETTINGS) else None
                cells.append(", ".join(readers.get(setting, [])) if setting else "")
            body.append(cells)
        out.append(markdown_table(header, body))
    return "\n".join(out)


RENDERERS["configuration"] = render_configuration


# ----- pages ---------------------------------------------------------------------------------------------------------

def pages(root: Path) -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [p for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))] if p.is_file()]


def regenerate_text(text: str, results: Path | Callable[[str], Path],
                    inputs: dict[str, list[Path]] | None = None) -> tuple[str, dict[str, str]]:
    """``text`` with every generated block rendered from ``results`` (a folder, or block label -> its folder); block ->
    'written' or why it was kept; ``inputs`` collects each written block's label -> the result files it read."""
    global _reading
    status: dict[str, str] = {}

    def replace(match: re.Match) -> str:
        global _reading
        name, argument = match["name"], match["argument"]
        label = f"{name}:{argument}" if argument else name
        if name not in RENDERERS:
            raise ValueError(f"generated block {label!r}: no renderer of that name; use one of {', '.join(RENDERERS)}")
        _reading = []
        try:
            body = RENDERERS[name](results(label) if callable(results) else results, argument)
        except MissingResults as missing:
            status[label] = f"kept (missing: {missing})"
            return match[0]
        finally:
            read, _reading = _reading, None
        status[label] = "written"
        if inputs is not None:
            inputs[label] = read
        return match["open"] + body + match["close"]

    return BLOCK.sub(replace, text), status


def shipped_folder(root: Path, page: Path, label: str) -> Path:
    """Where the result files of block ``label`` of ``page`` are kept: docs/results/data/<page>/<block>/."""
    name = "-".join(part for part in page.relative_to(root).with_suffix("").parts if part != "docs")
    return root / SHIPPED / name / re.sub(r"[^\w.-]+", "_", label)


def regenerate_from_shipped(root: Path, page: Path) -> tuple[str, dict[str, str]]:
    """``page``'s text with every generated block rendered again from the files it was last rendered from."""
    return regenerate_text(page.read_text(), lambda label: shipped_folder(root, page, label))


def _ship(root: Path, page: Path, results: Path, inputs: dict[str, list[Path]]) -> None:
    """Keep each written block's result files (a copy, paths as under ``results``) in its shipped folder."""
    for label, files in inputs.items():
        folder = shipped_folder(root, page, label)
        if folder.exists():
            shutil.rmtree(folder)
        for file in files:
            target = folder / file.relative_to(results)
            target.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(target) as tmp:
                shutil.copyfile(file, tmp)


def regenerate(root: Path, results: Path) -> dict[str, dict[str, str]]:
    """Rewrite the generated blocks of every page under ``root`` from ``results``, keeping the result files of each
    written block under docs/results/data/ (``shipped_folder``); page -> block -> status."""
    report = {}
    for page in pages(root):
        text = page.read_text()
        inputs: dict[str, list[Path]] = {}
        new, status = regenerate_text(text, results, inputs)
        if new != text:
            with atomic_path(page) as tmp:
                tmp.write_text(new)
        _ship(root, page, results, inputs)
        if status:
            report[str(page.relative_to(root))] = status
    return report
