"""The workflow through Snakemake: lint, dry runs of both configs (also with the SLURM profile), and the identity
stages end to end on the offline world, including cached reruns, adding one forget identity, and a cached unlearning
job that an upgrade adding a setting it does not read leaves alone."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
import yaml

import idunlearn
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


def upgraded_package(folder, setting: str, reader: str):
    """A copy of the idunlearn package whose schema adds the run setting ``setting`` (default 1.0) read by the
    method ``reader``, as a user upgrading gets it; returns the folder to put first on PYTHONPATH."""
    target = folder / "idunlearn"
    shutil.copytree(idunlearn.__path__[0], target, ignore=shutil.ignore_patterns("__pycache__"))
    schema_path = target / "schema" / "config.schema.yaml"
    schema = yaml.safe_load(schema_path.read_text())
    defaults = schema["properties"]["unlearning"]["properties"]["defaults"]
    defaults["properties"][setting] = {"type": "number", "default": 1.0}
    defaults["x-reads"]["methods"][reader].setdefault("reads", []).append(setting)
    schema_path.write_text(yaml.safe_dump(schema, sort_keys=False))
    return folder


def test_a_setting_only_piu_robust_reads_leaves_the_cached_piu_job_alone(identity_run, tmp_path, monkeypatch):
    workdir, cfg, _ = identity_run
    quick = {**yaml.safe_load(cfg.read_text()),  # the identity stages as they stand (an earlier test may add one)
             "generator": {"backend": "mini", "mini": {"checkpoint": str(REPO / "data" / "shipped" / "mini-arc2face")}},
             "unlearning": {"runs": {"piu": {"steps": 2, "forget_batch": 2, "retain_batch": 2}}}}
    cache_cfg = workdir / "config" / "cache.yaml"
    cache_cfg.write_text(yaml.safe_dump(quick))
    forget = int(pd.read_parquet(workdir / "results" / "selection" / "selections.parquet")["forget_identity"][0])
    target = str(workdir / "results" / "unlearning" / "piu" / str(forget) / "timings.json")
    snakemake(workdir, target, configfile=cache_cfg)

    def dry_run_after_upgrade(reader: str) -> list:
        monkeypatch.setenv("PYTHONPATH", str(upgraded_package(tmp_path / reader, "new_setting", reader)))
        proc = snakemake(workdir, "--dry-run", target, configfile=cache_cfg)
        monkeypatch.delenv("PYTHONPATH")
        return jobs_run(proc)

    assert dry_run_after_upgrade("piu_robust") == []
    # the control: the same setting read by piu reruns the piu job, so the dry run above could have listed it
    assert [rule for rule, wildcards in dry_run_after_upgrade("piu") if "run=piu" in wildcards] == ["unlearn"]
