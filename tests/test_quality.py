import numpy as np
import pandas as pd
import pytest

from idunlearn.evaluation.metrics import run_metrics
from idunlearn.evaluation.quality import DetectorScoreQuality, EDifFIQAQuality, build_quality
from idunlearn.faces.align import ARCFACE_TEMPLATE_112, align_face

from tiny_onnx import pooled_linear_onnx


def tiny_quality_model(path, weights, batch="N"):
    """An ONNX 'quality model': per-channel global mean, then a dot product with ``weights`` -> (N, 1)."""
    pooled_linear_onnx(path, np.reshape(weights, (3, 1)), "input", "score", "tiny_quality", batch=batch)


def test_ediffiqa_scores_faces_in_minus_one_to_one_nchw(tmp_path):
    tiny_quality_model(tmp_path / "q.onnx", [1.0, 0.0, 0.0])  # the score is the mean red value in [-1, 1]
    quality = EDifFIQAQuality(tmp_path / "q.onnx")
    faces = np.zeros((2, 112, 112, 3), np.uint8)
    faces[0, ..., 0] = 255  # red 255 -> +1
    faces[1, ..., 1] = 255  # green only: red 0 -> -1
    np.testing.assert_allclose(quality.score_faces(faces), [1.0, -1.0], atol=1e-6)


def test_ediffiqa_with_a_fixed_batch_of_one_scores_one_face_at_a_time(tmp_path):
    # the OpenCV zoo's export, ediffiqa_tiny_jun2024.onnx, takes [1, 3, 112, 112]: a batch of 3 would not run
    tiny_quality_model(tmp_path / "fixed.onnx", [1.0, 0.0, 0.0], batch=1)
    tiny_quality_model(tmp_path / "free.onnx", [1.0, 0.0, 0.0])
    faces = np.random.default_rng(2).integers(0, 256, size=(3, 112, 112, 3), dtype=np.uint8)
    fixed = EDifFIQAQuality(tmp_path / "fixed.onnx")
    assert fixed.batch_size == 1
    np.testing.assert_allclose(fixed.score_faces(faces), EDifFIQAQuality(tmp_path / "free.onnx").score_faces(faces),
                               atol=1e-6)
    np.testing.assert_allclose(fixed.score_faces(faces), faces[..., 0].mean(axis=(1, 2)) / 127.5 - 1.0, atol=1e-5)


def test_ediffiqa_session_takes_the_jobs_providers(tmp_path, monkeypatch):
    import onnxruntime

    from idunlearn.faces import insightface_backend

    tiny_quality_model(tmp_path / "q.onnx", [1.0, 0.0, 0.0])
    seen, session = [], onnxruntime.InferenceSession

    def recording(path, providers):
        seen.append(providers)
        return session(path, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(onnxruntime, "InferenceSession", recording)
    monkeypatch.setattr(insightface_backend, "onnx_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    EDifFIQAQuality(tmp_path / "q.onnx")
    assert seen == [["CUDAExecutionProvider", "CPUExecutionProvider"]]


def test_ediffiqa_aligns_detected_samples_and_leaves_undetected_nan(tmp_path):
    tiny_quality_model(tmp_path / "q.onnx", [0.0, 0.0, 1.0])
    quality = EDifFIQAQuality(tmp_path / "q.onnx")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(2, 112, 112, 3), dtype=np.uint8)
    landmarks = ARCFACE_TEMPLATE_112.reshape(-1).tolist()  # already aligned: the alignment is the identity warp
    scored = pd.DataFrame({"detected": [True, False], "landmarks": [landmarks, None]})
    scores = quality(images, scored)
    aligned = align_face(images[0], ARCFACE_TEMPLATE_112, 112)
    assert scores[0] == pytest.approx(aligned[..., 2].mean() / 127.5 - 1.0, abs=1e-5)
    assert np.isnan(scores[1])


def test_missing_ediffiqa_file_names_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="evaluation.quality.ediffiqa_onnx"):
        build_quality({"ediffiqa_onnx": str(tmp_path / "absent.onnx")})
    assert isinstance(build_quality({"ediffiqa_onnx": None}), DetectorScoreQuality)


def test_run_metrics_quality_is_the_mean_over_detected_samples():
    scored = pd.DataFrame({
        "kind": ["forget", "forget", "retain", "retain"], "own_cosine": [0.5, 0.0, 0.9, 0.7],
        "anchor_cosine": [0.1, 0.0, 0.2, 0.3], "predicted_identity": [1, -1, 2, 3],
        "target_identity": [1, 1, 2, 2], "detected": [True, False, True, True], "det_score": [0.9, 0.0, 0.8, 0.6]})
    scored["quality"] = DetectorScoreQuality()(None, scored)
    assert np.isnan(scored["quality"][1])
    feats = np.random.default_rng(1).normal(size=(4, 3))
    out = run_metrics(scored, feats, feats, {"num_subsets": 2, "max_subset_size": 2, "seed": 0})
    assert out["quality_forget"] == pytest.approx(0.9)  # the undetected sample has no quality
    assert out["quality_retain"] == pytest.approx(0.7)
    assert out["ism_forget"] == pytest.approx(0.25) and out["acc_retain"] == pytest.approx(0.5)


def test_the_paper_config_names_the_published_ediffiqa_file():
    import yaml
    from pathlib import Path

    from conftest import REPO
    from idunlearn.evaluation.quality import EDIFFIQA_ONNX

    paper = yaml.safe_load((REPO / "config" / "celebahq.yaml").read_text())
    # the OpenCV zoo's file (opencv_zoo models/face_image_quality_assessment_ediffiqa/ediffiqa_tiny_jun2024.onnx)
    assert EDIFFIQA_ONNX == "ediffiqa_tiny_jun2024.onnx"
    assert Path(paper["evaluation"]["quality"]["ediffiqa_onnx"]).name == EDIFFIQA_ONNX
