"""The paper path's `hf download` commands (idunlearn.hub_downloads): docs/paper-setup.md shows them, the installed
CLI accepts them, and the files they name are exactly those the stand-in hub (tests/paper_hub.py) lays out and the
loaders open from it (seen by the kernel's inotify, so files opened by safetensors, pyarrow and onnxruntime count)."""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import struct
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from idunlearn.hub_downloads import HF, download_block, download_commands, paper_downloads
from paper_hub import build_paper_hub

PAPER = yaml.safe_load((REPO / "config" / "celebahq.yaml").read_text())
DOWNLOADS = paper_downloads(PAPER)
CACHED = [d for d in DOWNLOADS if d.local_dir is None]  # the rest goes to a path of the config, not the cache


@pytest.fixture(scope="module")
def hub(tmp_path_factory, orl_wheel):
    return build_paper_hub(tmp_path_factory.mktemp("hub"), orl_wheel, PAPER["dataset"]["celebahq"], people=3,
                           shots=2, singletons=0)


def snapshot(hub, download) -> Path:
    return hub.cache / f"{download.repo_type}s--{download.repo.replace('/', '--')}" / "snapshots" / download.revision


def laid_out(hub, download) -> set[str]:
    folder = snapshot(hub, download)
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()}


def named(download, available: set[str]) -> set[str]:
    """What the command fetches from a repository holding ``available``: its files, and what its patterns match
    (fnmatch, as huggingface_hub filters)."""
    return set(download.files) | {f for f in available if any(fnmatch(f, p) for p in download.include)}


def test_the_page_shows_every_command():
    page = (REPO / "docs" / "paper-setup.md").read_text()
    blocks = [block for block in re.findall(r"```sh\n(.*?)\n```", page, re.S) if f"{HF} download" in block]
    assert blocks == [download_block(PAPER)], "docs/paper-setup.md: copy the block idunlearn.hub_downloads gives"
    assert len(download_commands(PAPER)) == len(DOWNLOADS) == 6


def test_every_hub_artefact_is_pinned_but_ediffiqa():
    assert {d.repo for d in DOWNLOADS if d.revision is None} == {"opencv/face_image_quality_assessment_ediffiqa"}
    assert all(re.fullmatch(r"[0-9a-f]{40}", d.revision) for d in CACHED)


def test_the_stand_in_hub_holds_exactly_the_named_files(hub):
    assert {p.name for p in hub.cache.iterdir()} == {snapshot(hub, d).parents[1].name for d in CACHED}
    for download in CACHED:
        files = laid_out(hub, download)
        assert files == named(download, files), download.repo
    dataset = next(d for d in CACHED if d.include)  # named by pattern: the shards' names carry a hash
    assert len(named(dataset, laid_out(hub, dataset))) == 6
    quality = next(d for d in DOWNLOADS if d.local_dir)
    assert Path(quality.local_dir) / quality.files[0] == Path(PAPER["evaluation"]["quality"]["ediffiqa_onnx"])
    assert hub.ediffiqa.name == quality.files[0]


def test_the_installed_cli_runs_each_command_offline_on_the_stand_in_hub(hub):
    env = {**os.environ, **hub.environment()}
    cli = str(Path(sys.executable).parent / "hf")
    for download in CACHED:
        words = shlex.split(download.command())
        assert words[0] == HF
        proc = subprocess.run([cli, *words[1:]], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (download.command(), proc.stderr[-2000:])
        assert str(snapshot(hub, download)) in proc.stdout


def test_a_file_the_stand_in_lacks_fails_offline(hub):
    env = {**os.environ, **hub.environment()}
    download = next(d for d in CACHED if len(d.files) == 1)
    words = shlex.split(download.command())
    words[3] = "not_there.onnx"
    proc = subprocess.run([str(Path(sys.executable).parent / "hf"), *words[1:]], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0


LOADERS = """
import sys
from pathlib import Path
from idunlearn.data import acquire_celebahq
from idunlearn.evaluation.features import DinoV2Features
from idunlearn.faces.insightface_backend import download_paper_face_models
from idunlearn.models.arc2face import load_arc2face

work = Path(sys.argv[1])
dataset = {dataset!r}
acquire_celebahq(dataset["repo"], dataset["revision"], dataset["split"], work / "assets", work / "images")
download_paper_face_models(work / "faces")
load_arc2face("cpu", local_files_only=True)
DinoV2Features.from_hub()
"""

IN_OPEN = 0x20  # <sys/inotify.h>


def opened_blobs(folders: list[Path], run) -> set[str]:
    """Names of the files in ``folders`` that anything opened while ``run()`` ran (inotify IN_OPEN)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    assert fd >= 0, f"inotify_init1: errno {ctypes.get_errno()}"
    try:
        watches = {libc.inotify_add_watch(fd, str(folder).encode(), IN_OPEN): folder for folder in folders}
        assert min(watches) >= 0
        run()
        names, data = set(), b""
        while True:
            try:
                data += os.read(fd, 1 << 20)
            except BlockingIOError:
                break
        offset = 0
        while offset < len(data):
            watch, _, _, size = struct.unpack_from("iIII", data, offset)
            name = data[offset + 16:offset + 16 + size].rstrip(b"\0").decode()
            if name:  # an empty name is the folder itself being listed
                names.add(str(watches[watch] / name))
            offset += 16 + size
        return names
    finally:
        os.close(fd)


@pytest.mark.slow
def test_the_loaders_open_exactly_the_named_files(hub, tmp_path):
    env = {**os.environ, **hub.environment(), "OMP_NUM_THREADS": "1"}
    script = LOADERS.format(dataset=PAPER["dataset"]["celebahq"])
    blobs = sorted({(snapshot(hub, d).parents[1] / "blobs").resolve() for d in CACHED})

    def run():
        proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]

    opened = opened_blobs(blobs, run)
    for download in CACHED:
        links = {f: (snapshot(hub, download) / f).resolve() for f in laid_out(hub, download)}
        assert len(set(links.values())) == len(links), f"{download.repo}: files share a blob, reads are ambiguous"
        read = {f for f, blob in links.items() if str(blob) in opened}
        assert read == named(download, set(links)), download.repo


def test_the_config_decides_the_dataset_dinov2_revision_and_ediffiqa():
    config = {**PAPER, "dataset": {"celebahq": {**PAPER["dataset"]["celebahq"], "split": "validation"}},
              "evaluation": {"kd": {"dinov2_revision": "a" * 40}, "quality": {"ediffiqa_onnx": None}}}
    by_repo = {d.repo: d for d in paper_downloads(config)}
    assert by_repo["jxie/celeba-hq"].include == ("data/validation-*.parquet",)
    assert by_repo["facebook/dinov2-large"].revision == "a" * 40
    assert "opencv/face_image_quality_assessment_ediffiqa" not in by_repo  # null: the detector-score proxy
    config["evaluation"]["quality"]["ediffiqa_onnx"] = "models/quality.onnx"
    with pytest.raises(ValueError, match="not named ediffiqa_tiny_jun2024.onnx"):
        paper_downloads(config)
