"""Cluster cost plan: the jobs of a config from Snakemake's own DAG, GPU-hours per stage from benchmark records, and
the wall time on 1, 8 and 64 GPUs with the resources of the SLURM profile.

`python -m idunlearn plan --configfile config/celebahq.yaml [--study]`

Jobs: a dry run cannot see past a checkpoint (the selection), so the DAG is resolved in rounds in a scratch working
directory (the repository's ``config`` and shipped models linked in): each round's checkpoint jobs and everything
they depend on are materialised (outputs touched in dependency order, the checkpoint's identity table written with
synthetic identity ids, as many as the config selects), and the dry run is repeated until no checkpoint is pending.
Files the user provides (no rule makes them, e.g. an eDifFIQA ONNX) get empty stand-ins there. The union of the
rounds' jobs is the job list; the Snakefile, the rules and their getters are the real ones.

Costs: seconds per job of each GPU stage from benchmark records (``paper/benchmarks_h200.json``, committed, then
newer ``results/benchmarks/gpu_*.json`` written by ``make gpu-check``); a stage or precision without a measurement
is unknown, never guessed. Wall time: the GPU jobs list-scheduled on N GPUs in dependency order (at most the
profile's ``jobs`` at once); CPU jobs are left out (they overlap with GPU work or precede it).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import glob
import heapq
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from .io import atomic_path, write_json

PAPER_CONFIG = "config/celebahq.yaml"
STUDY_OVERLAY = "config/study.yaml"
PROFILE = "profiles/slurm"
RECORD = Path(__file__).parent / "paper" / "benchmarks_h200.json"
NEWER_RECORDS = "results/benchmarks/gpu_*.json"
GPU_COUNTS = (1, 8, 64)
DEFAULT_TARGET = "all"  # the Snakefile's default target
MAX_ROUNDS = 8  # checkpoints chained behind each other (selection -> tuning selection -> ...)

# The GPU stages of the paper path, by rule. Every rule here runs a full UNet and requests a GPU in profiles/slurm.
RULE_STAGES = {
    "unlearn": "unlearn", "tune_unlearn": "unlearn", "many_unlearn_joint": "unlearn", "many_unlearn_step": "unlearn",
    "many_unlearn_single": "unlearn", "request_unlearn": "unlearn",
    "evaluate_original": "evaluate", "evaluate_unlearned": "evaluate", "evaluate_external": "evaluate",
    "tune_evaluate_original": "evaluate", "tune_evaluate_unlearned": "evaluate", "many_evaluate_before": "evaluate",
    "many_evaluate_joint": "evaluate", "many_evaluate_step": "evaluate", "many_evaluate_merge": "evaluate",
    "many_evaluate_single": "evaluate", "request_assess_original": "evaluate",
    "request_assess_unlearned": "evaluate",
    "audit_original": "audit", "audit_unlearned": "audit", "audit_external": "audit",
    "export_unlearned": "export", "request_export": "export", "many_merge": "merge",
    "layer_analysis": "layer analysis",
}


def checkpoint_identities(rule: str, config: dict) -> list[int]:
    """Synthetic forget identity ids for a checkpoint's table: as many as the config selects, distinct per table."""
    n_forget = config["selection"]["n_forget"]
    if rule == "select_experiments":
        return list(range(n_forget))
    if rule == "tune_select":  # tuning identities lie outside the study's
        return list(range(n_forget, n_forget + config["tuning"]["n_identities"]))
    if rule == "many_select":
        from .many import needed

        return list(range(max(n_forget, needed(config["many"]))))
    raise ValueError(f"plan: checkpoint rule {rule!r} has no synthetic identity table; add it to "
                     "idunlearn.plan.checkpoint_identities")


@dataclass
class PlannedJob:
    rule: str
    wildcards: dict
    gpus: int
    runtime_min: float | None
    params: dict
    outputs: list[str]
    dependencies: list[int] = field(default_factory=list)  # indexes into the plan's job list
    undetermined: bool = False  # some inputs wait for a checkpoint in the dry run that found it

    @property
    def key(self) -> tuple:
        return self.rule, tuple(sorted(self.wildcards.items()))

    @property
    def run(self) -> str:
        """The run (or external model) the job belongs to; a tuning grid's settings count under ``<run>.tune.*``."""
        run = self.wildcards.get("run") or self.wildcards.get("external") or "-"
        return run.split(".tune.")[0] + ".tune.*" if ".tune." in run else run

    @property
    def stage(self) -> str | None:
        return RULE_STAGES.get(self.rule)


# ---------------------------------------------------------------------------------------------------------------
# Snakemake's DAG


@contextlib.contextmanager
def dry_run(snakefile: Path, workdir: Path, configfiles: list[Path], profiles: list[Path], targets: list[str]):
    """A Snakemake dry run in this process with ``profiles`` applied exactly as on the command line; yields the
    workflow (its ``dag`` holds the Job objects) and the parsed command line."""
    from snakemake.api import SnakemakeApi
    from snakemake.cli import parse_args
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import (ConfigSettings, DAGSettings, ExecutionSettings, OutputSettings,
                                          ResourceSettings, StorageSettings)

    argv = ["--snakefile", str(snakefile), "--directory", str(workdir), "--dry-run"]
    for profile in profiles:
        argv += ["--profile", str(profile)]
    _, args = parse_args([*argv, "--configfile", *map(str, configfiles), "--", *targets])
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        # cores=None as for a remote executor: threads and resources are not capped by this machine
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=None, nodes=args.jobs, overwrite_threads=args.set_threads,
                                               overwrite_resources=args.set_resources,
                                               default_resources=args.default_resources),
            config_settings=ConfigSettings(configfiles=[Path(c) for c in args.configfile]),
            storage_settings=StorageSettings(), snakefile=Path(args.snakefile), workdir=Path(args.directory))
        workflow_api.dag(DAGSettings(targets=set(args.targets))).execute_workflow(
            executor="dryrun", execution_settings=ExecutionSettings(lock=False))
        yield workflow_api._workflow, args


def _dry_run_jobs(snakefile: Path, workdir: Path, configfiles: list[Path], profile: Path | None,
                  targets: list[str]) -> tuple[list[dict], dict]:
    """Every job of one dry run (rule, wildcards, resources, params, outputs, whether a checkpoint, dependencies),
    topologically sorted, and the workflow's merged config and the profile's job limit."""
    from snakemake.io import is_flagged

    with dry_run(snakefile, workdir, configfiles, [profile] if profile else [], targets) as (workflow, args):
        dag = workflow.dag
        levels = list(dag.toposorted(list(dag.needrun_jobs(exclude_finished=False))))
        flat = [job for level in levels for job in (level if isinstance(level, (list, set, tuple)) else [level])]
        index = {job: i for i, job in enumerate(flat)}
        out = []
        for job in flat:
            resources = {k: v for k, v in job.resources.items() if isinstance(v, (int, float, str))}
            out.append({"rule": job.rule.name, "wildcards": dict(job.wildcards), "checkpoint": job.is_checkpoint,
                        # inputs still to be determined by a checkpoint (shown as <TBD>): asked for by name next round
                        "undetermined": any(is_flagged(f, "checkpoint_target") for f in job.input),
                        "gpus": int(resources.get("gpu", 0) or 0), "runtime": resources.get("runtime"),
                        "params": dict(job.params.items()),
                        "outputs": [str(Path(workdir, f)) for f in job.output],
                        "directories": [str(Path(workdir, f)) for f in job.output if f.is_directory],
                        "dependencies": [index[d] for d in dag.job_dependencies(job) if d in index]})
        return out, {"config": copy.deepcopy(dict(workflow.config)), "profile_jobs": args.jobs}


def _materialise(jobs: list[dict], wanted: set[int], config: dict) -> None:
    """Create the outputs of ``wanted`` jobs in dependency order (increasing mtimes, in the past), the checkpoints'
    identity tables with synthetic ids."""
    start = time.time() - 10 * (len(wanted) + 10)
    for rank, i in enumerate(sorted(wanted)):  # toposorted indexes: a dependency has a smaller index
        job = jobs[i]
        for path in job["outputs"]:
            if path in job["directories"]:
                os.makedirs(path, exist_ok=True)
            else:
                _touch(Path(path))
        if job["checkpoint"]:
            _write_checkpoint_tables(job, checkpoint_identities(job["rule"], config))
        for path in job["outputs"]:
            os.utime(path, (start + 10 * rank, start + 10 * rank))


def _write_checkpoint_tables(job: dict, identities: list[int]) -> None:
    """A checkpoint's outputs as the getters read them: Parquet tables with a ``forget_identity`` column and one
    JSON file per identity in its folders."""
    table = pd.DataFrame({"forget_identity": identities})
    for path in job["outputs"]:
        if path in job["directories"]:
            for identity in identities:
                write_json({"forget_identity": identity, "synthetic": True}, Path(path, f"{identity}.json"))
        elif path.endswith(".parquet"):
            with atomic_path(path) as tmp:
                table.to_parquet(tmp)
        elif path.endswith(".csv"):
            with atomic_path(path) as tmp:
                table.to_csv(tmp, index=False)


def _closure(jobs: list[dict], roots: list[int]) -> set[int]:
    seen, stack = set(), list(roots)
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(jobs[i]["dependencies"])
    return seen


LINKED = ("config", "data/shipped")  # repository paths a workflow run reads relative to its working directory


def prepare_scratch(folder: Path, repo: Path, extra: dict | None = None) -> Path:
    """``folder`` as a working directory for dry runs of ``repo``'s Snakefile (its ``config`` and shipped models
    linked in); returns a config file holding ``extra`` to give last."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        link = folder / name
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to((repo / name).resolve())
    path = folder / "plan_overrides.yaml"
    with atomic_path(path) as tmp:
        tmp.write_text(yaml.safe_dump(extra or {}))
    return path


def resolve_jobs(configfiles: list[Path], folder: Path, repo: Path = Path("."), profile: Path | None = None,
                 targets: tuple[str, ...] = (), extra: dict | None = None) -> tuple[list[PlannedJob], dict]:
    """Every job of the workflow for ``configfiles`` (+ ``extra`` config), the checkpoints resolved with synthetic
    identities in the scratch working directory ``folder``; returns the jobs (dependencies as indexes) and the
    merged config with the profile's job limit."""
    from snakemake.exceptions import MissingInputException

    configs = [(repo / c).resolve() for c in configfiles] + [prepare_scratch(folder, repo, extra)]
    planned: dict[tuple, PlannedJob] = {}
    output_owner: dict[str, tuple] = {}
    pending_deps: dict[tuple, set[str]] = {}
    asked = list(targets) or [DEFAULT_TARGET]
    for _ in range(MAX_ROUNDS):
        try:
            jobs, meta = _dry_run_jobs(repo.resolve() / "Snakefile", folder, configs, profile, asked)
        except MissingInputException as missing:  # a file the user provides: an empty stand-in, then again
            for path in _affected_files(missing):
                _touch(folder / path)
            continue
        for job in jobs:
            record = PlannedJob(job["rule"], job["wildcards"], job["gpus"], job["runtime"], job["params"],
                                job["outputs"])
            if record.key not in planned or job["undetermined"] is False and planned[record.key].undetermined:
                planned[record.key] = record
                record.undetermined = job["undetermined"]
                pending_deps[record.key] = {jobs[d]["outputs"][0] for d in job["dependencies"]}
            for path in job["outputs"]:
                output_owner[path] = record.key
        checkpoints = [i for i, job in enumerate(jobs) if job["checkpoint"]]
        undetermined = [str(Path(job["outputs"][0]).relative_to(folder)) for job in jobs
                        if job["undetermined"] and job["outputs"]]
        if not checkpoints and not set(undetermined) - set(asked):
            break
        asked = list(dict.fromkeys([*asked, *undetermined]))
        _materialise(jobs, _closure(jobs, checkpoints), meta["config"])
    else:
        raise RuntimeError(f"plan: the DAG is not resolved after {MAX_ROUNDS} dry runs in {folder}")
    order = list(planned)
    index = {key: i for i, key in enumerate(order)}
    out = []
    for key in order:
        job = planned[key]
        job.dependencies = sorted(index[output_owner[p]] for p in pending_deps[key] if p in output_owner)
        out.append(job)
    return out, meta


def _affected_files(error: Exception) -> list[str]:
    """The files a Snakemake MissingInputException names (its message is the only place that keeps them)."""
    text = str(error)
    return [line.strip() for line in text.split("affected files:", 1)[1].splitlines() if line.strip()]


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


# ---------------------------------------------------------------------------------------------------------------
# Benchmark records


def load_records(record: Path = RECORD, newer: str = NEWER_RECORDS) -> list[dict]:
    """The committed record, then newer ``make gpu-check`` records (newest last): a later measurement of the same
    stage and precision replaces an earlier one."""
    records = [json.loads(Path(record).read_text())]
    for path in sorted(glob.glob(newer)):
        records.append({**json.loads(Path(path).read_text()), "file": path})
    return records


def measurements(records: list[dict]) -> dict[tuple[str, str], dict]:
    """(stage, precision) -> the latest measurement with a number, labelled with its record. Only real model sizes
    count (a ``--tiny`` check is no prediction), and only eager rows: the workflow's jobs do not compile."""
    found = {}
    for record in records:
        if record.get("shapes", "paper") != "paper":
            continue
        for row in record["measurements"]:
            if row.get("compile"):
                continue
            if row.get("seconds_per_job") is not None or row.get("seconds_per_step") is not None:
                found[row["stage"], row["precision"]] = {**row, "source": record.get("file", record["label"])}
    return found


def job_seconds(job: PlannedJob, found: dict, config: dict) -> float | None:
    """Predicted seconds of one GPU job, or None when no record covers its stage at its precision.

    unlearn: load + steps x seconds per step scaled by the job's forget + retain batch against the record's
    (per-sample cost; a closed-form method: load only); evaluate: per job, scaled by samples x sampling steps;
    audit, export: per job.
    """
    stage = job.stage
    run = job.params.get("run") if isinstance(job.params.get("run"), dict) else {}
    # only training has a precision setting; evaluation, audit and export jobs run the generator's fp32 weights
    precision = (run.get("precision") or "fp32") if stage == "unlearn" else "fp32"
    row = found.get((stage, precision))
    if row is None:
        return None
    if stage == "unlearn":
        from .config import method_trains

        load = row["load_seconds"]
        if not method_trains(run.get("method", "piu")):
            return load
        ref = row["reference"]
        batch = (run.get("forget_batch", ref["forget_batch"]) + run.get("retain_batch", ref["retain_batch"])) / (
            ref["forget_batch"] + ref["retain_batch"])
        return load + run.get("steps", ref["steps"]) * row["seconds_per_step"] * batch
    if stage == "evaluate":
        cfg = job.params.get("evaluation") or config["evaluation"]
        ref = row["reference"]
        work = (cfg["n_forget_samples"] + cfg["n_retain_samples"]) * cfg["steps"]
        return row["seconds_per_job"] * work / ((ref["n_forget_samples"] + ref["n_retain_samples"]) * ref["steps"])
    return row["seconds_per_job"]


# ---------------------------------------------------------------------------------------------------------------
# The plan


def wall_seconds(jobs: list[PlannedJob], seconds: list[float | None], gpus: int, max_jobs: int) -> float | None:
    """Makespan of the GPU jobs list-scheduled on ``gpus`` GPUs (at most ``max_jobs`` at once) in dependency order,
    each job as soon as its GPU dependencies are done and a GPU is free; None when a GPU job's time is unknown."""
    gpu_jobs = [i for i, job in enumerate(jobs) if job.gpus]
    if any(seconds[i] is None for i in gpu_jobs):
        return None
    slots = max(1, min(gpus, max_jobs))
    gpu_deps = {i: _gpu_ancestors(jobs, i) for i in gpu_jobs}
    finish: dict[int, float] = {}
    free = [0.0] * slots
    for i in gpu_jobs:  # jobs are in topological order
        ready = max((finish[d] for d in gpu_deps[i]), default=0.0)
        start = max(ready, heapq.heappop(free))
        finish[i] = start + seconds[i]
        heapq.heappush(free, finish[i])
    return max(finish.values(), default=0.0)


def _gpu_ancestors(jobs: list[PlannedJob], i: int) -> set[int]:
    """The nearest GPU jobs among ``i``'s dependencies (through CPU jobs)."""
    out, stack, seen = set(), list(jobs[i].dependencies), set()
    while stack:
        d = stack.pop()
        if d in seen:
            continue
        seen.add(d)
        if jobs[d].gpus:
            out.add(d)
        else:
            stack.extend(jobs[d].dependencies)
    return out


def plan(jobs: list[PlannedJob], config: dict, found: dict, max_jobs: int) -> dict:
    """Jobs per (rule, run), GPU-hours per stage (None: unknown), wall time on GPU_COUNTS GPUs."""
    seconds = [job_seconds(job, found, config) if job.gpus else 0.0 for job in jobs]
    counts = pd.DataFrame([{"rule": job.rule, "run": job.run, "gpu": bool(job.gpus)} for job in jobs])
    per_rule = counts.groupby(["rule", "run", "gpu"]).size().rename("jobs").reset_index()
    stages = {}
    for i, job in enumerate(jobs):
        if not job.gpus:
            continue
        entry = stages.setdefault(job.stage or job.rule, {"jobs": 0, "unknown_jobs": 0, "gpu_hours": 0.0,
                                                           "over_runtime": 0, "runtime_min": set()})
        entry["jobs"] += 1
        entry["runtime_min"].add(job.runtime_min)
        if seconds[i] is None:
            entry["unknown_jobs"] += 1
        else:
            entry["gpu_hours"] += seconds[i] / 3600
            entry["over_runtime"] += bool(job.runtime_min and seconds[i] > 60 * job.runtime_min)
    for entry in stages.values():
        entry["gpu_hours"] = None if entry["unknown_jobs"] else round(entry["gpu_hours"], 2)
        entry["runtime_min"] = sorted(r for r in entry["runtime_min"] if r is not None)
    wall = {n: wall_seconds(jobs, seconds, n, max_jobs) for n in GPU_COUNTS}
    return {"jobs": len(jobs), "gpu_jobs": sum(bool(j.gpus) for j in jobs), "per_rule": per_rule.to_dict("records"),
            "stages": stages, "wall_hours": {n: None if s is None else round(s / 3600, 2) for n, s in wall.items()},
            "profile_jobs": max_jobs}


def format_plan(result: dict, configfiles: list[str], found: dict) -> str:
    unknown = "unknown (no benchmark record)"
    lines = [f"plan for {' + '.join(configfiles)}: {result['jobs']} jobs, {result['gpu_jobs']} of them on a GPU", "",
             "jobs per rule and run (GPU rules marked *):"]
    for row in result["per_rule"]:
        lines.append(f"  {row['rule'] + ('*' if row['gpu'] else ''):28s} {row['run']:34s} {row['jobs']:6d}")
    lines += ["", "GPU stages (seconds per job from benchmark records; SLURM runtime limit from the profile):"]
    for stage, entry in sorted(result["stages"].items()):
        hours = unknown if entry["gpu_hours"] is None else f"{entry['gpu_hours']:.2f} GPU-hours"
        limit = "/".join(f"{r:g}" for r in entry["runtime_min"]) or "?"
        over = f", {entry['over_runtime']} jobs over the runtime limit" if entry["over_runtime"] else ""
        lines.append(f"  {stage:15s} {entry['jobs']:6d} jobs  {hours}  (runtime limit {limit} min{over})")
    lines += ["", f"wall time of the GPU jobs through the profile (at most {result['profile_jobs']} jobs at once):"]
    for n, hours in result["wall_hours"].items():
        lines.append(f"  {n:3d} GPUs: " + (unknown if hours is None else f"{hours:.2f} h"))
    lines += ["", "records used: " + ("; ".join(f"{s}/{p}: {row['source']}" for (s, p), row in sorted(found.items()))
                                      or "none with a measurement (see src/idunlearn/paper/benchmarks_h200.json)")]
    return "\n".join(lines)


def study_extra(configfiles: list[Path], overlay: Path = Path(STUDY_OVERLAY)) -> dict:
    """--study: the config the study ``overlay`` needs on top of the paper ``configfiles``. It keeps the paper
    config's number of forget identities (the last ``selection.n_forget`` of ``configfiles``; the overlay's 12 are
    the offline world's budget) and leaves out the overlay's whole-generator external models (the never-trained
    reference is the mini world's: no Arc2Face is retrained without the forget identities) and their audit runs."""
    counts = [((yaml.safe_load(Path(path).read_text()) or {}).get("selection") or {}).get("n_forget")
              for path in configfiles]
    counts = [n for n in counts if n is not None]
    if not counts:
        raise ValueError(f"plan --study: none of {[str(p) for p in configfiles]} sets selection.n_forget; give the "
                         "paper config (config/celebahq.yaml) first")
    extra: dict = {"selection": {"n_forget": counts[-1]}}
    study = yaml.safe_load(Path(overlay).read_text()) or {}
    external = (study.get("evaluation") or {}).get("external") or []
    whole = {entry["name"] for entry in external if "generator" in entry}
    if whole:
        extra["evaluation"] = {"external": [entry for entry in external if entry["name"] not in whole]}
        runs = (study.get("audit") or {}).get("runs")
        if runs:
            extra["audit"] = {"runs": [run for run in runs if run not in whole]}
    return extra


HELP = ("Jobs per rule and run from Snakemake's DAG, GPU-hours per stage from benchmark records, wall time on 1, 8 "
        "and 64 GPUs through profiles/slurm.")


def add_plan_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--configfile", nargs="+", default=[PAPER_CONFIG], help="config files, as for snakemake")
    parser.add_argument("--study", action="store_true",
                        help=f"add {STUDY_OVERLAY} (every run of the paper's tables), keeping the paper config's n_forget")
    parser.add_argument("--profile", default=PROFILE, help="SLURM profile whose resources and job limit apply")
    parser.add_argument("--targets", nargs="*", default=[], help="snakemake targets (default: the default target)")
    parser.add_argument("--scratch", type=Path, default=None,
                        help="folder for the dry runs' stand-in results (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=None, help="also write the plan as JSON here")
    return parser


def run_plan(args: argparse.Namespace) -> dict:
    configfiles = [Path(c) for c in args.configfile] + ([Path(STUDY_OVERLAY)] if args.study else [])
    extra = study_extra(list(map(Path, args.configfile)), Path(STUDY_OVERLAY)) if args.study else None
    with (contextlib.nullcontext(args.scratch) if args.scratch else tempfile.TemporaryDirectory()) as scratch:
        jobs, meta = resolve_jobs(configfiles, Path(scratch).resolve(), profile=Path(args.profile).resolve(),
                                  targets=tuple(args.targets), extra=extra)
    found = measurements(load_records())
    result = plan(jobs, meta["config"], found, meta["profile_jobs"])
    print(format_plan(result, [str(c) for c in configfiles], found))
    if args.json:
        write_json({**result, "configfiles": [str(c) for c in configfiles], "extra": extra}, args.json)
    return result
