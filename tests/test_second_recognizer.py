"""Forgetting audit, part 7: the independent second recognizer (dlib's ResNet descriptor) and the rows it adds."""

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from idunlearn.audit.second_recognizer import (SecondRecognizer, reference_centroids, second_evaluation_rows,
                                               second_probe_rows)
from idunlearn.faces.analyser import load_rgb
from idunlearn.faces.dlib_descriptor import DlibDescriptor


def orl_faces(manifest: pd.DataFrame, people=("s1", "s2", "s3"), per_person: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rows = manifest[manifest["true_identity"].isin(people)].groupby("true_identity").head(per_person)
    return np.stack([load_rgb(p) for p in rows["path"]]), rows["true_identity"].to_numpy()


def same_vs_other(emb: np.ndarray, people: np.ndarray) -> tuple[float, float]:
    cos = emb @ emb.T
    same = people[:, None] == people[None]
    off = ~np.eye(len(people), dtype=bool)
    return float(cos[same & off].mean()), float(cos[~same].mean())


def test_dlib_descriptor_tells_people_apart_on_crops_and_on_whole_frames(orl_manifest, dlib_models_dir):
    faces, people = orl_faces(orl_manifest)
    emb, detected = DlibDescriptor(dlib_models_dir, "aligned").embed(faces)
    assert detected.all() and emb.shape == (9, 128)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)
    same, other = same_vs_other(emb, people)
    assert same > other + 0.01  # dlib descriptors are not centred: different people still sit at cosine ~0.9

    # detect mode: the same faces, upscaled and pasted into larger frames, are found and told apart the same way
    frames = np.full((len(faces), 400, 400, 3), 128, np.uint8)
    for frame, face in zip(frames, faces):
        big = np.asarray(Image.fromarray(face).resize((184, 224), Image.BICUBIC))
        frame[90:314, 108:292] = big
    detect = DlibDescriptor(dlib_models_dir, "detect")
    framed, found = detect.embed(frames)
    assert found.sum() >= 8
    same_d, other_d = same_vs_other(framed[found], people[found])
    assert same_d > other_d + 0.01
    blank, none = detect.embed(np.full((1, 200, 200, 3), 128, np.uint8))
    assert not none.any() and not blank.any()


class StandIn:
    """A descriptor that returns given embeddings (one per image, looked up by the image's first pixel)."""

    def __init__(self, table: dict[int, np.ndarray | None]):
        self.table = table

    def embed(self, images):
        rows = [self.table[int(im[0, 0, 0])] for im in images]
        detected = np.array([r is not None for r in rows])
        emb = np.stack([r / np.linalg.norm(r) if r is not None else np.zeros(2) for r in rows])
        return emb, detected


def image(key: int) -> np.ndarray:
    return np.full((4, 4, 3), key, np.uint8)


def test_second_recognizer_rows_by_hand():
    centroids = pd.DataFrame({"identity": [1, 2], "centroid": [np.array([1.0, 0.0]), np.array([0.0, 1.0])]})
    # sample 0: on identity 1 (cos 1); 1: between, nearer 1 (cos 0.8 to 1); 2: nearer 2; 3: no face
    second = SecondRecognizer(StandIn({0: np.array([1.0, 0.0]), 1: np.array([0.8, 0.6]), 2: np.array([0.6, 0.8]),
                                       3: None}), centroids, tau=0.7)
    images = np.stack([image(k) for k in range(4)])
    fa, ism = second.rows("attack", "best", [1, 1, 1, 1], images)
    assert (fa["metric"], ism["metric"]) == ("fa_second", "ism_second")
    assert fa["value"] == pytest.approx(2 / 4) and fa["n"] == 4  # 0 and 1 verified; 2 is nearer 2; 3 has no face
    assert ism["value"] == pytest.approx((1.0 + 0.8 + 0.6 + 0.0) / 4)
    with pytest.raises(ValueError, match="no centroid for identities \\[9\\]"):
        second.score([9], images[:1])

    # probe rows per (probe, setting), images taken in the scored table's order
    scored = pd.DataFrame({"probe": ["leak", "leak", "photo"], "setting": ["m", "m", "train"],
                           "target_identity": [1, 1, 2]}, index=[5, 6, 7])
    rows = {(r["probe"], r["metric"]): r["value"] for r in second_probe_rows(second, scored, images[[0, 2, 2]])}
    assert rows[("leak", "fa_second")] == pytest.approx(0.5) and rows[("photo", "fa_second")] == 1.0

    # the evaluation's forget samples are matched to images.npz by sample id, whatever the order
    samples = pd.DataFrame({"sample_id": ["f0", "r0", "f1"], "kind": ["forget", "retain", "forget"],
                            "target_identity": [1, 2, 1]})
    arrays = {"sample_ids": np.array(["f1", "r0", "f0"]), "samples": images[[3, 2, 0]]}
    fa, _ = second_evaluation_rows(second, samples, arrays)
    assert fa["value"] == pytest.approx(0.5) and fa["n"] == 2  # f0 verified, f1 has no face


def test_reference_centroids_average_only_described_faces():
    reference = pd.DataFrame({"identity": [1, 1, 1, 2], "detected": [True, True, False, True],
                              "embedding": [np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.array([5.0, 5.0]),
                                            np.array([0.0, 2.0])]})
    cents = reference_centroids(reference).set_index("identity")
    np.testing.assert_allclose(cents.loc[1, "centroid"], np.array([1.0, 1.0]) / np.sqrt(2))
    assert cents.loc[1, "size"] == 2 and cents.loc[2, "size"] == 1
