"""The HTML report's landing page (``results/tables/landing.rst``, included by ``workflow/report/workflow.rst``): what
was forgotten and what it cost in one compact table that fits beside the workflow graph, one forget grid per run,
and the audit's verdicts with the reason where they are undetermined and the command that decides them."""

from __future__ import annotations

import base64
import math
import textwrap
from pathlib import Path

import pandas as pd

from .audit.tables import ORIGINAL
from .audit.verdicts import decide_note, run_verdict_lines
from .evaluation.aggregate import headline_sentences

# headline columns from the evaluation's tidy summary (aggregate's summary_long): metric -> column title
EVALUATION_COLUMNS = {"ism_forget": "forget ISM", "ism_retain": "retain ISM", "srk": "SRK"}


def _number(value: float, metric: str) -> str:
    return f"{value:.3g}" if metric == "srk" else f"{value:.2f}"  # SRK runs from about 1 to 100


def interval_cell(mean: float, low: float, high: float, metric: str = "") -> str:
    """``mean (low-high)``; the mean alone without an interval (one identity); a dash where nothing is measured."""
    if math.isnan(mean):
        return "\u2013"
    if math.isnan(low):
        return _number(mean, metric)
    return f"{_number(mean, metric)} ({_number(low, metric)}\u2013{_number(high, metric)})"


def largest_leak_k(audit: pd.DataFrame | None) -> int | None:
    """The largest k of the audit's Leak@k rows (None: no audit, or no leak probe)."""
    if audit is None:
        return None
    ks = [int(s[2:]) for s in audit.loc[audit["probe"] == "leak", "setting"] if s.startswith("k=")]
    return max(ks) if ks else None


def headline_rows(long: pd.DataFrame, audit: pd.DataFrame | None, runs: list[str]) -> list[list[str]]:
    """Header and rows: the original model (the before phase of the first of ``runs``), then each run after unlearning;
    forget and retain ISM and the pooled SRK from the evaluation's summary, the evaluation samples' FA and the
    largest Leak@k from the audit's summary where the audit ran (its columns are left out when it did not)."""
    evaluation = long.set_index(["run", "phase", "metric"])
    k = largest_leak_k(audit)
    audit_keys = {} if audit is None else {("evaluation", "forget", "fa"): "FA"}
    if k is not None:
        audit_keys[("leak", f"k={k}", "leak")] = f"Leak@{k}"
    indexed = None if audit is None else audit.set_index(["run", "probe", "setting", "metric"])
    rows = [["run", *EVALUATION_COLUMNS.values(), *audit_keys.values()]]
    for label, run, phase, audited in [(ORIGINAL, runs[0], "before", ORIGINAL),
                                       *[(run, run, "after", run) for run in runs]]:
        cells = [interval_cell(*evaluation.loc[(run, phase, metric), ["mean", "ci_low", "ci_high"]], metric)
                 for metric in EVALUATION_COLUMNS]
        for key in audit_keys:
            found = (audited, *key) in indexed.index
            cells.append(interval_cell(*indexed.loc[(audited, *key), ["mean", "ci_low", "ci_high"]]) if found
                         else interval_cell(math.nan, math.nan, math.nan))
        rows.append([label, *cells])
    return rows


def embedded_image(path: Path, width: int = 76) -> str:
    """An image directive whose target is the PNG itself as a data URI: the page carries its pictures (the report's
    own ``embeddedimage`` directive leaves the file path in the page, which the standalone report.html cannot reach).
    The URI is wrapped at ``width`` characters (docutils drops lines over 10,000 characters; it removes the
    whitespace from a URI that spans lines)."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return "\n   ".join([".. image:: data:image/png;base64,", *textwrap.wrap(data, width)])


def _csv_table(rows: list[list[str]]) -> list[str]:
    return ["   " + ", ".join(f'"{cell}"' for cell in row) for row in rows]


def landing_rst(long: pd.DataFrame, grids: dict[str, Path], audit: pd.DataFrame | None,
                verdicts: pd.DataFrame | None, identities: list[int]) -> str:
    """The landing page's reStructuredText: two sentences on the first run of ``grids`` (run -> the PNG of its forget
    grid, in the config's order; ``identities``: that run's forget identities), the headline table, each run's
    forget grid and, when the audit ran, its verdicts."""
    runs = list(grids)
    n = long[long["phase"] == "after"].groupby("run")["n"].max()
    lines = [headline_sentences(long, runs[0], identities), "",
             ".. csv-table:: What was forgotten, and at what cost", "   :header-rows: 1", "",
             *_csv_table(headline_rows(long, audit, runs)), "",
             f"Mean (95% interval) over each run's forget identities ({', '.join(f'{r}: {n[r]}' for r in runs)});"
             " SRK pooled over their samples (PIU eqs. 8-10). Forget ISM and FA: lower is forgetting; retain ISM: "
             "higher is less collateral." + ("" if audit is not None else " FA and Leak@k come from the forgetting "
                                             "audit: ``snakemake audit``."), ""]
    for run, grid in grids.items():
        lines += [f"**{run}**: forget samples of one identity before (original), the anchor it is steered to, and "
                  "after unlearning (the same conditions and noise); cosine to the identity under each.", "",
                  embedded_image(grid), f"   :alt: forget grid of {run}", "   :width: 100%", ""]
    if verdicts is not None:
        lines += ["**Forgetting audit verdicts** (per forget identity; tables/audit_verdicts.csv)", "",
                  *run_verdict_lines(verdicts), "", *decide_note(verdicts, code=lambda text: f"``{text}``")]
    return "\n".join(lines).rstrip() + "\n"
