"""Job archives: finished Snakemake jobs carried to another machine, so that a long run (the study's audit: 84 jobs,
more than one sitting of 2 cores) resumes there from where it stopped instead of from the start.

An archive is a folder holding chosen output files of a working directory (``files/<path>``), Snakemake's metadata
record of each (``metadata/<record name>``: the rule, its params, input list and code, which Snakemake compares to
decide whether a job must run again) and ``MANIFEST.json`` (sha256 and size of every file, when its job ended and
the commit checked out where it was archived: the commit that ran it when saved right after the run, as
tools/audit_by_identity.sh does). Restoring copies them back, checked against their checksums, with their
modification time set to now: a restored output is then newer than every input built before it, and Snakemake treats
its job as done unless its params, input list or rule changed (then it runs again, as it would have on the original
machine). Snakemake notices a changed `script:` by its modification time, which a restored output would hide, so
``restore_jobs`` leaves out (as stale) every output whose rule's script differs from the commit checked out where it was
archived.

Snakemake reruns every job that consumes the output of a job it runs, so the inputs the archived jobs share with
jobs still to run (the selection, the verification threshold, the original model's evaluation of each identity)
must be built *before* restoring and before the resumed run; ``restore_jobs`` refuses while one of them is missing and
names them. Inputs private to one archived job (the archive's ``private`` globs: for the audit, its run's unlearned
model and evaluation) may stay missing: no other job asks for them.

A job's private inputs are archived while the job itself has not finished (``pending``: an unlearned model and its
evaluation's images before their audit job ends), so that a run stopped between the two continues elsewhere with the
audit instead of redoing the unlearning; once the job's own output is archived they are dropped again.

Shared inputs rebuilt on another machine need not be bit-identical (face embeddings differ in the sixth decimal
between CPUs), so the manifest records the sha256 of every shared input that the archived jobs read, each version
seen (``shared_inputs``), and ``restore_jobs`` names the ones that differ here: a table then mixes jobs that read
different inputs and can differ in its last digits from a run made on one machine.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import time
from base64 import urlsafe_b64encode
from pathlib import Path

from .io import atomic_path, read_json, sha256_file, write_json

MANIFEST = "MANIFEST.json"
# The study audit's finished jobs: every audit job's rows (the audit tables read nothing else of them), the tuning
# protocol's choice with its identity selection (the <run>.tuned runs read the choice), and each run's evaluation
# metrics, samples and training time (SRK, KD and cost per identity beside the audit, without retraining); not the
# unlearned models and images (megabytes each, read by that run's audit job alone). The rebuilt generators are kept
# whole (each budget's job resumes the smaller one's and their evaluation and worst-case jobs read them, so a missing
# one would redo them all), without their resume states. The original model's evaluation is rebuilt by target
# audit_inputs.
AUDIT_PATTERNS = ("{results}/audit/before/*/rows.parquet", "{results}/audit/after/*/*/rows.parquet",
                  "{results}/audit/external/*/*/rows.parquet", "{results}/audit/worstcase/*/*/rows.parquet",
                  "{results}/audit/worstcase/external/*/*/rows.parquet",
                  "{results}/audit/attack_samples/*/*/rows.parquet",
                  "{results}/audit/attack_samples/external/*/*/rows.parquet", "{results}/tables/tuning/*",
                  "{results}/tuning/selection/*", "{results}/tuning/selection/identities/*",
                  "{results}/evaluation/after/*/*/metrics.json", "{results}/evaluation/after/*/*/samples.parquet",
                  "{results}/evaluation/external/*/*/metrics.json",
                  "{results}/evaluation/external/*/*/samples.parquet", "{results}/unlearning/*/*/timings.json",
                  "{results}/rebuild/search-*/*", "{results}/rebuild/*/b*/*")
# Inputs of one audit job alone (a run's unlearned model and its evaluation on one identity): they may stay unbuilt.
# fnmatch's * also matches '/'. The tuning's own jobs are private to its choice, which the archive holds.
AUDIT_PRIVATE = ("{results}/unlearning/*", "{results}/evaluation/after/*", "{results}/evaluation/external/*",
                 "{results}/tuning/*")
# Private inputs archived until the job that reads them is (pattern, that job's output; {run} and {identity} stand
# for one path component each): every output of the unlearning job and of its evaluation, until its audit's rows.
AUDIT_PENDING = (("{results}/unlearning/{run}/{identity}/*", "{results}/audit/after/{run}/{identity}/rows.parquet"),
                 ("{results}/evaluation/after/{run}/{identity}/*",
                  "{results}/audit/after/{run}/{identity}/rows.parquet"))


class ArchiveError(RuntimeError):
    """An archive that cannot be saved or restored as asked; the message says what to do."""


def record_name(path: str, max_len: int = 255) -> str:
    """Snakemake's metadata record path of an output ``path`` (relative to .snakemake/metadata): the urlsafe base64
    of the path, split into '@'-prefixed folders where it exceeds a file name's length (persistence/file.py)."""
    encoded = urlsafe_b64encode(path.encode()).decode()
    parts = [encoded[i:i + max_len - 1] for i in range(0, len(encoded), max_len - 1)]
    return os.path.join(*["@" + p for p in parts[:-1]], parts[-1])


def _metadata_record(workdir: Path, path: str) -> str | None:
    """The record name of ``path`` or of the folder output holding it (a ``directory()`` output), if Snakemake
    wrote one."""
    candidate = Path(path)
    for owner in (candidate, *candidate.parents[:-1]):
        name = record_name(owner.as_posix())
        if (workdir / ".snakemake" / "metadata" / name).is_file():
            return name
    return None


def _git_commit(workdir: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(workdir), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def finished_outputs(workdir: Path, patterns) -> list[str]:
    """Outputs matching ``patterns`` (globs relative to ``workdir``) that a finished job wrote: Snakemake has a
    metadata record of them and no incomplete-job marker (a job running now, or killed, is left out)."""
    found = set()
    for pattern in patterns:
        for path in workdir.glob(pattern):
            rel = path.relative_to(workdir).as_posix()
            running = (workdir / ".snakemake" / "incomplete" / record_name(rel)).exists()
            if (path.is_file() and not path.name.startswith(".") and not running
                    and _metadata_record(workdir, rel) is not None):
                found.add(rel)
    return sorted(found)


def _template_regex(template: str) -> tuple[str, re.Pattern]:
    """A path ``template`` whose {name} placeholders stand for one path component each, as a glob and as a regex
    that captures them (a ``*`` in the template matches one component too)."""
    parts = re.split(r"\{(\w+)\}", template)
    glob = "".join("*" if i % 2 else part for i, part in enumerate(parts))
    regex = "".join(f"(?P<{part}>[^/]+)" if i % 2 else re.escape(part).replace(r"\*", "[^/]+")
                    for i, part in enumerate(parts))
    return glob, re.compile(regex + "$")


def pending_outputs(workdir: Path, pending, done) -> dict[str, str]:
    """Finished outputs matching a ``pending`` pattern, themselves not in ``done``, whose job's output (its pair's
    template) is not in ``done`` either: {output: the job's output it waits for}."""
    waiting = {}
    for pattern, until in pending:
        glob, regex = _template_regex(pattern)
        for rel in finished_outputs(workdir, [glob]):
            consumer = until.format(**regex.match(rel).groupdict())
            if rel not in done and consumer not in done:
                waiting[rel] = consumer
    return waiting


def save_jobs(workdir: str | os.PathLike, archive: str | os.PathLike, patterns, private=(), pending=()) -> dict:
    """Add every finished output of ``workdir`` matching ``patterns`` to ``archive`` (created if absent; files
    already there are replaced by the newer run's). ``private``: globs of inputs that belong to one archived job
    alone (restore_jobs lets them be missing). ``pending``: (pattern, output) pairs of such inputs archived until
    the job that reads them has finished (its ``output``, the pattern's {placeholders} filled in, is archived);
    those archived before are dropped then. Returns the manifest."""
    workdir, archive = Path(workdir), Path(archive)
    manifest = read_json(archive / MANIFEST) if (archive / MANIFEST).is_file() else {"files": {}}
    manifest["private"] = sorted(set(manifest.get("private", [])) | set(private))
    paths = finished_outputs(workdir, patterns)
    if not paths:
        raise ArchiveError(f"no finished output under {workdir} matches {list(patterns)}: nothing to archive "
                           "(run the workflow there first, or check --results)")
    done = {rel for rel, entry in manifest["files"].items() if "until" not in entry} | set(paths)
    waiting = pending_outputs(workdir, pending, done)
    commit = _git_commit(workdir)
    saved_records = set()
    for rel in [*paths, *waiting]:
        digest = sha256_file(workdir / rel)
        if manifest["files"].get(rel, {}).get("sha256") == digest:
            continue  # archived already (or restored from it): keep its provenance
        record = _metadata_record(workdir, rel)
        saved_records.add(record)
        for source, target in ((workdir / rel, archive / "files" / rel),
                               (workdir / ".snakemake" / "metadata" / record, archive / "metadata" / record)):
            with atomic_path(target) as tmp:
                shutil.copyfile(source, tmp)
        ended = read_json(workdir / ".snakemake" / "metadata" / record).get("endtime")
        manifest["files"][rel] = {"sha256": digest, "bytes": (workdir / rel).stat().st_size, "metadata": record,
                                  "checkout": commit, "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                             time.gmtime(ended)) if ended else None}
        if rel in waiting:
            manifest["files"][rel]["until"] = waiting[rel]
    _drop_finished_pending(archive, manifest)
    seen = manifest.setdefault("shared_inputs", {})
    for path, digest in _shared_input_digests(workdir, archive, manifest, saved_records).items():
        if digest not in seen.setdefault(path, []):
            seen[path].append(digest)
    manifest["saved"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    write_json(manifest, archive / MANIFEST)
    return manifest


def _drop_finished_pending(archive: Path, manifest: dict) -> None:
    """Remove from ``archive`` the pending files whose job's output it now holds, with their metadata records (the
    manifest is written by the caller; a file left behind by a crash before that is only unlisted)."""
    finished = [rel for rel, entry in manifest["files"].items() if entry.get("until") in manifest["files"]
                and "until" not in manifest["files"][entry["until"]]]
    for rel in finished:
        record = manifest["files"].pop(rel)["metadata"]
        (archive / "files" / rel).unlink(missing_ok=True)
        if all(entry["metadata"] != record for entry in manifest["files"].values()):
            (archive / "metadata" / record).unlink(missing_ok=True)


def _shared_input_digests(workdir: Path, archive: Path, manifest: dict, records) -> dict[str, str]:
    """sha256 in ``workdir`` of the shared inputs read by the jobs of the metadata ``records`` (folders, such as
    installed models, are left out)."""
    read = set()
    for record in records:
        read.update(read_json(archive / "metadata" / record).get("input") or [])
    return {p: sha256_file(workdir / p) for p in sorted(read.intersection(shared_inputs(archive, manifest)))
            if (workdir / p).is_file()}


def shared_inputs(archive: Path, manifest: dict) -> list[str]:
    """Inputs the archived jobs recorded, except the manifest's private ones and its own files: a resumed run
    would build a missing one for the jobs still to run and so run the archived jobs that read it again."""
    recorded = set()
    for record in {entry["metadata"] for entry in manifest["files"].values()}:
        recorded.update(read_json(archive / "metadata" / record).get("input") or [])
    private = manifest.get("private", [])
    return sorted(p for p in recorded - set(manifest["files"])
                  if not any(fnmatch.fnmatch(p, pattern) for pattern in private))


def inputs_to_build(archive: str | os.PathLike, workdir: str | os.PathLike, manifest: dict | None = None) -> list[str]:
    """The shared inputs of the archived jobs not yet in ``workdir``: the targets to build before ``restore_jobs``
    (``manifest``: the archive's, when already read)."""
    archive, workdir = Path(archive), Path(workdir)
    manifest = manifest or _read_manifest(archive)
    return [p for p in shared_inputs(archive, manifest) if not (workdir / p).exists()]


def _read_manifest(archive: Path) -> dict:
    if not (archive / MANIFEST).is_file():
        raise ArchiveError(f"{archive} holds no {MANIFEST}: not a job archive (made by `python -m idunlearn "
                           "archive save`)")
    return read_json(archive / MANIFEST)


def rule_script(record: dict, workdir: Path) -> str | None:
    """The script of a ``script:`` rule (relative to ``workdir``) from its metadata record's code: a path relative
    to the rule's file, which lives in rules/ or beside the Snakefile."""
    match = re.search(r'"([^"]+\.py)"', record.get("code") or "")
    if not match:
        return None
    candidates = [os.path.normpath(os.path.join("rules", match.group(1))), os.path.normpath(match.group(1))]
    return next((c for c in candidates if (workdir / c).is_file()), None)


def script_changed(workdir: Path, checkout: str | None, script: str | None) -> bool:
    """Whether ``script`` differs from its version at commit ``checkout`` (False when either is unknown: git
    cannot tell, e.g. in a shallow clone)."""
    if not checkout or not script:
        return False
    proc = subprocess.run(["git", "-C", str(workdir), "diff", "--quiet", checkout, "--", script],
                          capture_output=True)
    return proc.returncode == 1


def restore_jobs(archive: str | os.PathLike, workdir: str | os.PathLike) -> dict:
    """Copy the archive's files and metadata records into ``workdir``, each checked against its sha256,
    modification times set to now. A different file already in ``workdir`` is kept (that machine's own run of the
    job); one whose rule's script changed since it was archived is left out (stale). Returns {"restored": [...],
    "kept": [...], "stale": [...], "differ": [...], "mixed": [...]}: ``differ`` the shared inputs here whose sha256
    is none that the archived jobs read, ``mixed`` those the archived jobs read in more than one version. Raises
    ArchiveError, before copying anything, on a damaged archive or while a shared input is missing."""
    archive, workdir = Path(archive), Path(workdir)
    manifest = _read_manifest(archive)
    entries = manifest["files"]
    for rel, entry in entries.items():
        stored = archive / "files" / rel
        if not stored.is_file() or sha256_file(stored) != entry["sha256"]:
            raise ArchiveError(f"{stored}: missing or its sha256 differs from {archive / MANIFEST}; the archive is "
                               "damaged: check it out again (git checkout -- <archive>)")
        if not (archive / "metadata" / entry["metadata"]).is_file():
            raise ArchiveError(f"{archive}: the metadata record of {rel} is missing; the archive is damaged")
    missing = inputs_to_build(archive, workdir, manifest)
    if missing:
        raise ArchiveError(f"the archived jobs share {len(missing)} inputs that are not built here yet; a resumed "
                           "run would build them and so run the archived jobs again. Build them first (with the "
                           "archived run's --configfile), then restore: " + " ".join(missing))
    now = time.time()
    seen = sorted(manifest.get("shared_inputs", {}).items())
    done = {"restored": [], "kept": [], "stale": [],
            "differ": [p for p, digests in seen if (workdir / p).is_file() and sha256_file(workdir / p) not in digests],
            "mixed": [p for p, digests in seen if len(digests) > 1]}
    for rel, entry in sorted(entries.items()):
        target = workdir / rel
        record = read_json(archive / "metadata" / entry["metadata"])
        if script_changed(workdir, entry.get("checkout"), rule_script(record, workdir)):
            done["stale"].append(rel)  # its job runs again, as Snakemake would have rerun it where it ran
            continue
        if target.exists() and sha256_file(target) != entry["sha256"]:
            done["kept"].append(rel)  # this machine's own run of the job
            continue
        # an identical file is restored too: its time must not fall behind the other restored files (its inputs)
        for source, dest in ((archive / "files" / rel, target),
                             (archive / "metadata" / entry["metadata"],
                              workdir / ".snakemake" / "metadata" / entry["metadata"])):
            with atomic_path(dest) as tmp:
                shutil.copyfile(source, tmp)
            os.utime(dest, (now, now))
        done["restored"].append(rel)
    return done
