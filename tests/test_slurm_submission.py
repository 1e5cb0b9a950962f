"""The sbatch calls the SLURM executor plugin builds for every rule through profiles/slurm (GPU, memory, runtime,
CPUs), from the plugin's own submit-string code on the jobs of a dry run; no cluster needed. The opt-in test with a
real throwaway SLURM is tests/integration/test_slurm_cluster.py (`make slurm-test`)."""

from __future__ import annotations

import pytest

from conftest import REPO
from slurm_cluster import (GPU_RULES, PER_IDENTITY_RULES, PROFILE, one_output_per_rule, sbatch_calls_subprocess,
                           write_test_profile)
from workflow_harness import prepare_workdir

pytestmark = pytest.mark.slow

# rule: (gpus, mem_mb, runtime in minutes, cpus per task) as submitted with profiles/slurm
EXPECTED = {
    "acquire_dataset": (None, 8000, 240, 2),
    "face_models": (None, 8000, 30, 2),
    "extract_embeddings": (None, 16000, 240, 8),
    "cluster_identities": (None, 32000, 60, 2),
    "select_experiments": (None, 8000, 60, 2),
    "identity_sheet": (None, 8000, 60, 2),
    "layer_analysis": (None, 8000, 60, 2),
    "train_generator": (None, 4000, 180, 2),
    "unlearn": ("1", 8000, 60, 2),
    "evaluate_original": ("1", 8000, 60, 2),
    "evaluate_unlearned": ("1", 8000, 60, 2),
    "sample_grids": (None, 8000, 60, 2),
    "aggregate": (None, 8000, 60, 2),
    # the light audit is in the default target: the metrics tables wait for its headline
    "calibrate_verification": (None, 8000, 60, 2),
    "audit_tables": (None, 8000, 60, 2),
}

IDENTITY = 3


def sbatch_calls(workdir, cfg, profiles) -> dict[str, dict]:
    return sbatch_calls_subprocess(workdir, cfg, profiles, one_output_per_rule(workdir / "results", IDENTITY))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("slurm_submission")
    generator = {"backend": "mini", "mini": {"checkpoint": str(REPO / "data" / "shipped" / "mini-arc2face")}}
    return workdir, prepare_workdir(workdir, {"generator": generator})


@pytest.fixture(scope="module")
def calls(workdir):
    return sbatch_calls(*workdir, [PROFILE])


def test_every_rule_is_submitted_with_its_gpu_memory_runtime_and_cpus(calls):
    assert set(calls) == set(EXPECTED)
    got = {rule: (c["gpus"], c["mem_mb"], c["runtime"], c["cpus"]) for rule, c in calls.items()}
    assert got == EXPECTED


def test_gpu_rules_request_a_gpu_and_no_other_rule_does(calls):
    assert {rule for rule, c in calls.items() if c["gpus"]} == set(GPU_RULES)
    for rule in GPU_RULES:
        # a GPU job leaves the task geometry to the cluster (no --ntasks), CPUs per task from the profile
        assert calls[rule]["ntasks"] is None and "--gpus=1" in calls[rule]["call"]


def test_per_identity_jobs_carry_their_wildcards_in_the_job_comment(calls):
    for rule in PER_IDENTITY_RULES:
        assert calls[rule]["wildcards"]["identity"] == str(IDENTITY)
        assert calls[rule]["comment"].startswith(f"rule_{rule}_wildcards_")
        assert calls[rule]["comment"].endswith(f"_{IDENTITY}")
    assert calls["unlearn"]["comment"] == f"rule_unlearn_wildcards_piu_{IDENTITY}"


def test_a_site_partition_reaches_sbatch_and_keeps_the_rule_requests(workdir, tmp_path):
    """A site's default resources as a second profile (a command-line --default-resources replaces the profile's
    the same way). Partition only: accounts are validated with sacctmgr, which needs a cluster."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "config.yaml").write_text("default-resources:\n  runtime: 60\n  mem_mb: 8000\n  cpus_per_task: 2\n"
                                      "  slurm_partition: gpu\n")
    calls = sbatch_calls(*workdir, [PROFILE, site])
    assert {c["partition"] for c in calls.values()} == {"gpu"}
    assert calls["unlearn"]["gpus"] == "1" and calls["extract_embeddings"]["cpus"] == 8


def test_throwaway_cluster_profile_only_drops_gpus_and_caps_to_the_node(workdir, calls, tmp_path):
    """The integration test's overrides (tests/slurm_cluster.py) for a 2-CPU, 4 GB node: no --gpus, nothing above the
    node, every other request as in profiles/slurm."""
    test_profile = write_test_profile(tmp_path / "test-profile", calls, cpus=2, real_memory=4000, partition="test",
                                      slurm_logdir=tmp_path / "slurm_logs")
    calls = sbatch_calls(*workdir, [PROFILE, test_profile])
    for rule, (gpus, mem, runtime, cpus) in EXPECTED.items():
        c = calls[rule]
        assert c["gpus"] is None and c["partition"] == "test"
        assert (c["mem_mb"], c["runtime"], c["cpus"]) == (min(mem, 4000), runtime, min(cpus, 2)), rule
