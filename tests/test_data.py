import io

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from idunlearn.assets import AssetError
from idunlearn.data import MANIFEST_COLUMNS, acquire_celebahq, acquire_dataset, acquire_folder
from idunlearn.io import sha256_file

REVISION = "7ecc6a45edfb5483ccf2f7df1035d298ffe7c76b"


def test_orl_manifest(orl_manifest):
    m = orl_manifest
    assert list(m.columns) == MANIFEST_COLUMNS
    assert len(m) == 400 and m["true_identity"].nunique() == 40
    assert (m.groupby("true_identity").size() == 10).all()
    assert m["image_id"].is_unique and (m["width"] == 92).all() and (m["height"] == 112).all()
    row = m.iloc[17]
    assert row["image_id"] == "orl_s02_08" and row["true_identity"] == "s2"
    assert sha256_file(row["path"]) == row["sha256"]


def test_max_images_truncates(default_config, orl_wheel, tmp_path):
    from conftest import ASSET_CACHE

    ds = dict(default_config["dataset"], max_images=25)
    assert len(acquire_dataset(ds, ASSET_CACHE, tmp_path)) == 25


def _jpeg(color):
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buf, format="JPEG")
    return buf.getvalue()


def _shard(path, colors, labels):
    images = [{"bytes": _jpeg(c), "path": f"{k}.jpg"} for k, c in enumerate(colors)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"image": images, "label": labels}), path)


def _fake_snapshot(calls, hub_cache):
    def snapshot_download(repo, repo_type, revision, allow_patterns):
        calls.append(dict(repo=repo, repo_type=repo_type, revision=revision, allow_patterns=allow_patterns))
        snapshot = hub_cache / f"datasets--{repo.replace('/', '--')}" / "snapshots" / revision
        _shard(snapshot / "data" / "train-00000-of-00002-a.parquet", ["red", "green"], [0, 1])
        _shard(snapshot / "data" / "train-00001-of-00002-b.parquet", ["blue"], [0])
        return str(snapshot)
    return snapshot_download


def test_celebahq_uses_pinned_revision_and_is_resumable(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _fake_snapshot(calls, tmp_path / "hub"))
    m = acquire_celebahq("mattymchen/celeba-hq", REVISION, "train", tmp_path / "cache", tmp_path / "img", 3, 2)
    # through the Hugging Face cache (no local_dir: offline, huggingface_hub reads only the cache)
    assert calls == [dict(repo="mattymchen/celeba-hq", repo_type="dataset", revision=REVISION,
                          allow_patterns=["data/train-*.parquet"])]
    assert m["image_id"].tolist() == ["celebahq_train_00000", "celebahq_train_00001", "celebahq_train_00002"]
    assert m["true_identity"].isna().all() and (m["source"] == f"celebahq@{REVISION}").all()
    mtimes = [p.stat().st_mtime_ns for p in sorted((tmp_path / "img").iterdir())]
    again = acquire_celebahq("mattymchen/celeba-hq", REVISION, "train", tmp_path / "cache", tmp_path / "img", 3, 2)
    assert [p.stat().st_mtime_ns for p in sorted((tmp_path / "img").iterdir())] == mtimes  # images kept, not rewritten
    pd.testing.assert_frame_equal(m, again)


def test_celebahq_shards_placed_by_hand_are_used_without_the_hub(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("the hub was asked"))
    _shard(tmp_path / "cache" / "celebahq" / REVISION / "data" / "train-00000-of-00001-x.parquet", ["red"], [1])
    assert len(acquire_celebahq("mattymchen/celeba-hq", REVISION, "train", tmp_path / "cache", tmp_path / "img")) == 1


@pytest.mark.parametrize("rows, shards, message", [(4, 2, "3 rows instead of 4"),
                                                   (3, 6, "2 shard(s) instead of 6"),
                                                   (28000, 6, "2 shard(s) instead of 6 and 3 rows instead of 28000")])
def test_an_incomplete_snapshot_stops_before_any_image_is_written(tmp_path, monkeypatch, rows, shards, message):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", _fake_snapshot([], tmp_path / "hub"))
    with pytest.raises(AssetError) as err:
        acquire_celebahq("mattymchen/celeba-hq", REVISION, "train", tmp_path / "cache", tmp_path / "img", rows, shards)
    assert message in str(err.value) and "expected_rows" in str(err.value) and REVISION in str(err.value)
    assert not (tmp_path / "img").exists() or not any((tmp_path / "img").iterdir())


def test_the_paper_dataset_defaults_are_the_train_split_of_28000_rows_in_6_shards():
    from idunlearn.config import validate_config

    celebahq = validate_config({})["dataset"]["celebahq"]
    assert (celebahq["expected_rows"], celebahq["expected_shards"]) == (28000, 6)  # PIU Section 4: 28k training images


def test_celebahq_offline_error_says_what_to_do(tmp_path, monkeypatch):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(AssetError) as err:
        acquire_celebahq("mattymchen/celeba-hq", REVISION, "train", tmp_path, tmp_path / "img")
    assert REVISION in str(err.value) and "--revision" in str(err.value) and "hub unreachable" in str(err.value)


def test_folder_lists_every_file_including_bad_ones(tmp_path):
    (tmp_path / "sub").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "sub" / "good image.png")
    (tmp_path / "empty.jpg").write_bytes(b"")
    m = acquire_folder(tmp_path)
    assert m["image_id"].tolist() == ["empty.jpg", "sub_good_image.png"]
    assert m["width"].isna().tolist() == [True, False]
    with pytest.raises(AssetError, match="not a folder"):
        acquire_folder(tmp_path / "missing")
