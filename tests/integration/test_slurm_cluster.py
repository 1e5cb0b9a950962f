"""Opt-in (marker `slurm`, not in the default run): `make slurm-test`.

Starts a throwaway single-node SLURM from Debian bookworm packages (unpacked, not installed; private ports; no
accounting), runs the reduced offline pipeline (two forget identities, a few steps and samples) through
`snakemake --profile profiles/slurm` plus a test-only second profile, checks that every job, the per-identity ones
included, went through sbatch and completed as a SLURM job, and stops everything it started, also on failure.

Test-only overrides (second profile, written by tests/slurm_cluster.py:write_test_profile): `gpu: 0` for the rules
that request a GPU (GPU gres cannot be simulated here), CPU/memory requests capped to the node, the cluster's
partition, `slurm-status-command: squeue` (no accounting, so no sacct), short status-check interval, verbose log.

Logs (kept after the temporary folders are removed): results/slurm-test/ (or $IDUNLEARN_SLURM_TEST_LOGS):
snakemake.log (with every `sbatch call:`), jobs.txt (the controller's job list), slurm_logs/ (each job's output),
slurmctld.log, slurmd.log, munged.log, slurm.conf, test-profile.yaml. The Debian packages are cached in
data/assets/slurm/ (or $IDUNLEARN_ASSET_CACHE/slurm), so a second run needs no network.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import ASSET_CACHE, REPO
from slurm_cluster import (PER_IDENTITY_RULES, PROFILE, ThrowawaySlurm, fetch_packages, one_output_per_rule,
                           sbatch_calls_subprocess, write_test_profile)
from test_pipeline import QUICK
from workflow_harness import prepare_workdir

pytestmark = pytest.mark.slurm

LOGS = Path(os.environ.get("IDUNLEARN_SLURM_TEST_LOGS", REPO / "results" / "slurm-test"))
CONFIG = {**QUICK, "selection": {"n_forget": 2}}
TIMEOUT = int(os.environ.get("IDUNLEARN_SLURM_TEST_TIMEOUT", 5400))


def test_offline_pipeline_through_slurm_profile(orl_wheel, expo_tarball):
    debs = fetch_packages(ASSET_CACHE / "slurm")
    shutil.rmtree(LOGS, ignore_errors=True)
    LOGS.mkdir(parents=True)
    tmp = Path(tempfile.mkdtemp(prefix="idunlearn-slurm-test-"))
    try:
        workdir = tmp / "work"
        cfg = prepare_workdir(workdir, CONFIG)
        # what profiles/slurm alone asks for, per rule (dry run, no cluster), to write the test-only overrides
        resolved = sbatch_calls_subprocess(workdir, cfg, [PROFILE], one_output_per_rule(workdir / "results"))
        with ThrowawaySlurm(debs, log_dir=LOGS) as cluster:
            profile = write_test_profile(tmp / "slurm-test-profile", resolved, cluster.cpus, cluster.real_memory,
                                         cluster.partition, LOGS / "slurm_logs")
            shutil.copyfile(profile / "config.yaml", LOGS / "test-profile.yaml")
            cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
                   "--directory", str(workdir), "--profile", str(PROFILE), "--profile", str(profile),
                   "--configfile", str(cfg)]
            start = time.monotonic()
            with open(LOGS / "snakemake.log", "w") as log:
                log.write(f"# {' '.join(cmd)}\n# node: {cluster.node}, {cluster.cpus} CPUs, "
                          f"{cluster.real_memory} MB; packages: {', '.join(d.name for d in debs)}\n")
                log.flush()
                proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, timeout=TIMEOUT,
                                      env=cluster.env())
            wall = time.monotonic() - start
            jobs = cluster.jobs()
            (LOGS / "jobs.txt").write_text("id|name|state|comment\n"
                                           + "".join(f"{j['id']}|{j['name']}|{j['state']}|{j['comment']}\n"
                                                     for j in jobs))
        text = (LOGS / "snakemake.log").read_text(errors="replace")
        assert proc.returncode == 0, f"snakemake failed ({proc.returncode}) after {wall:.0f} s:\n{text[-6000:]}"

        res = workdir / "results"
        identities = [int(i) for i in pd.read_csv(res / "selection" / "selections.csv")["forget_identity"]]
        assert len(identities) == 2
        metrics = pd.read_csv(res / "tables" / "metrics.csv")
        assert sorted(metrics["forget_identity"]) == sorted(identities)
        for identity in identities:
            for kind in ("forget", "retain"):
                assert (res / "figures" / "piu" / f"{identity}_{kind}.png").stat().st_size > 0

        # every per-identity job: an sbatch call in Snakemake's log, and a COMPLETED job at the controller
        completed = {j["comment"] for j in jobs if j["state"] == "COMPLETED"}
        sbatch_lines = [line for line in text.splitlines() if "sbatch call: sbatch " in line]
        for rule in PER_IDENTITY_RULES:
            for identity in identities:
                comment = f"rule_{rule}_wildcards_" + ("piu_" if "run" in resolved[rule]["wildcards"] else "")
                comment += str(identity)
                assert any(f"--comment {comment} " in line for line in sbatch_lines), comment
                assert comment in completed, (comment, jobs)
        # nothing but the target rule ran outside SLURM
        assert set(re.findall(r"^localrule (\w+):", text, re.M)) <= {"all"}
        submitted = len(re.findall(r"has been submitted with SLURM jobid", text))
        assert submitted == len(sbatch_lines) == len(jobs) >= len(PER_IDENTITY_RULES) * 2 + 7
        (LOGS / "summary.txt").write_text(f"passed: {submitted} SLURM jobs, snakemake wall time {wall:.0f} s\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
