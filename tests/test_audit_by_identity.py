"""tools/audit_by_identity.sh schedules the robust audit: shared inputs and the archive's restore first, then the
identities dealt round-robin to LANES queues that run side by side, each identity's jobs saved to the archive when
they end, the saves taking turns, a failed job stopping only its own lane. Run here with a stand-in for Python that
records each call instead of running Snakemake (the archive itself: tests/test_archive.py)."""
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Stand-in for the interpreter: records every call (with its start and end for the archive's saves, which take a
# moment so that overlapping saves would show), fails the Snakemake run whose targets name $FAIL_IDENTITY, and runs
# for 10 s (until SIGTERM) each Snakemake run whose arguments contain $SLOW.
STAND_IN = r"""#!/usr/bin/env bash
log="$CALLS"
case "$2" in
  snakemake)
    echo "snakemake $*" >> "$log"
    if [ -n "${FAIL_IDENTITY:-}" ] && [[ "$*" == *"/before/$FAIL_IDENTITY/"* ]]; then exit 1; fi
    if [ -n "${SLOW:-}" ] && [[ "$*" == *"$SLOW"* ]]; then
      # as Snakemake on SIGTERM: the running job ends, no other starts, and the run fails
      trap 'echo "graceful $$" >> "$log"; sleep 0.3; exit 1' TERM
      for _ in $(seq 100); do sleep 0.1; done
    fi
    sleep 0.2 ;;
  idunlearn)
    echo "$4 start" >> "$log"; sleep 0.3; echo "$4 end" >> "$log" ;;
  *) echo "unexpected call: $*" >&2; exit 3 ;;
esac
"""


def tool(tmp_path, identities, **env):
    """The tool in a fresh working folder with the stand-in (not started): (command, folder, environment)."""
    work = tmp_path / "work"
    (work / "tools").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "audit_by_identity.sh", work / "tools")
    archive = work / "archive"
    archive.mkdir()
    (archive / "MANIFEST.json").write_text("{}")
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    calls = tmp_path / "calls.log"
    full_env = {"PATH": "/usr/bin:/bin", "PY": str(stand_in), "CALLS": str(calls), "ARCHIVE": "archive",
                "RUNS": "piu_100", "EXTERNAL": "retrain", **env}
    return ["bash", "tools/audit_by_identity.sh", *map(str, identities)], work, full_env


def calls_of(tmp_path):
    calls = tmp_path / "calls.log"
    return calls.read_text().splitlines() if calls.exists() else []


def run_tool(tmp_path, identities, **env):
    command, work, full_env = tool(tmp_path, identities, **env)
    done = subprocess.run(command, cwd=work, env=full_env, capture_output=True, text=True, timeout=60)
    return done, calls_of(tmp_path)


def audit_runs(calls):
    """The identities of each per-identity Snakemake run, in call order, with its --cores."""
    runs = []
    for call in calls:
        if call.startswith("snakemake") and "/before/" in call:
            words = call.split()
            identity = int(next(w for w in words if "/before/" in w).split("/")[-2])
            runs.append((identity, int(words[words.index("--cores") + 1]), "--nolock" in words))
    return runs


def test_lanes_share_the_cores_and_take_turns_saving(tmp_path):
    done, calls = run_tool(tmp_path, [7, 36, 15, 38, 16], CORES="2", LANES="2")
    assert done.returncode == 0, done.stderr
    # shared inputs on every core, then the restore, before any identity
    assert calls[0].startswith("snakemake") and "--cores 2 audit_inputs" in calls[0]
    assert calls[1:3] == ["restore start", "restore end"]
    runs = audit_runs(calls)
    assert sorted(i for i, _, _ in runs) == [7, 15, 16, 36, 38]
    assert all(cores == 1 and nolock for _, cores, nolock in runs)
    # round-robin queues: 7, 15, 16 in one lane and 36, 38 in the other, each in the given order
    lanes = {n: [line for line in done.stdout.splitlines() if line.startswith(f"[lane {n}] == identity")]
             for n in (0, 1)}
    assert [line.split()[4] for line in lanes[0]] == ["7", "15", "16"]
    assert [line.split()[4] for line in lanes[1]] == ["36", "38"]
    # one save per identity, never two at once
    saves = [c for c in calls if c.startswith("save")]
    assert saves == ["save start", "save end"] * 5
    # the target names every audited model of the identity
    seven = next(c for c in calls if "/before/7/" in c)
    assert "results/audit/after/piu_100/7/rows.parquet" in seven
    assert "results/audit/external/retrain/7/rows.parquet" in seven


def test_one_lane_runs_identities_in_order_on_every_core(tmp_path):
    done, calls = run_tool(tmp_path, [2, 7, 36], CORES="2", LANES="1")
    assert done.returncode == 0, done.stderr
    assert [(i, cores) for i, cores, _ in audit_runs(calls)] == [(2, 2), (7, 2), (36, 2)]


def test_a_failed_job_stops_its_lane_only_and_fails_the_tool(tmp_path):
    done, calls = run_tool(tmp_path, [7, 36, 15, 38], CORES="2", LANES="2", FAIL_IDENTITY="7")
    assert done.returncode == 1
    assert "identity 7: a job failed" in done.stdout + done.stderr
    ran = [i for i, _, _ in audit_runs(calls)]
    assert 15 not in ran  # after 7 in the failed lane
    assert {36, 38} <= set(ran)  # the other lane went on
    assert calls.count("save start") == 3  # identity 7's finished jobs were saved all the same


def test_a_tuned_run_builds_the_tuning_choice_once_before_the_lanes(tmp_path):
    done, calls = run_tool(tmp_path, [7, 36], CORES="2", LANES="2", RUNS="piu_100 uce.tuned")
    assert done.returncode == 0, done.stderr
    choice = [n for n, c in enumerate(calls) if c.endswith("results/tables/tuning/choice.json --configfile "
                                                         "config/study.yaml config/robust.yaml")]
    assert len(choice) == 1 and choice[0] < min(n for n, c in enumerate(calls) if "/before/" in c)


@pytest.mark.parametrize("lanes", ["0", "3"])
def test_more_lanes_than_cores_is_a_clear_error(tmp_path, lanes):
    done, calls = run_tool(tmp_path, [7], CORES="2", LANES=lanes)
    assert done.returncode == 2
    assert "each lane needs at least one core" in done.stderr
    assert calls == []


def test_stop_lets_the_running_jobs_end_archives_them_and_starts_nothing_more(tmp_path):
    command, work, env = tool(tmp_path, [7, 36, 15, 38], CORES="2", LANES="2", SLOW="--nolock")
    running = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while len(list((work / ".snakemake").glob("audit_by_identity.stop.*.pid"))) < 2:
        assert time.monotonic() < deadline and running.poll() is None, "the lanes did not start"
        time.sleep(0.1)
    stop = subprocess.run([*command[:2], "--stop"], cwd=work, env=env, capture_output=True, text=True, timeout=10)
    assert stop.returncode == 0 and "asked the lanes to stop" in stop.stdout
    output, _ = running.communicate(timeout=30)
    assert running.returncode == 0, output
    calls = calls_of(tmp_path)
    assert sum(c.startswith("graceful") for c in calls) == 2  # each lane's Snakemake, not the tool, got the signal
    assert sorted(i for i, _, _ in audit_runs(calls)) == [7, 36]  # 15 and 38 never started
    assert calls.count("save start") == 2  # the two identities' finished jobs archived
    assert "stopped on request" in output and not (work / ".snakemake" / "audit_by_identity.stop").exists()


def test_stop_during_the_tuning_ends_it_and_starts_no_lane(tmp_path):
    command, work, env = tool(tmp_path, [7, 36], CORES="2", LANES="2", RUNS="uce.tuned", SLOW="choice.json")
    running = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pid_file = work / ".snakemake" / "audit_by_identity.stop.tuning.pid"
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert time.monotonic() < deadline and running.poll() is None, "the tuning did not start"
        time.sleep(0.1)
    subprocess.run([*command[:2], "--stop"], cwd=work, env=env, capture_output=True, text=True, timeout=10)
    output, _ = running.communicate(timeout=30)
    assert running.returncode == 0, output
    calls = calls_of(tmp_path)
    assert sum(c.startswith("graceful") for c in calls) == 1  # the tuning's Snakemake got the signal
    assert audit_runs(calls) == [] and "save start" not in calls  # no lane, nothing new to archive
    assert "stopped on request during the tuning" in output
    assert not pid_file.exists() and not (work / ".snakemake" / "audit_by_identity.stop").exists()
