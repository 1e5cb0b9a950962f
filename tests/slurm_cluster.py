"""SLURM helpers for the tests.

1. `sbatch_calls`: the sbatch command lines that snakemake-executor-plugin-slurm builds for this workflow's jobs,
   with the resources Snakemake resolves from the rules and the given profiles. It runs a dry run in process and
   feeds the real Job objects to the plugin's own `get_submit_command` + `set_gres_string` (what
   `Executor.run_job` does before it calls sbatch); no cluster is needed. Run it in a subprocess
   (`python tests/slurm_cluster.py sbatch-calls ...`) so that Snakemake's global state stays out of the test process.
2. `ThrowawaySlurm`: a single-node SLURM from Debian bookworm packages (slurmctld, slurmd, slurm-client, munge and
   the libraries they need that the machine lacks), fetched with `apt-get download` into a cache folder, unpacked
   with `dpkg -x` into a temporary folder (nothing is installed), configured on private ports without accounting,
   and started as child processes; `stop()` cancels what is left, stops the daemons and removes the folder.
3. `write_test_profile`: the test-only overrides on top of profiles/slurm for that throwaway cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "profiles" / "slurm"

# Rules of the default target that request a GPU (the throwaway cluster has no GPU gres, so its test profile sets
# gpu=0 for them).
GPU_RULES = ("unlearn", "evaluate_original", "evaluate_unlearned", "layer_analysis")
# One SLURM job per forget identity (and per run) for these rules.
PER_IDENTITY_RULES = ("identity_sheet", "unlearn", "evaluate_original", "evaluate_unlearned", "sample_grids")

# Debian bookworm packages: the daemons, the client commands, munge, and the libraries they need that a machine of
# this kind does not have installed (every binary and plugin is checked with ldd after unpacking).
DEBIAN_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurm-wlm-basic-plugins", "munge", "libmunge2", "libhwloc15")
# Client commands put on PATH as wrappers that set SLURM_CONF and the library path. sacct is there so that the
# plugin's account guess fails cleanly (no accounting); job status comes from squeue.
CLIENT_COMMANDS = ("sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo", "sacct")


# ---------------------------------------------------------------------------------------------------------------
# 1. sbatch command lines without a cluster


def sbatch_calls(profiles: list[str], workdir: str, configfiles: list[str], targets: list[str]) -> list[dict]:
    """One dict (rule, wildcards, threads, resources, call) per job of a dry run towards `targets`."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import get_job_wildcards, set_gres_string
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    from idunlearn.plan import dry_run

    out = []
    with dry_run(REPO / "Snakefile", workdir, configfiles, profiles, targets) as (workflow, args):
        assert args.executor == "slurm", f"the profiles do not select the slurm executor: {args.executor}"
        settings = ExecutorPluginRegistry().get_plugin("slurm").get_settings(args)
        for job in workflow.dag.jobs:
            wildcards = get_job_wildcards(job)
            partition = job.resources.get("slurm_partition")
            params = {
                "run_uuid": "RUN_UUID",
                "slurm_logfile": Path(".snakemake/slurm_logs") / f"rule_{job.name}" / wildcards / "%j.log",
                "comment_str": f"rule_{job.name}_wildcards_{wildcards}" if wildcards else f"rule_{job.name}",
                "account": "",  # the plugin validates accounts with sacctmgr: needs a cluster
                "partition": f" -p {shlex.quote(str(partition))}" if partition else "",
                "workdir": workdir,
            }
            call = get_submit_command(job, params, settings=settings) + set_gres_string(job)
            resources = {k: v for k, v in job.resources.items() if isinstance(v, (int, float, str))}
            out.append({"rule": job.name, "wildcards": dict(job.wildcards), "threads": job.threads,
                        "resources": resources, "call": call})
    return out


def parse_sbatch(call: str) -> dict:
    """The options of an sbatch call that matter here: gpus, mem (MB), time (minutes), cpus, partition, ntasks."""
    words = shlex.split(call)
    assert words[0] == "sbatch", call
    opts: dict = {}
    i = 1
    while i < len(words):
        word = words[i]
        if "=" in word and word.startswith("--"):
            key, value = word.split("=", 1)
        elif word.startswith("-") and i + 1 < len(words) and not words[i + 1].startswith("-"):
            key, value = word, words[i + 1]
            i += 1
        else:
            key, value = word, True
        opts[key] = value
        i += 1
    return {
        "gpus": opts.get("--gpus"),
        "mem_mb": int(opts["--mem"]) if "--mem" in opts else None,
        "runtime": int(opts["-t"]) if "-t" in opts else None,
        "cpus": int(opts["--cpus-per-task"]) if "--cpus-per-task" in opts else None,
        "partition": opts.get("-p"),
        "ntasks": opts.get("--ntasks"),
        "comment": opts.get("--comment"),
        "options": opts,
    }


# ---------------------------------------------------------------------------------------------------------------
# 2. A throwaway single-node SLURM


def fetch_packages(cache: Path) -> list[Path]:
    """The .deb files of DEBIAN_PACKAGES, downloaded once into `cache` (a second run is offline)."""
    cache.mkdir(parents=True, exist_ok=True)
    missing = [p for p in DEBIAN_PACKAGES if not any(cache.glob(f"{p}_*.deb"))]
    if missing:
        cmd = ["apt-get", "download", *missing]
        if subprocess.run(cmd, cwd=cache).returncode != 0:
            # a machine whose package lists were never fetched: apt-get update once, then retry
            subprocess.run(["apt-get", "update"], check=True)
            subprocess.run(cmd, cwd=cache, check=True)
    return [sorted(cache.glob(f"{p}_*.deb"))[-1] for p in DEBIAN_PACKAGES]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThrowawaySlurm:
    """Single-node SLURM (slurmctld + slurmd + munged) from unpacked Debian packages; a context manager."""

    partition = "test"

    def __init__(self, debs: list[Path], log_dir: Path | None = None, min_job_age: int = 3600):
        self.debs = debs
        self.log_dir = log_dir
        self.min_job_age = min_job_age
        self.root: Path | None = None
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self._old_sigterm = None

    # paths -----------------------------------------------------------------------------------------------------
    def _find(self, name: str) -> Path:
        for sub in ("usr/sbin", "usr/bin"):
            for candidate in (name, f"{name}-wlm"):
                path = self.pkg / sub / candidate
                if path.exists():
                    return path
        raise FileNotFoundError(f"{name} not found in the unpacked packages under {self.pkg}")

    @property
    def pkg(self) -> Path:
        return self.root / "pkg"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    def env(self, base: dict | None = None) -> dict:
        """An environment whose PATH finds the cluster's client commands first."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return env

    def _daemon_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        env.update(SLURM_CONF=str(self.conf), LD_LIBRARY_PATH=os.pathsep.join(map(str, self.lib_dirs)))
        return env

    # lifecycle -------------------------------------------------------------------------------------------------
    def __enter__(self) -> "ThrowawaySlurm":
        try:
            self._old_sigterm = signal.signal(signal.SIGTERM, _raise_on_sigterm)
        except ValueError:  # not the main thread
            self._old_sigterm = None
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)

    def start(self) -> None:
        # munged wants execute permission for everyone on every folder above its socket
        self.root = Path(tempfile.mkdtemp(prefix="idunlearn-slurm-"))
        os.chmod(self.root, 0o711)
        for sub in ("pkg", "bin", "etc", "munge", "state", "spool", "log", "run"):
            (self.root / sub).mkdir(mode=0o711)
        for deb in self.debs:
            subprocess.run(["dpkg", "-x", str(deb), str(self.pkg)], check=True)
        slurm_lib = next(self.pkg.rglob("libslurmfull.so")).parent
        self.plugin_dir = slurm_lib
        self.lib_dirs = sorted({slurm_lib, *(p.parent for p in self.pkg.rglob("lib*.so.*"))})
        self._check_libraries()
        self._write_wrappers()
        self._write_munge_key()
        self._write_conf()
        self._start_munged()
        self._spawn("slurmctld", [self._find("slurmctld"), "-D", "-f", self.conf])
        self._wait(lambda: self.client("scontrol", "ping", check=False).stdout.count("UP") > 0, "slurmctld up")
        self._spawn("slurmd", [self._find("slurmd"), "-D", "-f", self.conf, "-d", self._find("slurmstepd"),
                               "-N", self.node])
        self._wait(lambda: self.client("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip() == "idle",
                   "node idle")

    def stop(self) -> None:
        if self.root is None:
            return
        try:
            if self.procs and all(p.poll() is None for _, p in self.procs):
                left = self.client("squeue", "-h", "-o", "%i", check=False).stdout.split()
                if left:
                    self.client("scancel", *left, check=False)
                    self._wait(lambda: not self.client("squeue", "-h", "-t", "PD,R,CG", "-o", "%i",
                                                       check=False).stdout.split(), "jobs cancelled", 60,
                               raise_=False)
        finally:
            for _, proc in reversed(self.procs):
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            self._kill_strays()
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                for f in [*(self.root / "log").glob("*"), self.conf]:
                    if f.is_file():
                        shutil.copyfile(f, self.log_dir / f.name)
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
            self.procs = []

    def _kill_strays(self) -> None:
        """slurmstepd processes started by our slurmd (they outlive it): found by their executable's path."""
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                exe = os.readlink(proc / "exe")
            except OSError:
                continue
            if exe.startswith(str(self.root) + os.sep):
                try:
                    os.kill(int(proc.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    # setup steps -----------------------------------------------------------------------------------------------
    def _check_libraries(self) -> None:
        env = self._daemon_env()
        files = [p for p in (*(self.pkg / "usr" / "sbin").iterdir(), *(self.pkg / "usr" / "bin").iterdir())]
        files += [p for p in self.plugin_dir.glob("*.so") if "lua" not in p.name]  # lua plugins are not used
        missing = set()
        for f in files:
            out = subprocess.run(["ldd", str(f)], capture_output=True, text=True, env=env).stdout
            missing |= {f"{f.name}: {line.split()[0]}" for line in out.splitlines() if "not found" in line}
        if missing:
            raise RuntimeError("libraries missing for the unpacked SLURM (add their Debian packages to "
                               "DEBIAN_PACKAGES):\n" + "\n".join(sorted(missing)))

    def _write_wrappers(self) -> None:
        # The jobstep plugin strips SLURM_* variables before it calls srun inside a job: the wrappers set
        # SLURM_CONF again, and the library path (the binaries' RUNPATH points at /usr/lib/...).
        libs = os.pathsep.join(map(str, self.lib_dirs))
        for name in CLIENT_COMMANDS:
            wrapper = self.bin / name
            wrapper.write_text("#!/bin/sh\n"
                               f"SLURM_CONF={shlex.quote(str(self.conf))}; export SLURM_CONF\n"
                               f"LD_LIBRARY_PATH={shlex.quote(libs)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}; "
                               "export LD_LIBRARY_PATH\n"
                               f"exec {shlex.quote(str(self._find(name)))} \"$@\"\n")
            wrapper.chmod(0o755)

    def _write_munge_key(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)

    def _write_conf(self) -> None:
        env = self._daemon_env()
        hardware = subprocess.run([str(self._find("slurmd")), "-C"], capture_output=True, text=True, env=env,
                                  check=True).stdout.splitlines()[0]
        fields = dict(item.split("=", 1) for item in hardware.split())
        self.node = fields["NodeName"]
        self.cpus = int(fields["CPUs"])
        self.real_memory = int(fields["RealMemory"])
        host = socket.gethostname().split(".")[0]
        r = self.root
        self.conf.write_text(f"""# throwaway single-node SLURM for the idunlearn integration test
ClusterName=idunlearn-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.socket
PluginDir={self.plugin_dir}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MinJobAge={self.min_job_age}
{hardware} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")

    def _start_munged(self) -> None:
        m = self.root / "munge"
        self._spawn("munged", [self._find("munged"), "-F", f"--socket={m}/munge.socket",
                               f"--key-file={m}/munge.key", f"--pid-file={m}/munged.pid",
                               f"--seed-file={m}/munged.seed", f"--log-file={self.root}/log/munged.log"])
        self._wait(lambda: (m / "munge.socket").exists(), "munge socket")

    def _spawn(self, name: str, cmd: list) -> None:
        log = open(self.root / "log" / f"{name}.out", "w")
        proc = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT, env=self._daemon_env(),
                                start_new_session=True, cwd=self.root)
        log.close()
        self.procs.append((name, proc))

    def _wait(self, ok, what: str, timeout: float = 90, raise_: bool = True) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}) while waiting for {what}:\n"
                                       + self._log_tails())
            if ok():
                return
            time.sleep(0.5)
        if raise_:
            raise TimeoutError(f"timed out waiting for {what}:\n" + self._log_tails())

    def _log_tails(self) -> str:
        tails = []
        for f in sorted((self.root / "log").glob("*")):
            tails.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(tails)

    # use -------------------------------------------------------------------------------------------------------
    def client(self, name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / name), *args], capture_output=True, text=True, check=check,
                              timeout=60)

    def jobs(self) -> list[dict]:
        """Every job the controller still knows (finished ones for MinJobAge seconds): id, name, state, comment."""
        out = self.client("squeue", "-h", "--states=all", "-o", "%i|%j|%T|%k").stdout
        return [dict(zip(("id", "name", "state", "comment"), line.split("|", 3))) for line in out.splitlines()]


def _raise_on_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


# ---------------------------------------------------------------------------------------------------------------
# 3. Test-only overrides for the throwaway cluster


def write_test_profile(folder: Path, resolved: dict[str, dict], cpus: int, real_memory: int, partition: str,
                       slurm_logdir: Path) -> Path:
    """A second profile, given after `--profile profiles/slurm`, for the throwaway cluster.

    `resolved` maps each rule to its job from `sbatch_calls` with profiles/slurm alone. Snakemake replaces a whole
    top-level key of an earlier profile, so `set-resources` and `set-threads` here are those of profiles/slurm plus,
    per rule, only what the node cannot give: `gpu: 0` where a GPU is requested (GPU gres cannot be simulated), CPUs
    and memory capped to the node. The default partition is added to the default resources.
    """
    base = yaml.safe_load((PROFILE / "config.yaml").read_text())
    set_resources = {rule: dict(res) for rule, res in (base.get("set-resources") or {}).items()}
    set_threads = {rule: min(n, cpus) for rule, n in (base.get("set-threads") or {}).items()}
    for rule, job in sorted(resolved.items()):
        res, over = job["resources"], {}
        if res.get("gpu"):
            over["gpu"] = 0
        if res.get("mem_mb", 0) > real_memory:
            over["mem_mb"] = real_memory
        if res.get("cpus_per_task", 0) > cpus:
            over["cpus_per_task"] = cpus
        if over:
            set_resources[rule] = {**set_resources.get(rule, {}), **over}
        if job["threads"] > cpus:
            set_threads[rule] = cpus
    profile = {
        "default-resources": {**(base.get("default-resources") or {}), "slurm_partition": partition},
        "set-resources": set_resources,
        "set-threads": set_threads,
        # no accounting on the throwaway cluster: job states from squeue (finished jobs are kept for MinJobAge)
        "slurm-status-command": "squeue",
        "slurm-init-seconds-before-status-checks": 5,
        "slurm-keep-successful-logs": True,
        "slurm-logdir": str(slurm_logdir),
        "verbose": True,  # the plugin logs each sbatch call at debug level
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text("# test-only overrides for the throwaway SLURM (tests/slurm_cluster.py)\n"
                                        + yaml.safe_dump(profile, sort_keys=False))
    return folder


def one_output_per_rule(results: Path, identity: int = 0, run: str = "piu") -> list[str]:
    """One output of every rule, the per-identity ones for one identity: a dry run cannot see past the checkpoint,
    but a job asked for by its output file is in the DAG with its wildcards and resources."""
    return [str(results / p) for p in (
        f"unlearning/{run}/{identity}/timings.json", f"evaluation/before/{identity}/metrics.json",
        f"evaluation/after/{run}/{identity}/metrics.json", f"selection/sheets/{identity}.png",
        f"figures/{run}/{identity}_forget.png", "tables/metrics.csv", "analysis/layer_separation.csv",
        "generator/trained/model.safetensors")]


def sbatch_calls_subprocess(workdir: Path, configfile: Path | list[Path], profiles: list,
                            targets: list[str]) -> dict[str, dict]:
    """`sbatch_calls` in a fresh Python process; one entry per rule (the last job of each), sbatch options parsed.
    ``configfile``: one file or several (merged in order, as snakemake's --configfile does)."""
    out = workdir / "sbatch-calls.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "sbatch-calls", "--directory", str(workdir),
           "--out", str(out)]
    for path in configfile if isinstance(configfile, list) else [configfile]:
        cmd += ["--configfile", str(path)]
    for profile in profiles:
        cmd += ["--profile", str(profile)]
    proc = subprocess.run([*cmd, *targets], capture_output=True, text=True, timeout=600, cwd=workdir)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch-calls failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return {job["rule"]: {**job, **parse_sbatch(job["call"])} for job in json.loads(out.read_text())}


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    calls = sub.add_parser("sbatch-calls", help="write the sbatch calls of a dry run as JSON")
    calls.add_argument("--profile", action="append", required=True)
    calls.add_argument("--directory", required=True)
    calls.add_argument("--configfile", action="append", required=True)
    calls.add_argument("--out", required=True)
    calls.add_argument("targets", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "sbatch-calls":
        result = sbatch_calls(args.profile, args.directory, args.configfile, args.targets)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
