"""The sbatch calls the SLURM executor plugin builds for every rule through profiles/slurm (GPU, memory, runtime,
CPUs), from the plugin's own submit-string code on the jobs of a dry run; no cluster needed. The opt-in test with a
real throwaway SLURM is tests/integration/test_slurm_cluster.py (`make slurm-test`)."""

from __future__ import annotations

import re

import pytest
import yaml

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
    "layer_analysis": ("1", 8000, 60, 2),
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


# --- every stage that runs a full UNet on the paper path requests its GPU ---

# Rules whose script loads the configured generator but never puts it on the run's device: the second recognizer's
# reference only renders the real photos through the generator's image pipeline (load_generator without a device).
# the rebuild builds mini generators only (docs/rebuild.md prices it for Arc2Face): CPU jobs like the reference's
CPU_GENERATOR_RULES = {"second_recognizer_reference", "rebuild_search", "rebuild_budget"}
OVERLAYS = ("study.yaml", "many.yaml", "request.yaml")  # tuning grids, the many stage, a forget request


def rule_scripts() -> dict[str, str]:
    """Rule -> its script's file name, read from rules/*.smk (`use rule A as B` takes A's script)."""
    scripts, uses = {}, {}
    for smk in sorted((REPO / "rules").glob("*.smk")):
        text = smk.read_text()
        for block in re.split(r"\n(?=(?:rule|checkpoint|use rule) )", text):
            head = re.match(r"(?:rule|checkpoint) (\w+):", block)
            used = re.match(r"use rule (\w+) as (\w+)", block)
            script = re.search(r"script:\s*\n\s*\"[./]*workflow/scripts/(\w+\.py)\"", block)
            if head and script:
                scripts[head[1]] = script[1]
            elif used:
                uses[used[2]] = used[1]
    for new, old in uses.items():
        scripts.setdefault(new, scripts.get(old))
    return scripts


def full_unet_rules() -> set[str]:
    """Every rule whose script loads the configured generator (a full UNet on the paper path), but the CPU ones."""
    loads = {name for name, script in rule_scripts().items()
             if script and "load_generator(" in (REPO / "workflow" / "scripts" / script).read_text()}
    return loads - CPU_GENERATOR_RULES


def gpu_targets(results, tune_run: str) -> list[str]:
    """One output of every full-UNet rule (identity 3, run piu; the tuning, many and request stages' own names)."""
    many = "many/piu/o1"
    return [str(results / p) for p in (
        "unlearning/piu/3/timings.json", "evaluation/before/3/metrics.json", "evaluation/after/piu/3/metrics.json",
        "evaluation/external/ext/3/metrics.json", "analysis/layer_separation.csv",
        "audit/before/3/rows.parquet", "audit/after/piu/3/rows.parquet", "audit/external/ext/3/rows.parquet",
        "audit/worstcase/piu/3/rows.parquet", "audit/worstcase/external/ext/3/rows.parquet",
        "audit/attack_samples/piu/3/rows.parquet", "audit/attack_samples/external/ext/3/rows.parquet",
        "export/piu/3/manifest.json",
        f"tuning/unlearning/{tune_run}/50/timings.json", "tuning/evaluation/before/50/metrics.json",
        f"tuning/evaluation/after/{tune_run}/50/metrics.json",
        f"{many}/joint/n2/timings.json", f"{many}/replay/step2/timings.json", "many/piu/single/3/timings.json",
        f"{many}/merge_sum/n2/timings.json", "many/before/3/metrics.json",
        f"{many}/joint/n2/evaluation/metrics.parquet", f"{many}/replay/step2/evaluation/metrics.parquet",
        f"{many}/merge_sum/n2/evaluation/metrics.parquet", "many/piu/single/3/evaluation/metrics.parquet",
        "request/demo/unlearning/timings.json", "request/demo/before/metrics.json", "request/demo/after/metrics.json",
        "request/demo/export/manifest.json")]


@pytest.fixture(scope="module")
def paper_stage_calls(tmp_path_factory):
    """The sbatch calls of one job of every full-UNet rule: the offline world with the study, many and request
    overlays and an external model, through profiles/slurm."""
    from idunlearn.config import deep_update, validate_config
    from idunlearn.tuning import tuning_settings

    workdir = tmp_path_factory.mktemp("slurm_paper_stages")
    generator = {"backend": "mini", "mini": {"checkpoint": str(REPO / "data" / "shipped" / "mini-arc2face")}}
    base = prepare_workdir(workdir, {"generator": generator})
    overlays = [REPO / "config" / name for name in OVERLAYS]
    merged = {}
    for path in [REPO / "config" / "config.yaml", base, *overlays]:
        merged = deep_update(merged, yaml.safe_load(path.read_text()) or {})
    # one more external model (next to the overlays' own), and the request overlay's demo folder as the demo rule
    # names it (under this work folder's data_dir)
    external = [*merged.get("evaluation", {}).get("external", []),
                {"name": "ext", "unet": str(workdir / "results" / "export" / "piu" / "3" / "delta.safetensors"),
                 "identities": [3]}]
    extra = workdir / "config" / "external.yaml"
    extra.write_text(yaml.safe_dump({"evaluation": {"external": external},
                                     "audit": {"probes": {"relearning_worstcase": {}}},
                                     "request": {"folder": str(workdir / "data" / "request_demo")}}))
    configfiles = [base, *overlays, extra]
    tune_run = sorted(tuning_settings(validate_config(deep_update(merged, yaml.safe_load(extra.read_text())))))[0]
    return sbatch_calls_subprocess(workdir, configfiles, [PROFILE], gpu_targets(workdir / "results", tune_run))


def test_every_full_unet_rule_is_covered_and_submitted_with_one_gpu(paper_stage_calls):
    wanted = full_unet_rules()
    # the stages the issue names, so that a parsing slip cannot shrink the set unnoticed
    assert {"unlearn", "evaluate_unlearned", "audit_unlearned", "tune_unlearn", "many_unlearn_joint",
            "request_unlearn", "export_unlearned", "request_export"} <= wanted
    missing = wanted - set(paper_stage_calls)
    assert not missing, f"add a target for {sorted(missing)} to gpu_targets"
    for rule in sorted(wanted):
        call = paper_stage_calls[rule]
        assert call["gpus"] == "1" and "--gpus=1" in call["call"], (rule, call["call"])
