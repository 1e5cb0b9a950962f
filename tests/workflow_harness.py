"""Run the real Snakefile in a temporary folder (subprocess), with the project's asset cache linked in."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import ASSET_CACHE, REPO

SNAKEMAKE = [sys.executable, "-m", "snakemake"]
# Two one-thread jobs side by side: the test world's jobs are small, so most of a job's time is its Python start and
# imports, which one thread does; every test run uses the same setting, so byte-for-byte comparisons hold.
CORES = ["--cores", "2", "--max-threads", "1"]


def prepare_workdir(workdir: Path, overrides: dict | None = None, base: str = "config.yaml") -> Path:
    """A work folder with data/assets linked to the cached registry assets and a config file; returns its path."""
    assets = workdir / "data" / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    for f in ASSET_CACHE.glob("*"):
        if f.is_file() and not (assets / f.name).exists():
            shutil.copyfile(f, assets / f.name)
    cfg = yaml.safe_load((REPO / "config" / base).read_text())
    cfg.update({"data_dir": str(workdir / "data"), "results_dir": str(workdir / "results")})
    for key, value in (overrides or {}).items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path = workdir / "config" / "config.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def snakemake(workdir: Path, *args: str, configfile: Path | None = None, check: bool = True,
              timeout: int = 1200) -> subprocess.CompletedProcess:
    # --configfile takes several values: it goes last, after the targets
    cmd = [*SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir), *CORES, *args,
           "--configfile", str(configfile or workdir / "config" / "config.yaml")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=workdir)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def jobs_run(proc: subprocess.CompletedProcess) -> list[tuple[str, str]]:
    """(rule, wildcards) of every job a run executed, from Snakemake's log."""
    text = proc.stdout + proc.stderr
    out = []
    for block in re.split(r"\n(?=(?:local)?(?:rule|checkpoint) )", text):
        head = re.match(r"(?:local)?(?:rule|checkpoint) (\w+):", block)
        if head:
            wc = re.search(r"wildcards: ([^\n]*)", block)
            out.append((head[1], wc[1] if wc else ""))
    return out
