import json

import numpy as np
import pandas as pd
import pytest

import idunlearn.faces.analyser as analyser
from idunlearn.models.pretrain import train_mini_generator, training_faces

TINY = {"image_size": 8, "channels": 1, "text_width": 32, "text_heads": 2, "block_out_channels": [32, 32, 32, 32],
        "layers_per_block": 1}
TRAINING = {"steps": 2, "batch_size": 4, "lr": 1e-4, "weight_decay": 0.0, "ema_decay": 0.9, "cond_dropout": 0.5,
            "seed": 0, "checkpoint_every": 1, "monitor_every": 1}


def _world(n_identities=4, per_identity=3):
    ids = [f"img{i}" for i in range(n_identities * per_identity)]
    identity = np.repeat(np.arange(n_identities), per_identity)
    faces = pd.DataFrame({"image_id": ids, "status": ["ok"] * len(ids),
                          "landmarks": [np.zeros((5, 2))] * len(ids),
                          "embedding": list(np.random.default_rng(0).normal(size=(len(ids), 16)))})
    faces.loc[1, "status"] = "no_face"
    manifest = pd.DataFrame({"image_id": ids, "path": [f"/photos/{i}.png" for i in ids]})
    labels = pd.DataFrame({"image_id": ids, "identity": identity})
    return manifest, faces, labels


def test_training_with_excluded_identities_never_reads_their_images(tmp_path, monkeypatch):
    manifest, faces, labels = _world()
    read = []

    def fake_crops(paths, landmarks):
        read.extend(paths)
        return np.full((len(paths), 112, 112, 3), 128, dtype=np.uint8)

    monkeypatch.setattr(analyser, "aligned_crops", fake_crops)
    train_mini_generator(manifest, faces, TINY, TRAINING, tmp_path / "model", tmp_path / "state.pt",
                         labels=labels, exclude_identities=[1, 3], provenance={"command": "test"})
    excluded = set(manifest["path"][labels["identity"].isin([1, 3])])
    assert read and not excluded & set(read)
    # every other detected face is read (image 1 has no face)
    assert set(read) == set(manifest["path"]) - excluded - {"/photos/img1.png"}
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert saved["excluded_identities"] == [1, 3] and saved["images"] == len(read)
    assert saved["produced_by"] == {"command": "test"}


def test_without_exclusion_every_detected_face_trains():
    manifest, faces, labels = _world()
    assert list(training_faces(faces)["image_id"]) == list(faces["image_id"][faces["status"] == "ok"])
    assert len(training_faces(faces, labels, [0])) == len(faces) - 1 - 2  # no_face + identity 0's other two


def test_excluding_an_unknown_identity_is_refused():
    _, faces, labels = _world()
    with pytest.raises(ValueError, match=r"exclude_identities: \[9\]"):
        training_faces(faces, labels, [9])
    with pytest.raises(ValueError, match="labels"):
        training_faces(faces, None, [1])
