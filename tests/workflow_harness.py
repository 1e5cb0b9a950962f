"""Run the real Snakefile in a temporary folder (subprocess), with the project's asset cache linked in."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import yaml

from conftest import ASSET_CACHE, REPO

SNAKEMAKE = [sys.executable, "-m", "snakemake"]
# Two one-thread jobs side by side: the test world's jobs are small, so most of a job's time is its Python start and
# imports, which one thread does; every test run uses the same setting, so byte-for-byte comparisons hold.
CORES = ["--cores", "2", "--max-threads", "1"]


def copy_assets(assets: Path) -> None:
    """The cached registry assets, copied into the folder a config's data_dir/assets names."""
    assets.mkdir(parents=True, exist_ok=True)
    for f in ASSET_CACHE.glob("*"):
        if f.is_file() and not (assets / f.name).exists():
            shutil.copyfile(f, assets / f.name)


def prepare_workdir(workdir: Path, overrides: dict | None = None, base: str = "config.yaml") -> Path:
    """A work folder with data/assets linked to the cached registry assets and a config file; returns its path."""
    copy_assets(workdir / "data" / "assets")
    cfg = yaml.safe_load((REPO / "config" / base).read_text())
    cfg.update({"data_dir": str(workdir / "data"), "results_dir": str(workdir / "results")})
    for key, value in (overrides or {}).items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path = workdir / "config" / "config.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


@dataclass
class Started:
    """A Snakemake run going on in the background, its output collected in files (not pipes: a run nobody is reading
    yet must not stall on a full pipe)."""
    process: subprocess.Popen
    stdout: IO[str]
    stderr: IO[str]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_snakemake(workdir: Path, *args: str, configfile: Path | list[Path] | None = None) -> Started:
    # --configfile takes several values (merged in order): it goes last, after the targets
    files = configfile if isinstance(configfile, list) else [configfile or workdir / "config" / "config.yaml"]
    cmd = [*SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir), *CORES, *args,
           "--configfile", *map(str, files)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    return Started(subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, cwd=workdir), out, err)


def finish(started: Started, check: bool = True, timeout: int = 1200) -> subprocess.CompletedProcess:
    try:
        started.process.wait(timeout=timeout)
    finally:
        started.kill()
    stdout, stderr = (_read_back(f) for f in (started.stdout, started.stderr))
    proc = subprocess.CompletedProcess(started.process.args, started.process.returncode, stdout, stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def _read_back(stream: IO[str]) -> str:
    stream.seek(0)
    text = stream.read()
    stream.close()
    return text


def snakemake(workdir: Path, *args: str, configfile: Path | list[Path] | None = None, check: bool = True,
              timeout: int = 1200) -> subprocess.CompletedProcess:
    return finish(start_snakemake(workdir, *args, configfile=configfile), check, timeout)


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


# The reduced default pipeline of the suite's end-to-end tests (conftest's two_runs): one forget identity, a few steps
# and samples, every audit probe small, from the shipped mini generator.
QUICK = {
    "selection": {"n_forget": 1},
    "generator": {"backend": "mini", "mini": {"checkpoint": str(REPO / "data" / "shipped" / "mini-arc2face")}},
    "unlearning": {"runs": {"piu": {"steps": 6, "forget_batch": 2, "retain_batch": 2, "checkpoint_every": 3}}},
    "evaluation": {"n_forget_samples": 4, "n_retain_samples": 4, "steps": 5, "kd": {"num_subsets": 5}},
    "layer_analysis": {"n_identities": 4, "images_per_identity": 2},
    "audit": {"default_target": True, "probes": {
        "leak": {"conditions": 1, "seeds": 2, "ks": [1, 2]}, "photo": {"seeds": 1},
        "neighbourhood": {"cosines": [1.0, 0.5], "retain_directions": 1, "random_directions": 1, "seeds": 1},
        "relearning": {"steps": [0, 2], "images": 2, "batch": 2},
        "trajectory": {"timesteps": [750], "images": 1}, "attack": {"restarts": 2, "steps": 2, "samples": 2}}},
}
