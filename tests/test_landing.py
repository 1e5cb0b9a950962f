"""The report's landing page: the compact headline (evaluation and audit), one forget grid per run, the audit's
verdicts with the reason and the deciding command; valid reStructuredText for Snakemake's report."""

from __future__ import annotations

import base64

import numpy as np
import pandas as pd
from PIL import Image

from idunlearn.audit.verdicts import DECIDE_COMMAND, NO_ATTACK, UNDETERMINED
from idunlearn.landing import embedded_image, headline_rows, interval_cell, landing_rst


def long_summary() -> pd.DataFrame:
    """aggregate's summary_long for runs b and a (config order b, a): value = a per-run offset + a per-metric one."""
    records = []
    for offset, run in ((0.0, "b"), (0.5, "a")):
        for metric, base in (("ism_forget", 0.1), ("ism_retain", 0.2), ("srk", 40.0), ("detection_rate_retain", 1.0),
                             ("kd_retain", 0.0), ("quality_retain", 0.5)):
            for phase, shift in (("before", 0.3), ("after", offset), ("delta", offset - 0.3)):
                value = base + shift
                records.append({"run": run, "metric": metric, "phase": phase, "mean": value, "ci_low": value - 0.01,
                                "ci_high": value + 0.01, "n": 2})
    return pd.DataFrame(records)


def audit_summary() -> pd.DataFrame:
    rows = [(run, "evaluation", "forget", "fa", fa) for run, fa in (("original", 0.9), ("b", 0.05))]
    rows += [(run, "leak", f"k={k}", "leak", leak) for run, leak in (("original", 1.0), ("b", 0.25)) for k in (1, 8)]
    return pd.DataFrame([{"run": r, "probe": p, "setting": s, "metric": m, "mean": v, "ci_low": v - 0.1,
                          "ci_high": v + 0.1, "n_identities": 2} for r, p, s, m, v in rows])


def test_headline_row_per_run_after_the_original_with_audit_columns_where_audited():
    header, original, b, a = headline_rows(long_summary(), audit_summary(), ["b", "a"])
    assert header == ["run", "forget ISM", "retain ISM", "SRK", "FA", "Leak@8"]  # the largest k of the audit
    assert original[:2] == ["original", interval_cell(0.4, 0.39, 0.41)]  # the before phase of the first run
    assert original[4:] == [interval_cell(0.9, 0.8, 1.0), interval_cell(1.0, 0.9, 1.1)]
    assert b[1] == interval_cell(0.1, 0.09, 0.11) and b[5] == interval_cell(0.25, 0.15, 0.35)
    assert a[0] == "a" and a[1] == interval_cell(0.6, 0.59, 0.61)
    assert a[4] == a[5] == interval_cell(np.nan, np.nan, np.nan)  # run a was not audited
    assert len(headline_rows(long_summary(), None, ["b", "a"])[0]) == 4  # no audit: no audit columns


def test_interval_cells():
    assert interval_cell(0.123, 0.1, 0.15) == "0.12 (0.10\u20130.15)"
    assert interval_cell(88.96, 80.0, 95.5, "srk") == "89 (80\u201395.5)"
    assert interval_cell(0.5, np.nan, np.nan) == "0.50"


def test_landing_page_is_valid_rst_with_a_grid_per_run_and_the_verdicts_reason(tmp_path):
    from docutils.core import publish_parts

    grids = {}
    for seed, run in enumerate(("b", "a")):  # noise: PNGs whose data URIs exceed docutils' 10,000-character lines
        grids[run] = tmp_path / f"{run}.png"
        Image.fromarray(np.random.default_rng(seed).integers(0, 255, (100, 120), np.uint8)).save(grids[run])
        assert grids[run].stat().st_size > 10_000
    verdicts = pd.DataFrame({"run": ["b", "b"], "identity": [1, 2], "verdict": [UNDETERMINED] * 2,
                             "reason": [NO_ATTACK] * 2})
    text = landing_rst(long_summary(), grids, audit_summary(), verdicts, [1, 2])
    assert text.startswith("Run b made the generator forget 2 identities (1, 2)")
    assert text.index(embedded_image(grids["b"])) < text.index(embedded_image(grids["a"]))  # config order
    assert f"undetermined 2: {NO_ATTACK}" in text and f"``{DECIDE_COMMAND}``" in text
    html = publish_parts(text, writer="html", settings_overrides={"report_level": 2})["html_body"]
    assert "system-message" not in html and html.count('src="data:image/png;base64,') == 2
    for grid in grids.values():  # each picture whole, its URI without the wrapping's whitespace
        assert f'src="data:image/png;base64,{base64.b64encode(grid.read_bytes()).decode()}"' in html
    assert html.count("<tr>") == 4  # header, original, b, a
