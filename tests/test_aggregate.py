import math
import runpy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from idunlearn.evaluation.aggregate import before_after, mean_ci, summarise
from idunlearn.evaluation.metrics import METRIC_KEYS
from idunlearn.io import write_json


def test_mean_ci_matches_hand_computed_t_interval():
    # mean 2.5; sample sd sqrt(5/3) = 1.290994; t_{0.975, 3} = 3.182446; half width 3.182446 * 1.290994 / 2
    mean, half = mean_ci([1, 2, 3, 4])
    assert mean == pytest.approx(2.5)
    assert half == pytest.approx(3.182446 * 1.290994 / 2.0, rel=1e-6)
    assert half == pytest.approx(2.05426, abs=1e-5)


def test_mean_ci_other_confidence_and_small_samples():
    # t_{0.95, 3} = 2.353363
    assert mean_ci([1, 2, 3, 4], confidence=0.90)[1] == pytest.approx(2.353363 * 1.290994 / 2.0, rel=1e-6)
    mean, half = mean_ci([7.0])
    assert mean == 7.0 and math.isnan(half)
    mean, half = mean_ci([])
    assert math.isnan(mean) and math.isnan(half)


def test_mean_ci_skips_nan():
    assert mean_ci([1, np.nan, 2, 3, 4]) == pytest.approx(mean_ci([1, 2, 3, 4]))
    mean, half = mean_ci([np.nan, 5.0])
    assert mean == 5.0 and math.isnan(half)


def test_summarise_groups_sorted_with_counts_and_nan_skipped():
    metrics = pd.DataFrame({
        "method": ["piu", "base", "piu", "piu", "piu", "base"],
        "set": ["forget"] * 6,
        "ism": [1.0, 0.5, 2.0, 3.0, 4.0, 0.7],
        "kd": [0.1, np.nan, 0.3, np.nan, np.nan, 0.2],
    })
    out = summarise(metrics, ["method", "set"], ["ism", "kd"])
    assert list(out.columns) == ["method", "set", "n", "ism_mean", "ism_ci95", "ism_n", "kd_mean", "kd_ci95", "kd_n"]
    assert list(out["method"]) == ["base", "piu"]  # sorted, whatever the input order
    piu = out.set_index("method").loc["piu"]
    assert piu["n"] == 4 and piu["ism_n"] == 4 and piu["kd_n"] == 2
    assert piu["ism_mean"] == pytest.approx(2.5) and piu["ism_ci95"] == pytest.approx(2.05426, abs=1e-5)
    assert (piu["kd_mean"], piu["kd_ci95"]) == pytest.approx(mean_ci([0.1, 0.3]))
    base = out.set_index("method").loc["base"]
    assert base["kd_n"] == 1 and base["kd_mean"] == pytest.approx(0.2) and math.isnan(base["kd_ci95"])


def test_summarise_single_and_no_group_columns():
    metrics = pd.DataFrame({"method": ["b", "a", "b"], "x": [1.0, 2.0, 3.0]})
    by_method = summarise(metrics, ["method"], ["x"])
    assert list(by_method["method"]) == ["a", "b"] and list(by_method["x_mean"]) == [2.0, 2.0]
    overall = summarise(metrics, [], ["x"])
    assert len(overall) == 1 and overall.loc[0, "n"] == 3 and overall.loc[0, "x_mean"] == pytest.approx(2.0)


def test_before_after_row():
    row = before_after({"ism": 0.8, "kd": 0.01, "other": 1}, {"ism": 0.3, "kd": 0.05}, ["ism", "kd"])
    assert row == pytest.approx({"ism_before": 0.8, "ism_after": 0.3, "ism_delta": -0.5,
                                 "kd_before": 0.01, "kd_after": 0.05, "kd_delta": 0.04})
    with pytest.raises(KeyError):
        before_after({"ism": 0.8}, {}, ["ism"])


# ----- the aggregate stage's script on hand-made evaluation folders ------------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def _samples(rng, identity: int, forget_hits: int, retain_hits: int, n: int = 10) -> pd.DataFrame:
    """n forget samples of ``identity`` and n retain samples (identities 50-54); ``*_hits`` of them recognised."""
    target = np.array([identity] * n + [50 + i % 5 for i in range(n)])
    hit = np.r_[np.arange(n) < forget_hits, np.arange(n) < retain_hits]
    rng.shuffle(hit[:n])
    return pd.DataFrame({"sample_id": [f"s{i}" for i in range(2 * n)], "kind": ["forget"] * n + ["retain"] * n,
                         "target_identity": target, "predicted_identity": np.where(hit, target, -1),
                         "own_cosine": rng.uniform(0, 1, 2 * n), "detected": True})


def _metrics_json(identity: int, rng) -> dict:
    return {"forget_identity": identity, "kd_features": "recognizer embedding", "quality_measure": "proxy",
            **{key: float(rng.uniform(0, 1)) for key in METRIC_KEYS}}


@pytest.fixture
def aggregated(tmp_path):
    """Runs workflow/scripts/aggregate.py as Snakemake would, on two runs x three forget identities (run b: two)."""
    rng = np.random.default_rng(0)
    ev, tables = tmp_path / "evaluation", tmp_path / "tables"
    hits = {("before", 1): (9, 8), ("before", 2): (10, 9), ("before", 3): (7, 10),
            ("a", 1): (0, 8), ("a", 2): (3, 6), ("a", 3): (1, 9), ("b", 1): (5, 5), ("b", 2): (0, 2)}
    inputs = {"before": [], "before_samples": [], "after": [], "after_samples": [], "timings": [], "external": [],
              "external_samples": []}
    for (run, identity), (f_hits, r_hits) in hits.items():
        folder = ev / "before" / str(identity) if run == "before" else ev / "after" / run / str(identity)
        folder.mkdir(parents=True)
        _samples(rng, identity, f_hits, r_hits).to_parquet(folder / "samples.parquet")
        write_json(_metrics_json(identity, rng), folder / "metrics.json")
        key = "before" if run == "before" else "after"
        inputs[key].append(str(folder / "metrics.json"))
        inputs[f"{key}_samples"].append(str(folder / "samples.parquet"))
        if run != "before":
            # run a's timings carry every step's seconds; run b's predate that field and give their session's
            seconds = {"seconds_total": 10.0 * identity} if run == "a" else {"seconds_this_session": 7.0 * identity}
            write_json({"run_name": run, "run": {"steps": 2 if run == "a" else 3}, "anchor": {"anchor_identity": 7},
                        "steps": 2, "trainable_parameters": 3, "seconds_per_step": 0.5, **seconds},
                       folder / "timings.json")
            inputs["timings"].append(str(folder / "timings.json"))
    inputs["after_samples"].reverse()  # paired with the metrics by folder, not by position
    audit_md = tmp_path / "audit_summary.md"  # the audit's headline, as audit_tables writes it
    audit_md.write_text("# Forgetting audit\n\n| run | identities | FA (evaluation) |\n|---|---|---|\n| original | 3 | 0.94 |\n")
    inputs["audit"] = [str(audit_md)]
    selections = tmp_path / "selections.parquet"
    pd.DataFrame({"forget_identity": [1, 2, 3], "n_forget_train": [6, 6, 6]}).to_parquet(selections)
    names = ["metrics", "metrics_csv", "counts", "summary", "summary_csv", "summary_long", "summary_md", "costs"]
    files = ["metrics.parquet", "metrics.csv", "sample_counts.parquet", "summary.parquet", "summary.csv",
             "summary_long.csv", "summary.md", "costs.csv"]
    smk = SimpleNamespace(input=SimpleNamespace(selections=str(selections), **inputs),
                          output=SimpleNamespace(**{n: str(tables / f) for n, f in zip(names, files)}),
                          params=SimpleNamespace(runs={"a": {"steps": 2}, "b": {"steps": 3}}, seed=42, external={}),
                          log=[str(tmp_path / "aggregate.log")])
    runpy.run_path(str(REPO / "workflow" / "scripts" / "aggregate.py"), init_globals={"snakemake": smk})
    return tmp_path, hits


def test_summary_md_carries_the_audit_headline_after_the_metrics(aggregated):
    text = (aggregated[0] / "tables" / "summary.md").read_text()
    assert text.startswith("# What was forgotten") and text.count("\n# ") == 0
    assert text.index("| run | phase |") < text.index("## Forgetting audit") < text.index("| original | 3 | 0.94 |")


def test_costs_give_each_job_its_own_seconds_not_steps_times_the_median_step(aggregated):
    costs = pd.read_csv(aggregated[0] / "tables" / "costs.csv").set_index(["run", "forget_identity"])
    assert costs.loc[("a", 2), "unlearning_seconds"] == pytest.approx(20.0)  # seconds_total, not 2 x 0.5
    assert costs.loc[("b", 2), "unlearning_seconds"] == pytest.approx(14.0)  # older timings: the session's time


def test_summary_long_pooled_srk_recomputed_from_the_per_sample_files(aggregated):
    tmp_path, hits = aggregated
    long = pd.read_csv(tmp_path / "tables" / "summary_long.csv")
    assert list(long.columns) == ["run", "metric", "phase", "mean", "ci_low", "ci_high", "n"]
    srk_rows = long[long["metric"] == "srk"].set_index(["run", "phase"])
    for run, identities in (("a", [1, 2, 3]), ("b", [1, 2])):
        for phase in ("before", "after"):
            folders = [tmp_path / "evaluation" / ("before" if phase == "before" else f"after/{run}") / str(i)
                       for i in identities]
            pooled = pd.concat([pd.read_parquet(f / "samples.parquet") for f in folders])
            correct = pooled["predicted_identity"] == pooled["target_identity"]
            acc_u, acc_r = correct[pooled["kind"] == "forget"].mean(), correct[pooled["kind"] == "retain"].mean()
            row = srk_rows.loc[(run, phase)]
            assert row["mean"] == pytest.approx(acc_r / (acc_u + 0.01))  # PIU eq. 10 on pooled eqs. 8-9
            assert row["n"] == len(identities) and row["ci_low"] <= row["mean"] <= row["ci_high"]
    # by hand, run a after: Acc_U = (0 + 3 + 1) / 30, Acc_R = (8 + 6 + 9) / 30
    assert srk_rows.loc[("a", "after"), "mean"] == pytest.approx((23 / 30) / (4 / 30 + 0.01))
    assert srk_rows.loc[("a", "delta"), "mean"] == pytest.approx(
        (23 / 30) / (4 / 30 + 0.01) - (27 / 30) / (26 / 30 + 0.01))
    # the per-identity SRK is its own metric, a mean with an identity-bootstrap interval inside the values' range
    metrics = pd.read_csv(tmp_path / "tables" / "metrics.csv")
    ident = long[(long["metric"] == "srk_identity") & (long["phase"] == "after")].set_index("run")
    values = metrics.loc[metrics["run"] == "a", "srk_identity_after"]
    assert ident.loc["a", "mean"] == pytest.approx(values.mean())
    low, high = ident.loc["a", "ci_low"], ident.loc["a", "ci_high"]
    assert low < values.mean() < high and values.min() - 1e-12 <= low and high <= values.max() + 1e-12
    assert "srk_after" not in metrics.columns and "srk_identity_after" in metrics.columns
    assert len(pd.read_csv(tmp_path / "tables" / "summary.csv")) == 2  # summary.csv is kept


def test_summary_md_and_the_report_landing_page_show_the_headline(aggregated):
    tmp_path, _ = aggregated
    md = (tmp_path / "tables" / "summary.md").read_text()
    assert "| run | phase | identities | forget ISM | retain ISM | SRK (pooled) |" in md
    assert "Run a made the generator forget 3 identities (1, 2, 3)" in md
    assert md.count("\n| a | ") == 2 and md.count("\n| b | ") == 2  # before and after per run
    # the landing page as the workflow builds it: rule landing_page on aggregate's summary_long and a grid per run
    # (no audit), then rendered as `snakemake --report` does: jinja2, then docutils, from the working directory
    from docutils.core import publish_parts
    from jinja2 import Environment
    from PIL import Image

    from idunlearn.landing import interval_cell

    grids = []
    for run in ("a", "b"):
        grids.append(str(tmp_path / f"{run}_forget.png"))
        Image.new("RGB", (8, 8), (40, 80, 120)).save(grids[-1])
    landing = tmp_path / "tables" / "landing.rst"
    smk = SimpleNamespace(input=SimpleNamespace(summary_long=str(tmp_path / "tables" / "summary_long.csv"),
                                                grids=grids, audit_summary=[], verdicts=[]),
                          output=[str(landing)], params=SimpleNamespace(runs=["a", "b"], identities=[1, 2, 3]),
                          log=[str(tmp_path / "landing_page.log")])
    runpy.run_path(str(REPO / "workflow" / "scripts" / "landing_page.py"), init_globals={"snakemake": smk})

    class Snakemake:
        config = {"results_dir": str(tmp_path), "request": {"folder": None}}  # no forget request: the study's page

    text = (REPO / "workflow" / "report" / "workflow.rst").read_text() + "\n.. _Summary: #\n.. _Tables: #\n"
    rendered = Environment(trim_blocks=True, lstrip_blocks=True).from_string(text).render(snakemake=Snakemake)
    html = publish_parts(rendered, writer="html", settings_overrides={"report_level": 2})["html_body"]
    assert "system-message" not in html and "Run a made the generator forget 3 identities (1, 2, 3)" in html
    assert "<th class=\"head\">SRK</th>" in html and html.count("<tr>") == 4  # header, original, a, b
    long = pd.read_csv(tmp_path / "tables" / "summary_long.csv").set_index(["run", "phase", "metric"])
    forget_a = long.loc[("a", "after", "ism_forget"), ["mean", "ci_low", "ci_high"]]
    assert f"<td>{interval_cell(*forget_a)}</td>" in html  # aggregate's numbers, not a copy
    assert html.count('src="data:image/png;base64,') == 2  # a forget grid per run


def test_nested_markdown_demotes_every_heading_but_not_code_or_text():
    from idunlearn.evaluation.aggregate import nested_markdown
    page = "# Forgetting audit\n\ntext with # inside\n#hashtag\n## Attack\n```sh\n# a shell comment\n```\n"
    assert nested_markdown(page) == ("## Forgetting audit\n\ntext with # inside\n#hashtag\n### Attack\n```sh\n"
                                     "# a shell comment\n```\n")


# ----- paired_runs: the audit's runs paired by identity on their evaluation ---------------------------------------

def _paired_tables():
    """Runs A (compare_to), B and R (the never-trained reference, no unlearning cost) on identities 1-4: B exceeds
    A and R by a known amount in every measure."""
    step = {"A": 0.0, "B": 1.0, "R": -0.5}
    offsets = np.array([0.1, 0.2, 0.4, 0.3])  # per identity, the same for every run: the pairing removes them
    metrics, counts, costs = [], [], []
    for run, shift in step.items():
        for identity, offset in zip(range(1, 5), offsets):
            metrics.append({"run": run, "forget_identity": identity, "ism_forget_after": offset + shift,
                            "ism_retain_after": 2 * offset + shift + 0.05 * identity * (run == "B"),
                            "kd_forget_delta": offset + 3 * shift, "kd_retain_delta": offset + shift,
                            "quality_retain_delta": offset + shift})
            hits = {"A": 2, "B": 1, "R": 4}[run]
            counts.append({"run": run, "phase": "after", "forget_identity": identity, "forget_n": 10,
                           "forget_hits": hits, "retain_n": 20, "retain_hits": 18})
            if run != "R":
                costs.append({"run": run, "forget_identity": identity, "steps": 100, "seconds_per_step": 0.5,
                              "unlearning_seconds": 100 * (1.0 + shift + offset), "trainable_parameters": 7})
    return pd.DataFrame(metrics), pd.DataFrame(counts), pd.DataFrame(costs)


def test_paired_runs_pairs_by_identity_with_t_intervals_holm_and_pooled_srk():
    from scipy import stats

    from idunlearn.evaluation.aggregate import paired_runs

    metrics, counts, costs = _paired_tables()
    table = paired_runs(metrics, counts, costs, {"compare": "A", "reference": "R"}, seed=0).set_index(["run", "measure"])
    b = table.loc["B"]
    # forget ISM: every paired difference B - A is 1.0, B - R 1.5
    assert b.loc["forget ISM", "compare_diff"] == pytest.approx(1.0)
    assert b.loc["forget ISM", "reference_diff"] == pytest.approx(1.5)
    # retain ISM: differences 1 + 0.05 i; Student-t interval by hand
    d = 1.0 + 0.05 * np.arange(1, 5)
    half = stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2.0
    assert b.loc["retain ISM", ["compare_low", "compare_high"]].tolist() == pytest.approx([d.mean() - half,
                                                                                         d.mean() + half])
    assert b.loc["retain ISM", "mean"] == pytest.approx(np.mean(2 * np.array([0.1, 0.2, 0.4, 0.3]) + 1 + 0.05 *
                                                                np.arange(1, 5)))
    # unlearning time: the job's own seconds (not steps x median step), B - A = 100 s per identity; the reference
    # has no time
    assert b.loc["unlearning seconds per identity", "compare_diff"] == pytest.approx(100.0)
    assert np.isnan(b.loc["unlearning seconds per identity", "reference_diff"])
    assert "unlearning seconds per identity" not in table.loc["R"].index
    # 4 positive differences: exact two-sided Wilcoxon p = 2 / 2^4; Holm over B's 6 tested measures against A:
    # 0.125 x 6 = 0.75 for each (running maximum); against R only 5 are tested (no time): 0.625
    assert b["compare_p_wilcoxon"].dropna().tolist() == pytest.approx([0.125] * 6)
    assert b["compare_p_holm"].dropna().tolist() == pytest.approx([0.75] * 6)
    assert b["reference_p_holm"].dropna().tolist() == pytest.approx([0.625] * 5)
    # pooled SRK (PIU eq. 10): Acc_R / (Acc_U + 0.01) over all samples; B: 0.9 / 0.11, A: 0.9 / 0.21
    assert b.loc["SRK (pooled)", "mean"] == pytest.approx(0.9 / 0.11)
    assert b.loc["SRK (pooled)", "compare_diff"] == pytest.approx(0.9 / 0.11 - 0.9 / 0.21)
    assert b.loc["SRK (pooled)", "difference_interval"] == "paired bootstrap"
    assert np.isnan(b.loc["SRK (pooled)", "compare_p_wilcoxon"])
    # a run is not paired with itself
    assert table.loc[("A", "forget ISM"), ["compare_run", "reference_run"]].tolist()[1] == "R"
    assert pd.isna(table.loc[("A", "forget ISM"), "compare_run"])


def test_the_docs_show_each_run_s_paired_evaluation_with_p_only_where_tested(tmp_path):
    from idunlearn.docs import MissingResults, render_audit_evaluation
    from idunlearn.evaluation.aggregate import paired_runs

    folder = tmp_path / "tables" / "audit_evaluation"
    folder.mkdir(parents=True)
    with pytest.raises(MissingResults, match="comparisons.csv"):
        render_audit_evaluation(tmp_path, "B")
    metrics, counts, costs = _paired_tables()
    paired_runs(metrics, counts, costs, {"compare": "A", "reference": "R"}, seed=0).to_csv(
        folder / "comparisons.csv", index=False)
    lines = render_audit_evaluation(tmp_path, "B,R").splitlines()
    assert lines[0] == ("| run | measure | identities | mean (95% interval) | minus `A` (interval), Holm p | "
                        "minus `R` (interval), Holm p |")
    rows = {(cells[0], cells[1]): cells for cells in (line[2:-2].split(" | ") for line in lines[2:])}
    assert len(rows) == 7 + 6  # B: every measure; R: no unlearning time
    assert rows["`B`", "forget ISM"][4].startswith("1.000 (") and rows["`B`", "forget ISM"][4].endswith("p 0.750")
    assert rows["`B`", "SRK (pooled)"][4] == "3.896 (3.896 to 3.896)"  # no p: a pooled value, not a test
    assert rows["`R`", "forget ISM"][5] == "-"  # not paired with itself
    with pytest.raises(MissingResults, match=r"\['C'\]"):
        render_audit_evaluation(tmp_path, "C")


def test_a_jobs_time_says_what_it_measures():
    from idunlearn.evaluation.aggregate import job_seconds, job_seconds_measure, paired_runs

    resumed = {"seconds_total": 300.0, "seconds_this_session": 120.0}  # a job resumed once: every step summed
    archived = {"seconds_this_session": 120.0}  # timings from before seconds_total existed: the session's wall time
    assert (job_seconds(resumed), job_seconds_measure(resumed)) == (300.0, "every step summed")
    assert (job_seconds(archived), job_seconds_measure(archived)) == (120.0, "wall time of the job's last start")
    metrics, counts, costs = _paired_tables()
    costs["seconds_measure"] = np.where(costs["run"] == "A", "wall time of the job's last start", "every step summed")
    table = paired_runs(metrics, counts, costs, {"compare": "A", "reference": "R"}, seed=0)
    table = table.set_index(["run", "measure"])
    assert table.loc[("A", "unlearning seconds per identity"), "measured"] == "wall time of the job's last start"
    assert table.loc[("B", "unlearning seconds per identity"), "measured"] == "every step summed"
    assert pd.isna(table.loc[("B", "forget ISM"), "measured"])
