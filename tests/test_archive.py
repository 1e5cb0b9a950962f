"""Job archives (idunlearn.archive): finished jobs saved on one machine are skipped by Snakemake on another, the
shared inputs are asked for first, a changed param still reruns the job, a damaged archive is refused."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from idunlearn.archive import ArchiveError, inputs_to_build, record_name, restore_jobs, save_jobs

# shared: built for every job (like the selection); private/{i}: one job's own input (like its unlearned model)
SNAKEFILE = """
rule all:
    input: expand("res/audit/{i}.txt", i=[1, 2])

rule shared:
    output: "res/shared.txt"
    shell: "echo shared > {output}"

rule private:
    output: "res/private/{i}.txt"
    shell: "echo private {wildcards.i} > {output}"

rule audit:
    input: shared="res/shared.txt", own="res/private/{i}.txt"
    output: "res/audit/{i}.txt"
    params: level=config.get("level", 1)
    shell: "cat {input} > {output}; echo level={params.level} run=$RANDOM$RANDOM >> {output}"
"""


def snakemake(workdir: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=workdir,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def copied(done: dict) -> dict:
    """What restore_jobs did with the archived files (without its report on the shared inputs)."""
    return {key: done[key] for key in ("restored", "kept", "stale")}


def workdir(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "Snakefile").write_text(SNAKEFILE)
    return folder


def test_record_name_is_snakemakes_metadata_file(tmp_path):
    first = workdir(tmp_path, "first")
    snakemake(first, "res/shared.txt")
    assert (first / ".snakemake" / "metadata" / record_name("res/shared.txt")).is_file()


def test_restored_jobs_are_skipped_and_shared_inputs_come_first(tmp_path):
    first, second, archive = workdir(tmp_path, "first"), workdir(tmp_path, "second"), tmp_path / "archive"
    snakemake(first, "res/audit/1.txt")
    manifest = save_jobs(first, archive, ["res/audit/*.txt"], private=["res/private/*"])
    assert sorted(manifest["files"]) == ["res/audit/1.txt"]

    # on the new machine the shared input is not built yet: restoring now would make the run redo the job
    assert inputs_to_build(archive, second) == ["res/shared.txt"]
    with pytest.raises(ArchiveError, match="res/shared.txt"):
        restore_jobs(archive, second)
    assert not (second / "res" / "audit").exists()  # nothing half-restored

    snakemake(second, "res/shared.txt")
    assert inputs_to_build(archive, second) == []
    assert restore_jobs(archive, second) == {"restored": ["res/audit/1.txt"], "kept": [], "stale": [], "differ": [],
                                              "mixed": []}
    plan = snakemake(second, "-n", "all")
    assert "output: res/audit/2.txt" in plan
    assert "output: res/audit/1.txt" not in plan and "output: res/private/1.txt" not in plan

    snakemake(second, "all")
    assert (second / "res/audit/1.txt").read_text() == (first / "res/audit/1.txt").read_text()
    assert not (second / "res/private/1.txt").exists()
    # the carried metadata still makes Snakemake rerun a job whose params changed
    assert "output: res/audit/1.txt" in snakemake(second, "--config", "level=2", "-n", "all")
    # restoring again gives the same file the current time (it must not fall behind other restored files)
    assert copied(restore_jobs(archive, second)) == {"restored": ["res/audit/1.txt"], "kept": [], "stale": []}
    # a different output there is that machine's own run of the job: kept
    snakemake(second, "res/audit/1.txt", "--forcerun", "audit")
    own = (second / "res/audit/1.txt").read_text()
    assert copied(restore_jobs(archive, second)) == {"restored": [], "kept": ["res/audit/1.txt"], "stale": []}
    assert (second / "res/audit/1.txt").read_text() == own


def test_damaged_or_missing_archive_is_refused(tmp_path):
    first, archive = workdir(tmp_path, "first"), tmp_path / "archive"
    with pytest.raises(ArchiveError, match="nothing to archive"):
        save_jobs(first, archive, ["res/audit/*.txt"])
    snakemake(first, "res/audit/1.txt")
    save_jobs(first, archive, ["res/audit/*.txt"], private=["res/private/*"])
    (archive / "files" / "res" / "audit" / "1.txt").write_text("edited\n")
    second = workdir(tmp_path, "second")
    snakemake(second, "res/shared.txt")
    with pytest.raises(ArchiveError, match="sha256"):
        restore_jobs(archive, second)
    with pytest.raises(ArchiveError, match="not a job archive"):
        restore_jobs(tmp_path / "nowhere", second)


def test_unfinished_outputs_are_not_archived(tmp_path):
    """A file without Snakemake's record (written by hand) or with an incomplete-job marker (its job is running or
    was killed) is not a finished job."""
    first, archive = workdir(tmp_path, "first"), tmp_path / "archive"
    snakemake(first, "res/audit/1.txt")
    (first / "res" / "audit" / "2.txt").write_text("half\n")
    assert sorted(save_jobs(first, archive, ["res/audit/*.txt"])["files"]) == ["res/audit/1.txt"]
    (first / "res" / "audit" / "2.txt").unlink()
    snakemake(first, "res/audit/2.txt")  # finished now, but marked incomplete as while its job runs
    marker = first / ".snakemake" / "incomplete" / record_name("res/audit/2.txt")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    assert sorted(save_jobs(first, archive, ["res/audit/*.txt"])["files"]) == ["res/audit/1.txt"]
    marker.unlink()
    assert sorted(save_jobs(first, archive, ["res/audit/*.txt"])["files"]) == ["res/audit/1.txt", "res/audit/2.txt"]


def test_saving_again_keeps_each_job_s_provenance_and_replaces_a_changed_output(tmp_path):
    """An output archived before (or restored from the archive) keeps its provenance (checkout, end time); an
    output that a newer run changed replaces it."""
    first, archive = workdir(tmp_path, "first"), tmp_path / "archive"
    snakemake(first, "res/audit/1.txt")
    save_jobs(first, archive, ["res/audit/*.txt"])
    manifest_path = archive / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["res/audit/1.txt"]["checkout"] = "earlier"
    manifest_path.write_text(json.dumps(manifest))
    assert save_jobs(first, archive, ["res/audit/*.txt"])["files"]["res/audit/1.txt"]["checkout"] == "earlier"
    snakemake(first, "res/audit/1.txt", "--forcerun", "audit")  # its $RANDOM makes the output differ
    entry = save_jobs(first, archive, ["res/audit/*.txt"])["files"]["res/audit/1.txt"]
    assert entry["checkout"] != "earlier" and entry["ended"].startswith("20")
    assert (archive / "files" / "res" / "audit" / "1.txt").read_text() == (first / "res/audit/1.txt").read_text()


def test_restoring_a_grown_archive_does_not_leave_a_job_older_than_its_restored_input(tmp_path):
    """A job restored before, whose input the archive now holds too, is restored again beside it: otherwise the input
    would be newer than the job's output and Snakemake would run the job again."""
    first, second, archive = workdir(tmp_path, "first"), workdir(tmp_path, "second"), tmp_path / "archive"
    snakemake(first, "res/audit/1.txt")
    save_jobs(first, archive, ["res/audit/*.txt"], private=["res/private/*"])
    snakemake(second, "res/shared.txt")
    restore_jobs(archive, second)
    time.sleep(0.05)
    save_jobs(first, archive, ["res/audit/*.txt", "res/private/*.txt"])
    assert restore_jobs(archive, second)["restored"] == ["res/audit/1.txt", "res/private/1.txt"]
    assert "output: res/audit/1.txt" not in snakemake(second, "-n", "all")


def test_an_output_whose_rule_script_changed_since_it_was_archived_is_left_out(tmp_path):
    """Snakemake notices a changed script: by its time, which restoring would hide: restore compares the script
    with the commit checked out where the output was archived."""
    first = workdir(tmp_path, "first")
    (first / "Snakefile").write_text(SNAKEFILE + """
rule scripted:
    input: "res/shared.txt"
    output: "res/scripted/{i}.txt"
    script: "scripts/write.py"
""")
    (first / "scripts").mkdir()
    (first / "scripts" / "write.py").write_text("open(snakemake.output[0], 'w').write('first version')\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(first)], check=True)
    subprocess.run([*git, "-C", str(first), "add", "Snakefile", "scripts"], check=True)
    subprocess.run([*git, "-C", str(first), "commit", "-qm", "workflow"], check=True)
    snakemake(first, "res/scripted/1.txt")
    archive = tmp_path / "archive"
    save_jobs(first, archive, ["res/scripted/*.txt"])
    second = tmp_path / "second"
    subprocess.run(["git", "clone", "-q", str(first), str(second)], check=True)
    snakemake(second, "res/shared.txt")
    assert restore_jobs(archive, second)["restored"] == ["res/scripted/1.txt"]
    (second / "res" / "scripted" / "1.txt").unlink()
    (second / "scripts" / "write.py").write_text("open(snakemake.output[0], 'w').write('second version')\n")
    assert copied(restore_jobs(archive, second)) == {"restored": [], "kept": [], "stale": ["res/scripted/1.txt"]}
    assert "output: res/scripted/1.txt" in snakemake(second, "-n", "res/scripted/1.txt")


def test_shared_inputs_that_differ_from_those_the_archived_jobs_read_are_named(tmp_path):
    """Another machine's build of a shared input need not be bit-identical: the manifest records the version each
    saved job read, and restoring names the shared inputs here that match none of them, and those read in more than
    one version."""
    first, second, archive = workdir(tmp_path, "first"), workdir(tmp_path, "second"), tmp_path / "archive"
    snakemake(first, "res/audit/1.txt")
    manifest = save_jobs(first, archive, ["res/audit/*.txt"], private=["res/private/*"])
    assert list(manifest["shared_inputs"]) == ["res/shared.txt"]  # a private input is not recorded
    snakemake(second, "res/shared.txt")
    done = restore_jobs(archive, second)
    assert done["restored"] == ["res/audit/1.txt"] and done["differ"] == [] and done["mixed"] == []

    (second / "res" / "shared.txt").write_text("shared, as built on another machine\n")
    done = restore_jobs(archive, second)
    assert done["restored"] == ["res/audit/1.txt"] and done["differ"] == ["res/shared.txt"] and done["mixed"] == []
    # a job run here reads this version: saving it records a second one
    snakemake(second, "res/audit/2.txt")
    manifest = save_jobs(second, archive, ["res/audit/*.txt"], private=["res/private/*"])
    assert len(manifest["shared_inputs"]["res/shared.txt"]) == 2
    done = restore_jobs(archive, second)
    assert done["differ"] == [] and done["mixed"] == ["res/shared.txt"]


def test_a_private_input_is_archived_until_the_job_reading_it_is(tmp_path):
    """Stopped after an unlearning job and before its audit, the run continues elsewhere with the audit: the
    unlearned model (here res/private/2.txt) is archived while its audit is pending and dropped once it is archived."""
    first, second, archive = workdir(tmp_path, "first"), workdir(tmp_path, "second"), tmp_path / "archive"
    pending = [("res/private/{i}.txt", "res/audit/{i}.txt")]
    snakemake(first, "res/audit/1.txt", "res/private/2.txt")
    manifest = save_jobs(first, archive, ["res/audit/*.txt"], private=["res/private/*"], pending=pending)
    # private/1 is not kept: its audit is archived
    assert {rel: entry.get("until") for rel, entry in manifest["files"].items()} == {
        "res/audit/1.txt": None, "res/private/2.txt": "res/audit/2.txt"}

    snakemake(second, "res/shared.txt")
    assert restore_jobs(archive, second)["restored"] == ["res/audit/1.txt", "res/private/2.txt"]
    plan = snakemake(second, "-n", "all")
    assert "output: res/audit/2.txt" in plan and "output: res/private/2.txt" not in plan
    snakemake(second, "all")
    assert (second / "res/private/2.txt").read_text() == (first / "res/private/2.txt").read_text()

    record = manifest["files"]["res/private/2.txt"]["metadata"]
    manifest = save_jobs(second, archive, ["res/audit/*.txt"], private=["res/private/*"], pending=pending)
    assert sorted(manifest["files"]) == ["res/audit/1.txt", "res/audit/2.txt"]
    assert not (archive / "files" / "res" / "private" / "2.txt").exists()
    assert not (archive / "metadata" / record).exists()
    assert json.loads((archive / "MANIFEST.json").read_text())["files"] == manifest["files"]


def test_the_audit_archive_keeps_rebuilt_generators_but_not_their_resume_states(tmp_path):
    """A rebuilt generator's budget folders and its search are job outputs the archive carries (their evaluation and
    worst-case jobs read them); the resume state, a params path no job outputs, stays behind."""
    from idunlearn.archive import AUDIT_PATTERNS

    files = ["results/rebuild/rebuild_a10/b25/model.safetensors", "results/rebuild/rebuild_a10/b10/ledger.json",
             "results/rebuild/search-de86e7107c2e/found.parquet", "results/rebuild/rebuild_a10/state-eac78e0d96b4.pt",
             "results/unlearning/piu_100/36/model.safetensors"]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    matched = {path.relative_to(tmp_path).as_posix() for pattern in AUDIT_PATTERNS
               for path in tmp_path.glob(pattern.replace("{results}", "results"))}
    assert matched == set(files[:3])
