"""The workflow through Snakemake: lint, dry runs of both configs (also with the SLURM profile), and the identity
stages end to end on the offline world, including cached reruns and adding one forget identity."""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import REPO
from badfiles import write_bad_files
from workflow_harness import jobs_run, prepare_workdir, snakemake

pytestmark = pytest.mark.e2e


def test_lint_is_clean(tmp_path):
    proc = snakemake(tmp_path, "--lint", configfile=REPO / "config" / "config.yaml", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("config", ["config.yaml", "celebahq.yaml"])
@pytest.mark.parametrize("profile", [None, "slurm"])
def test_dry_run_resolves(tmp_path, config, profile):
    cfg = prepare_workdir(tmp_path, base=config)
    args = ["--dry-run"] + (["--profile", str(REPO / "profiles" / profile)] if profile else [])
    proc = snakemake(tmp_path, *args, "identity_stages", configfile=cfg)
    text = proc.stdout + proc.stderr
    for rule in ("acquire_dataset", "face_models", "extract_embeddings", "cluster_identities", "select_experiments"):
        assert rule in text


@pytest.fixture(scope="module")
def identity_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("identity_world")
    cfg = prepare_workdir(workdir)
    proc = snakemake(workdir, "identity_stages", configfile=cfg)
    return workdir, cfg, proc


def test_offline_identity_stages_meet_the_targets(identity_run):
    workdir, _, _ = identity_run
    res = workdir / "results"
    faces = pd.read_parquet(res / "faces" / "embeddings.parquet")
    assert (faces["status"] == "ok").sum() >= 399
    summary = pd.read_csv(res / "identities" / "summary.csv").set_index("metric")["value"]
    assert summary["loo_1nn_accuracy"] >= 0.98
    assert summary["adjusted_rand_index"] >= 0.9
    selections = pd.read_parquet(res / "selection" / "selections.parquet")
    assert len(selections) == 3
    assert ((selections["n_forget_train"] == 6) & (selections["n_forget_val"] == 4)).all()
    in_band = (selections["anchor_cosine"] - 0.2).abs() < 0.01
    assert (in_band | selections["anchor_fallback"]).all()
    for sheet in selections["forget_identity"]:
        assert (res / "selection" / "sheets" / f"{sheet}.png").stat().st_size > 0


def test_second_run_does_nothing_and_one_more_identity_runs_only_its_jobs(identity_run):
    workdir, cfg, _ = identity_run
    again = snakemake(workdir, "identity_stages", configfile=cfg)
    assert jobs_run(again) == [], jobs_run(again)
    before = pd.read_parquet(workdir / "results" / "selection" / "selections.parquet")
    more = prepare_workdir(workdir, {"selection": {"n_forget": 4}})
    proc = snakemake(workdir, "identity_stages", configfile=more)
    after = pd.read_parquet(workdir / "results" / "selection" / "selections.parquet")
    new = set(after["forget_identity"]) - set(before["forget_identity"])
    assert len(new) == 1 and after.iloc[:3].equals(before)
    ran = jobs_run(proc)
    sheets = [wc for rule, wc in ran if rule == "identity_sheet"]
    assert sheets == [f"identity={new.pop()}"], ran
    assert {rule for rule, _ in ran} <= {"select_experiments", "identity_sheet", "identity_stages"}, ran


def test_bad_files_go_through_extract_embeddings(tmp_path):
    expected = write_bad_files(tmp_path / "bad")
    cfg = prepare_workdir(tmp_path, {"dataset": {"source": "folder", "folder": {"path": str(tmp_path / "bad")}}})
    snakemake(tmp_path, str(tmp_path / "results" / "faces" / "embeddings.parquet"), configfile=cfg)
    table = pd.read_parquet(tmp_path / "results" / "faces" / "embeddings.parquet")
    got = dict(zip(table["image_id"], table["status"]))
    assert {k: got[k] for k in expected} == {k: next(iter(v)) for k, v in expected.items()}
