"""The whole default pipeline through Snakemake on a reduced offline world (one forget identity, a few steps and
samples), from the shipped mini generator: tables, grids and report exist, and a second run from scratch with
the same seed gives identical metrics tables."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
import torch
import yaml

from conftest import REPO
from idunlearn.experiment import load_generator
from idunlearn.models.export import unet_sha256
from workflow_harness import CORES, QUICK, SNAKEMAKE, jobs_run, prepare_workdir, snakemake

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_pipeline_produces_tables_grids_and_report(two_runs):
    workdir, cfg, proc = two_runs[0]
    res = workdir / "results"
    metrics = pd.read_csv(res / "tables" / "metrics.csv")
    assert len(metrics) == 1 and metrics.loc[0, "run"] == "piu"
    for key in ("ism_forget", "ism_retain", "acc_forget", "acc_retain", "srk_identity", "kd_forget", "kd_retain"):
        assert {f"{key}_before", f"{key}_after", f"{key}_delta"} <= set(metrics.columns)
    assert metrics.loc[0, "hp_steps"] == 6 and len(metrics.loc[0, "config_hash"]) == 10
    summary = pd.read_csv(res / "tables" / "summary.csv")
    assert summary.loc[0, "n"] == 1 and "srk_identity_after_mean" in summary.columns
    identity = metrics.loc[0, "forget_identity"]
    timings = json.loads((res / "unlearning" / "piu" / str(identity) / "timings.json").read_text())
    assert timings["host_matmul_tflops_start"] > 0 and timings["host_matmul_tflops_end"] > 0  # the host's speed
    assert timings["threads"] == 1  # the job_threads default (the harness also caps at --max-threads 1)
    for kind in ("forget", "retain"):
        assert (res / "figures" / "piu" / f"{identity}_{kind}.png").stat().st_size > 0
    assert (res / "analysis" / "layer_separation.png").is_file()
    audit = pd.read_csv(res / "tables" / "audit.csv")
    assert set(audit["run"]) == {"original", "piu"} and set(audit["identity"]) == {identity}
    assert {"leak", "photo", "neighbourhood", "evaluation", "locality", "relearning", "relearning_control",
            "trajectory", "trajectory_control", "attack", "attack_control"} <= set(audit["probe"])
    second = audit[audit["metric"] == "fa_second"]  # the independent recognizer verifies the same samples
    assert {"evaluation", "leak", "photo", "neighbourhood", "attack", "attack_control"} <= set(second["probe"])
    recovered = audit[(audit["probe"] == "relearning") & (audit["metric"] == "recovery")].set_index("setting")
    assert recovered.loc["k=0", "value"] == 0.0 or np.isnan(recovered.loc["k=0", "value"])
    assert "| original |" in (res / "tables" / "audit_summary.md").read_text()
    assert (res / "figures" / "audit" / "neighbourhood.png").stat().st_size > 0
    snakemake(workdir, "--report", str(res / "report.html"), configfile=cfg)
    assert "metrics.csv" in (res / "report.html").read_text(errors="ignore")


def test_same_seed_gives_identical_metrics_tables(two_runs):
    (a, _, _), (b, _, _) = two_runs
    for table in ("metrics.csv", "summary.csv", "audit.csv"):
        assert (a / "results" / "tables" / table).read_bytes() == (b / "results" / "tables" / table).read_bytes()


def test_rerun_runs_nothing_and_evaluation_change_does_not_retrain(two_runs):
    workdir, cfg, _ = two_runs[0]
    assert jobs_run(snakemake(workdir, configfile=cfg)) == []
    more = prepare_workdir(workdir, {**QUICK, "evaluation": {**QUICK["evaluation"], "n_retain_samples": 5}})
    ran = {rule for rule, _ in jobs_run(snakemake(workdir, configfile=more))}
    assert "unlearn" not in ran and {"evaluate_original", "evaluate_unlearned", "aggregate"} <= ran


def test_library_example_runs(two_runs, monkeypatch, capsys):
    import re

    workdir = two_runs[0][0]
    block = re.search(r"```python\n(.*?)```", (REPO / "docs" / "library.md").read_text(), re.S)[1]
    monkeypatch.chdir(workdir)
    exec(compile(block, "docs/library.md", "exec"), {})
    printed = capsys.readouterr().out
    assert re.search(r"ISM 0\.\d+, accuracy (1\.000|0\.9\d\d)", printed) and "anchor" in printed
    assert re.search(r"^\s*20\s", printed, re.M)  # the loss log reached step 20


# --- reruns, interruption and failing jobs on the finished reduced pipeline -----------------------------------------
# They continue from the fixture's finished workdirs, in file order (each also runs alone with -k): b is as the
# fixture left it until the last test here adds a run to it; a holds test_rerun_...'s config (or QUICK, under -k).

def _config(workdir: Path, name: str, overrides: dict) -> Path:
    """A config file like prepare_workdir's, under its own name (the fixture's config.yaml is left alone)."""
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg.update({"data_dir": str(workdir / "data"), "results_dir": str(workdir / "results")})
    for key, value in overrides.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path = workdir / "config" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _jobs(proc) -> dict[str, list[str]]:
    """rule -> sorted 'run/identity' (or '') of every job a run executed or a dry run would execute."""
    out: dict[str, list[str]] = {}
    for rule, wildcards in jobs_run(proc):
        wc = dict(part.split("=", 1) for part in wildcards.split(", ") if "=" in part)
        key = "/".join(wc[k] for k in ("run", "external", "identity") if k in wc)
        out.setdefault(rule, []).append(key)
    return {rule: sorted(keys) for rule, keys in out.items()}


def _identities(workdir: Path) -> set[int]:
    return set(pd.read_parquet(workdir / "results" / "selection" / "selections.parquet")["forget_identity"].astype(int))


def _identity(workdir: Path) -> int:
    (identity,) = _identities(workdir)
    return identity


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL Snakemake and every process below it at once, as a crashed node or a scheduler would."""
    if proc.poll() is not None:
        return
    root = psutil.Process(proc.pid)
    seen: list[psutil.Process] = []
    while True:  # freeze the tree first, so that nothing new is started between listing and killing
        tree = [root, *root.children(recursive=True)]
        new = [p for p in tree if p not in seen]
        if not new:
            break
        for p in new:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGSTOP)
        seen += new
    for p in seen:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait(timeout=60)
    psutil.wait_procs(seen, timeout=60)


def _outputs_from(proc) -> list[Path]:
    """Output files of every job a dry run lists."""
    return [Path(f) for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("    output: ")
            for f in line.removeprefix("    output: ").split(", ")]


def test_killed_unlearning_job_resumes_and_ends_where_the_uninterrupted_run_did(two_runs, tmp_path):
    workdir, cfg, _ = two_runs[1]  # the fixture's uninterrupted run of QUICK
    res, identity = workdir / "results", _identity(workdir)
    run_dir, after = res / "unlearning" / "piu" / str(identity), res / "evaluation" / "after" / "piu" / str(identity)
    outputs = [run_dir / name for name in ("changed_parameters.safetensors", "losses.parquet", "timings.json")]
    expected = {p: p.read_bytes() for p in [outputs[0], after / "metrics.json", *(res / "tables").glob("*.csv")]
                if p.name != "costs.csv"}  # costs.csv holds wall times
    expected_losses = pd.read_parquet(outputs[1]).drop(columns="seconds")
    state = run_dir / "resume_state.pt"
    assert not state.exists()  # a finished job removes its resume point

    # back to where a first run stands when it reaches unlearning: no output of unlearn or of any job after it
    downstream = _outputs_from(snakemake(workdir, "--dry-run", "--forcerun", "unlearn", configfile=cfg))
    assert set(outputs) <= set(downstream) and (res / "tables" / "metrics.csv") in downstream
    for path in downstream:
        path.unlink()
    # run the workflow (QUICK: 6 steps, a resume point every 3) and kill everything once step 3 is saved
    cmd = [*SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir), *CORES,
           "--configfile", str(cfg)]
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            deadline = time.monotonic() + 600
            while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            ended = proc.poll() is not None
        finally:
            _kill_tree(proc)
    assert not ended and state.exists(), "no resume point while Snakemake ran:\n" + \
        (tmp_path / "killed.log").read_text()[-3000:]
    assert not any(p.exists() for p in downstream), "the job finished before it was killed; the test needs more steps"
    assert torch.load(state, weights_only=True)["step"] == 3

    # a crash leaves Snakemake's lock behind; after --unlock a plain rerun (no --rerun-incomplete: Snakemake finds no
    # output of the killed job, half-written or not) resumes at step 3 and ends with the same bytes
    snakemake(workdir, "--unlock", configfile=cfg)
    ran = _jobs(snakemake(workdir, configfile=cfg))
    assert ran["unlearn"] == [f"piu/{identity}"], ran
    log_text = (res / "logs" / "unlearn" / "piu" / f"{identity}.log").read_text()
    assert f"resumed at step 3 from {state}" in log_text, log_text[-2000:]
    assert not state.exists()
    for path, content in expected.items():
        assert path.read_bytes() == content, f"{path.relative_to(res)} differs from the uninterrupted run"
    pd.testing.assert_frame_equal(pd.read_parquet(outputs[1]).drop(columns="seconds"), expected_losses,
                                  check_exact=True)


def test_diverging_and_misnamed_runs_fail_with_a_clear_message_and_no_output(two_runs):
    workdir, _, _ = two_runs[1]
    res, identity = workdir / "results", _identity(workdir)
    piu = QUICK["unlearning"]["runs"]["piu"]
    # a misnamed method stops snakemake while it reads the config, before any job
    typo = _config(workdir, "typo_run", {**QUICK, "unlearning": {"runs": {"piu": piu, "typo": {**piu, "method": "nope"}}}})
    proc = snakemake(workdir, "-n", configfile=typo, check=False)
    assert proc.returncode != 0
    assert "config key 'unlearning.runs.typo.method': 'nope' is not one of" in proc.stdout + proc.stderr
    assert not (res / "unlearning" / "typo").exists()
    # a diverging run fails in its job, on the loss check of a training step (after one AdamW step at lr 1e30)
    diverge = _config(workdir, "diverging_run", {**QUICK, "unlearning": {"runs": {"piu": piu, "diverge": {**piu, "lr": 1e30}}}})
    target = str(res / "unlearning" / "diverge" / str(identity) / "timings.json")
    proc = snakemake(workdir, target, configfile=diverge, check=False)
    assert proc.returncode != 0 and "Error in rule unlearn" in proc.stdout + proc.stderr
    log = (res / "logs" / "unlearn" / "diverge" / f"{identity}.log").read_text()
    assert "FloatingPointError" in log and "non-finite loss (forget nan" in log, log[-3000:]
    assert "lower config key 'lr'" in log, log[-3000:]
    folder = res / "unlearning" / "diverge" / str(identity)
    assert not folder.exists() or not any(folder.iterdir()), list(folder.iterdir())


def test_new_run_and_one_changed_hyperparameter_rerun_only_that_runs_jobs(two_runs):
    workdir = two_runs[1][0]
    identity = _identity(workdir)
    piu = QUICK["unlearning"]["runs"]["piu"]

    def two_runs_config(lam: float) -> Path:
        return _config(workdir, f"two_runs_{lam}", {**QUICK, "unlearning": {"runs": {
            "piu": piu, "piu_low": {**piu, "lambda": lam}}}})

    # the audit covers piu only (config.yaml's audit.runs): a new run adds no audit job; the landing page shows the
    # tables' headline and every run's grid, so it follows them
    only_piu_low = {"unlearn": [f"piu_low/{identity}"], "evaluate_unlearned": [f"piu_low/{identity}"],
                    "sample_grids": [f"piu_low/{identity}"], "aggregate": [""], "landing_page": [""], "all": [""]}
    assert _jobs(snakemake(workdir, configfile=two_runs_config(1.0))) == only_piu_low  # a new run: only its jobs
    # one hyperparameter of one run changed: that run's unlearning, evaluation and grids, and the tables
    dry = snakemake(workdir, "--dry-run", configfile=two_runs_config(2.0))
    assert _jobs(dry) == only_piu_low, dry.stdout[-3000:]
    assert "Params have changed since last execution" in dry.stdout + dry.stderr


def test_one_more_forget_identity_runs_only_its_jobs(two_runs):
    workdir = two_runs[0][0]
    current = workdir / "config" / "config.yaml"  # up to date: QUICK with 5 retain samples (or QUICK, under -k)
    before = pd.read_csv(workdir / "results" / "tables" / "metrics.csv")
    (old,) = before["forget_identity"]
    cfg = yaml.safe_load(current.read_text())
    cfg["selection"]["n_forget"] = 2
    more = workdir / "config" / "two_identities.yaml"
    more.write_text(yaml.safe_dump(cfg))
    ran = _jobs(snakemake(workdir, configfile=more))
    new = _identities(workdir) - {old}
    assert len(new) == 1
    (new,) = new
    per_identity = {"identity_sheet": [f"{new}"], "evaluate_original": [f"{new}"], "unlearn": [f"piu/{new}"],
                    "evaluate_unlearned": [f"piu/{new}"], "sample_grids": [f"piu/{new}"],
                    "audit_original": [f"{new}"], "audit_unlearned": [f"piu/{new}"]}
    assert ran == {**per_identity, "select_experiments": [""], "aggregate": [""], "audit_tables": [""],
                   "landing_page": [""], "all": [""]}, ran  # the landing page shows the tables and the audit
    after = pd.read_csv(workdir / "results" / "tables" / "metrics.csv").set_index("forget_identity")
    pd.testing.assert_series_equal(after.loc[old], before.set_index("forget_identity").loc[old], check_exact=True)


RUN_JOBS = {"unlearn", "evaluate_original", "evaluate_unlearned", "audit_original", "audit_unlearned", "sample_grids"}


def test_exported_model_reimported_as_an_external_model_equals_its_run(two_runs):
    workdir = two_runs[1][0]
    res, identity = workdir / "results", _identity(workdir)
    export = res / "export" / "piu" / str(identity)
    # one run exports piu's model and evaluates it as a model made elsewhere (the delta's route into the generator is
    # checked in test_export.py: it gives the same weights, hash for hash)
    external = [{"name": "piu.reimported", "unet": str(export / "unet"), "identities": [identity]}]
    # audit.runs: the run's audit stays, the external model's (minutes) is checked by the dry run below
    cfg = _config(workdir, "external", {**QUICK, "evaluation": {**QUICK["evaluation"], "external": external},
                                        "audit": {**QUICK["audit"], "runs": ["piu"]}})
    ran = _jobs(snakemake(workdir, configfile=cfg))
    assert ran["export_unlearned"] == [f"piu/{identity}"], ran
    assert ran["evaluate_external"] == [f"piu.reimported/{identity}"], ran
    assert not RUN_JOBS & set(ran), ran  # adding an external model leaves the run's cached jobs valid
    metrics = pd.read_csv(res / "tables" / "metrics.csv").set_index("run")
    values = [c for c in metrics.columns
              if not c.startswith("hp_") and c.rsplit("_", 1)[-1] in ("before", "after", "delta")]
    assert len(values) > 30
    pd.testing.assert_series_equal(metrics.loc["piu.reimported", values], metrics.loc["piu", values],
                                   check_names=False, check_exact=True)
    assert metrics.loc["piu.reimported", "hp_external_unet"] == external[0]["unet"]
    samples = [pd.read_parquet(res / "evaluation" / folder / str(identity) / "samples.parquet")
               for folder in ("after/piu", "external/piu.reimported")]
    pd.testing.assert_frame_equal(samples[1], samples[0], check_exact=True)
    # the audit of an external model: wired like a run's (a dry run; an audit job costs minutes)
    audited = _config(workdir, "external_audited", {**QUICK, "evaluation": {**QUICK["evaluation"], "external": external},
                                                    "audit": {**QUICK["audit"], "runs": ["piu", "piu.reimported"]}})
    dry = _jobs(snakemake(workdir, "--dry-run", configfile=audited))
    assert dry["audit_external"] == [f"piu.reimported/{identity}"] and "audit_tables" in dry, dry
    assert not RUN_JOBS & set(dry), dry
    manifest = json.loads((export / "manifest.json").read_text())
    assert manifest["base_unet_sha256"] == unet_sha256(load_generator(QUICK["generator"]).unet)


def test_tuning_protocol_chooses_by_its_rule_and_the_tuned_run_uses_the_choice(two_runs):
    workdir = two_runs[1][0]
    study_identity, piu = _identity(workdir), QUICK["unlearning"]["runs"]["piu"]
    tuning = {"n_identities": 1, "retain_val_identities": 2, "budget": {"steps": 4, "forget_batch": 2, "retain_batch": 2},
              "methods": {"piu": {"grid": {"lr": [1.0e-4, 1.0e-2]}}}}
    cfg = _config(workdir, "tuning", {**QUICK, "unlearning": {"runs": {"piu": piu}}, "tuning": tuning})
    ran = _jobs(snakemake(workdir, "tune", configfile=cfg))
    tables = workdir / "results" / "tables" / "tuning"
    (tuning_identity,) = pd.read_csv(tables / "identities.csv")["forget_identity"]
    assert tuning_identity != study_identity
    settings = ["piu.tune.lr_0.0001", "piu.tune.lr_0.01"]
    assert ran["tune_unlearn"] == [f"{s}/{tuning_identity}" for s in settings], ran
    assert "unlearn" not in ran and "evaluate_unlearned" not in ran  # the study's jobs are not touched
    grid = pd.read_csv(tables / "grid.csv")
    assert grid["setting"].tolist() == settings and grid["chosen"].sum() == 1
    choice = json.loads((tables / "choice.json").read_text())["methods"]["piu"]
    eligible = grid[grid["retain_ratio"] >= 0.95]
    expected = (eligible.sort_values("ism_forget")["setting"].iloc[0] if len(eligible)
                else grid.sort_values("retain_ratio", ascending=False)["setting"].iloc[0])
    assert choice["setting"] == expected and expected in (tables / "tuning.md").read_text()
    # the study beside it: piu.tuned runs at the chosen setting (budget steps, chosen lr), piu is not rerun
    cfg = _config(workdir, "tuned", {**QUICK, "unlearning": {"runs": {"piu": piu}}, "tuning": {**tuning, "study": True}})
    ran = _jobs(snakemake(workdir, configfile=cfg))
    assert ran["unlearn"] == [f"piu.tuned/{study_identity}"], ran
    timings = json.loads((workdir / "results" / "unlearning" / "piu.tuned" / str(study_identity) /
                          "timings.json").read_text())
    assert (timings["run"]["lr"], timings["run"]["steps"]) == (choice["run"]["lr"], 4)
    metrics = pd.read_csv(workdir / "results" / "tables" / "metrics.csv").set_index("run")
    assert metrics.loc["piu.tuned", "hp_lr"] == choice["run"]["lr"]


def test_many_identities_jointly_in_chains_and_merged_and_a_changed_identity_reruns_only_its_jobs(two_runs):
    workdir = two_runs[1][0]
    res, identity = workdir / "results", _identity(workdir)
    many = {"run": "piu", "joint_sizes": [1, 2], "sequential_length": 2, "sequential_protections": ["none", "replay"],
            "merges": ["sum", "keys_values"], "joint_budget": {"forget_batch": "per_identity"}}
    ran = _jobs(snakemake(workdir, "many", configfile=_config(workdir, "many", {**QUICK, "many": many})))
    assert len(ran["many_unlearn_single"]) == 2 and len(ran["many_unlearn_joint"]) == 1, ran
    assert len(ran["many_unlearn_step"]) == 2 and len(ran["many_merge"]) == 2, ran
    assert "unlearn" not in ran and "evaluate_unlearned" not in ran  # the study's jobs are not touched
    # N = 1 and every chain's first step are the single job: the ordinary unlearn job of that identity, byte for byte
    single = (res / "unlearning" / "piu" / str(identity) / "changed_parameters.safetensors").read_bytes()
    assert (res / "many" / "piu" / "single" / str(identity) / "changed_parameters.safetensors").read_bytes() == single
    tables = {name: pd.read_csv(res / "tables" / f"many_{name}.csv")
              for name in ("joint", "sequential", "merge", "strategies", "comparisons")}
    chain = tables["sequential"]
    ids = chain.loc[(chain["size"] == 2) & (chain["strategy"] == "sequential/none"), "identity"].tolist()
    assert ids[0] == identity and tables["joint"].groupby("size")["identity"].apply(list).to_dict() == {
        1: ids[:1], 2: ids}
    assert set(chain["strategy"]) == {"sequential/none", "sequential/replay"}
    assert {"fa_forget", "ism_forget_before", "ism_retain", "srk_pooled", "seconds_total"} <= set(chain.columns)
    assert chain.groupby(["strategy", "size"])["steps_total"].first().tolist() == [6, 12, 6, 12]
    assert tables["merge"]["steps_total"].tolist() == [12] * 4  # per merge, the two single jobs it merged
    keys_values = json.loads((res / "many" / "piu" / "o0" / "merge_keys_values" / "n2" / "timings.json").read_text())
    assert keys_values["settings"]["merge_mixtures"] == 32  # a closed form: it reads the merge settings
    assert set(tables["strategies"]["strategy"]) == {"joint", "sequential/none", "sequential/replay", "merge/sum",
                                                     "merge/keys_values"}
    # 10 pairs of strategies x 7 metrics: 5 compared per order, 2 per (order, identity)
    assert len(tables["comparisons"]) == 10 * 7 and set(tables["comparisons"]["unit"]) == {"order", "order x identity"}
    replay = json.loads((res / "many" / "piu" / "o0" / "replay" / "step2" / "timings.json").read_text())
    assert replay["run"]["forget_batch"] == 2 + 8 and replay["weights"] == [8.0, 2.0]  # replay batch, own batch
    for mode in ("joint", "sequential"):
        assert (res / "figures" / f"many_{mode}.png").stat().st_size > 0
    # another second identity: only the jobs that hold it rerun
    other = next(i for i in pd.read_parquet(res / "many" / "selection" / "order.parquet")["forget_identity"]
                 if i not in ids)
    changed = _config(workdir, "many_changed", {**QUICK, "many": {**many, "identities": [ids[0], int(other)]}})
    dry = {(rule, wildcards) for rule, wildcards in jobs_run(snakemake(workdir, "many", "--dry-run",
                                                                       configfile=changed))}
    # size 1 of every strategy is the evaluated single job of the order's first identity, which is unchanged, so
    # many_evaluate_single stays cached; the new second identity's single job is unlearned (for the merges) only
    assert {rule for rule, _ in dry} == {"many_unlearn_single", "many_unlearn_step",
                                         "many_evaluate_step", "many_unlearn_joint", "many_evaluate_joint",
                                         "many_merge", "many_evaluate_merge", "many_evaluate_before", "many_tables",
                                         "many"}, dry
    assert ("many_unlearn_single", f"run=piu, identity={other}") in dry
    assert ("many_unlearn_single", f"run=piu, identity={identity}") not in dry
    # a longer chain adds its steps only
    longer = _config(workdir, "many_longer", {**QUICK, "many": {**many, "sequential_length": 3}})
    dry = {(rule, wildcards) for rule, wildcards in jobs_run(snakemake(workdir, "many", "--dry-run",
                                                                       configfile=longer))}
    assert {w for r, w in dry if r.startswith("many_unlearn")} == {
        "run=piu, order=0, protection=none, step=3", "run=piu, order=0, protection=replay, step=3"}, dry
    # the shipped overlay resolves: three orders, every strategy on each
    overlay = [_config(workdir, "many_overlay", QUICK), REPO / "config" / "many.yaml"]
    dry = {(rule, wildcards) for rule, wildcards in jobs_run(snakemake(workdir, "many", "--dry-run",
                                                                       configfile=overlay))}
    for rule, wildcards in (("many_unlearn_joint", "n=8"), ("many_unlearn_step", "protection=replay, step=8"),
                            ("many_merge", "merge=sum, n=8"), ("many_merge", "merge=regmean, n=8")):
        orders = {w.split("order=")[1].split(",")[0] for r, w in dry if r == rule and wildcards in w}
        assert orders == {"0", "1", "2"}, (rule, dry)
    merged = {dict(part.split("=", 1) for part in w.split(", "))["n"] for r, w in dry if r == "many_merge"}
    assert merged == {"2", "8"}, dry  # many.merge_sizes


def test_forget_request_from_a_folder_exports_the_model_and_reports_the_rejected_files(two_runs):
    workdir = two_runs[1][0]
    res, folder = workdir / "results", workdir / "data" / "request_demo"
    # the demo folder (6 photos of ORL person 5, one of person 12, a broken JPEG, a flat grey picture), built by its
    # rule; the request is then the default target, served with QUICK's tiny piu run, evaluation and probes
    cfg = _config(workdir, "request", {**QUICK, "request": {"name": "demo", "folder": str(folder)}})
    ran = _jobs(snakemake(workdir, configfile=cfg))
    assert set(ran) == {"demo_request_folder", "request_photos", "request_selection", "request_unlearn",
                        "request_assess_original", "request_assess_unlearned", "request_export", "request_report",
                        "all"}, ran  # the dataset's stages are the study's, cached
    out = res / "request" / "demo"
    status = pd.read_csv(out / "photos.csv").set_index("file")
    assert status["used"].to_dict() == {**{f"person_{k:02d}.png": True for k in range(1, 7)}, "broken.jpg": False,
                                        "no_face.png": False, "someone_else.png": False}
    assert status.loc["broken.jpg", "status"] == "unreadable" and status.loc["no_face.png", "status"] == "no_face"
    selection = json.loads((out / "selection.json").read_text())
    labels = pd.read_parquet(res / "identities" / "labels.parquet")
    (person,) = set(labels.loc[labels["true_identity"] == "s5", "identity"])
    assert selection["in_training_data"] and selection["forget_identity"] == person
    manifest = json.loads((out / "export" / "manifest.json").read_text())
    base = load_generator(QUICK["generator"]).unet
    assert manifest["base_unet_sha256"] == unet_sha256(base) != manifest["result_unet_sha256"]
    from idunlearn.models.export import apply_delta, load_unet_folder
    assert unet_sha256(apply_delta(base, out / "export" / "delta.safetensors")) == manifest["result_unet_sha256"]
    assert unet_sha256(load_unet_folder(out / "export" / "unet")) == manifest["result_unet_sha256"]
    report = (out / "report.md").read_text()
    assert f"in the training data as identity {person}" in report
    assert "`broken.jpg`: unreadable" in report and "`no_face.png`: no_face: no face detected" in report
    assert "`someone_else.png`: not the same person as the other 6 photos" in report
    assert manifest["base_unet_sha256"] in report and manifest["result_unet_sha256"] in report
    snakemake(workdir, "--report", str(out / "report.html"), configfile=cfg)
    html = (out / "report.html").read_text(errors="ignore")
    assert "served a forget request" in html and "someone_else.png" in html
