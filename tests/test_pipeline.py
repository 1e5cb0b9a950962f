"""The whole default pipeline through Snakemake on a reduced offline world (one forget identity, a few steps and
samples), from the shipped mini generator: tables, grids and report exist, and a second run from scratch with
the same seed gives identical metrics tables."""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import REPO
from workflow_harness import jobs_run, prepare_workdir, snakemake

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUICK = {
    "selection": {"n_forget": 1},
    "generator": {"backend": "mini", "mini": {"checkpoint": str(REPO / "data" / "shipped" / "mini-arc2face")}},
    "unlearning": {"runs": {"piu": {"steps": 6, "forget_batch": 2, "retain_batch": 2, "checkpoint_every": 3}}},
    "evaluation": {"n_forget_samples": 4, "n_retain_samples": 4, "steps": 5, "kd": {"num_subsets": 5}},
    "layer_analysis": {"n_identities": 4, "images_per_identity": 2},
}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    runs = []
    for name in ("a", "b"):
        workdir = tmp_path_factory.mktemp(f"pipeline_{name}")
        cfg = prepare_workdir(workdir, QUICK)
        proc = snakemake(workdir, configfile=cfg)
        runs.append((workdir, cfg, proc))
    return runs


def test_pipeline_produces_tables_grids_and_report(two_runs):
    workdir, cfg, proc = two_runs[0]
    res = workdir / "results"
    metrics = pd.read_csv(res / "tables" / "metrics.csv")
    assert len(metrics) == 1 and metrics.loc[0, "run"] == "piu"
    for key in ("ism_forget", "ism_retain", "acc_forget", "acc_retain", "srk", "kd_forget", "kd_retain"):
        assert {f"{key}_before", f"{key}_after", f"{key}_delta"} <= set(metrics.columns)
    assert metrics.loc[0, "hp_steps"] == 6 and len(metrics.loc[0, "config_hash"]) == 10
    summary = pd.read_csv(res / "tables" / "summary.csv")
    assert summary.loc[0, "n"] == 1 and "srk_after_mean" in summary.columns
    identity = metrics.loc[0, "forget_identity"]
    for kind in ("forget", "retain"):
        assert (res / "figures" / "piu" / f"{identity}_{kind}.png").stat().st_size > 0
    assert (res / "analysis" / "layer_separation.png").is_file()
    snakemake(workdir, "--report", str(res / "report.html"), configfile=cfg)
    assert "metrics.csv" in (res / "report.html").read_text(errors="ignore")


def test_same_seed_gives_identical_metrics_tables(two_runs):
    (a, _, _), (b, _, _) = two_runs
    for table in ("metrics.csv", "summary.csv"):
        assert (a / "results" / "tables" / table).read_bytes() == (b / "results" / "tables" / table).read_bytes()


def test_rerun_runs_nothing_and_evaluation_change_does_not_retrain(two_runs):
    workdir, cfg, _ = two_runs[0]
    assert jobs_run(snakemake(workdir, configfile=cfg)) == []
    more = prepare_workdir(workdir, {**QUICK, "evaluation": {**QUICK["evaluation"], "n_retain_samples": 5}})
    ran = {rule for rule, _ in jobs_run(snakemake(workdir, configfile=more))}
    assert "unlearn" not in ran and {"evaluate_original", "evaluate_unlearned", "aggregate"} <= ran


def test_readme_library_example_runs(two_runs, monkeypatch, capsys):
    import re

    workdir = two_runs[0][0]
    block = re.search(r"## Use it as a library.*?```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)[1]
    monkeypatch.chdir(workdir)
    exec(compile(block, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert re.search(r"ISM 0\.\d+, accuracy (1\.000|0\.9\d\d)", printed) and "anchor" in printed
    assert re.search(r"^\s*20\s", printed, re.M)  # the loss log reached step 20
