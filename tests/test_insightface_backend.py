"""The insightface backend with stand-in models (and tiny local ONNX files); nothing here touches the network."""

from __future__ import annotations

import huggingface_hub
import numpy as np
import pytest
from PIL import Image

from idunlearn.assets import AssetError
from idunlearn.faces import FaceStatus
from idunlearn.faces.align import ARCFACE_TEMPLATE_112
from idunlearn.faces.analyser import embedding_matrix
from idunlearn.faces.insightface_backend import (
    ARC2FACE_REPO,
    ARC2FACE_REVISION,
    DETECTOR_REPO,
    DETECTOR_REVISION,
    InsightFaceAnalyser,
    download_paper_face_models,
)

from paper_hub import face_landmarks
from tiny_onnx import pooled_linear_onnx


class StubDetector:
    """Answers like SCRFD.detect: (n, 5) boxes with scores, (n, 5, 2) keypoints; records its BGR inputs."""

    def __init__(self, boxes):
        self.boxes = [np.asarray(b, np.float32) for b in boxes]
        self.seen = []
        self.prepared = None

    def prepare(self, ctx_id, **kwargs):
        self.prepared = (ctx_id, kwargs)

    def detect(self, img, max_num=0):
        self.seen.append(img.copy())
        boxes = self.boxes if img.mean() > 60 else []  # a dark image has no face
        det = np.array([[*b, 0.9] for b in boxes], np.float32).reshape(-1, 5)
        kpss = np.array([face_landmarks(b) for b in boxes], np.float32).reshape(-1, 5, 2)
        return det, kpss


class StubRecognizer:
    """Answers like ArcFaceONNX.get_feat with unnormalised vectors; records each batch it receives."""

    def __init__(self):
        self.batches = []

    def get_feat(self, imgs):
        self.batches.append([img.copy() for img in imgs])
        means = np.array([img.reshape(-1, 3).mean(0) for img in imgs])  # (N, 3) channel means, BGR order
        feats = np.zeros((len(imgs), 512), np.float32)
        feats[:, :3] = means + 1.0
        feats[:, 3] = 40.0  # large norm: the analyser must normalise
        return feats


def write_image(path, rgb):
    Image.fromarray(rgb).save(path)
    return path


def coloured_image(size=(200, 240)):
    """Bright image whose red, green and blue channels differ, so a swapped channel order shows."""
    image = np.zeros((*size, 3), np.uint8)
    image[..., 0], image[..., 1], image[..., 2] = 220, 120, 40
    return image


def test_detector_gets_bgr_and_the_paper_settings():
    detector = StubDetector([[20, 30, 120, 150]])
    analyser = InsightFaceAnalyser(detector, StubRecognizer(), det_size=[256, 256], det_thresh=0.2)
    rgb = coloured_image()

    detections = analyser.detect(rgb)

    assert detector.prepared == (0, {"input_size": (256, 256), "det_thresh": 0.2})
    np.testing.assert_array_equal(detector.seen[0], rgb[:, :, ::-1])
    assert len(detections) == 1
    np.testing.assert_allclose(detections[0].box, [20, 30, 120, 150])
    assert detections[0].score == pytest.approx(0.9)
    np.testing.assert_allclose(detections[0].landmarks, face_landmarks([20, 30, 120, 150]), atol=1e-4)


def test_embed_sends_one_bgr_batch_and_normalises():
    recognizer = StubRecognizer()
    analyser = InsightFaceAnalyser(StubDetector([]), recognizer)
    faces = np.stack([coloured_image((112, 112)), np.full((112, 112, 3), 7, np.uint8)])

    embeddings = analyser.embed(faces)

    assert len(recognizer.batches) == 1
    np.testing.assert_array_equal(recognizer.batches[0][0], faces[0][:, :, ::-1])
    assert embeddings.shape == (2, 512) and embeddings.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-6)
    # BGR order reached the recognizer: its first component is the blue mean.
    assert embeddings[0, 0] < embeddings[0, 2]


def test_embed_leaves_a_zero_vector_zero():
    class ZeroRecognizer:
        def get_feat(self, imgs):
            return np.zeros((len(imgs), 512), np.float32)

    embeddings = InsightFaceAnalyser(StubDetector([]), ZeroRecognizer()).embed(np.zeros((1, 112, 112, 3), np.uint8))
    assert np.all(embeddings == 0)


def test_analyse_keeps_the_largest_face_and_reports_status(tmp_path):
    small, large = [10, 10, 60, 70], [70, 40, 190, 190]
    analyser = InsightFaceAnalyser(StubDetector([small, large, [150, 5, 190, 45]]), StubRecognizer())
    images = [
        ("bright", write_image(tmp_path / "bright.png", coloured_image())),
        ("dark", write_image(tmp_path / "dark.png", np.full((200, 240, 3), 10, np.uint8))),
        ("bright2", write_image(tmp_path / "bright2.jpg", coloured_image())),
    ]

    frame = analyser.analyse(images, batch_size=2, progress=False)

    assert frame["status"].tolist() == [FaceStatus.OK.value, FaceStatus.NO_FACE.value, FaceStatus.OK.value]
    assert frame.loc[0, "box"] == large
    np.testing.assert_allclose(np.reshape(frame.loc[0, "landmarks"], (5, 2)), face_landmarks(large), atol=1e-4)
    embeddings = embedding_matrix(frame)
    assert embeddings.shape == (2, 512)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-6)


def test_download_reads_the_pinned_revisions_through_the_hub_cache(tmp_path, monkeypatch):
    calls, cache = [], tmp_path / "cache"

    def fake_download(repo_id, filename, *, revision=None, token=None, **kwargs):
        calls.append((repo_id, filename, revision, token, sorted(kwargs)))
        path = cache / repo_id / revision / filename  # where huggingface_hub's cache would hold it
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"{repo_id} {filename}".encode())
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)

    paths = download_paper_face_models(tmp_path / "models", token="hf_x")

    # no local_dir: offline (HF_HUB_OFFLINE=1) only the cache is read, and a local_dir download would skip it
    assert sorted(calls) == sorted([
        (DETECTOR_REPO, "scrfd_10g_bnkps.onnx", DETECTOR_REVISION, "hf_x", []),
        (ARC2FACE_REPO, "arcface.onnx", ARC2FACE_REVISION, "hf_x", []),
    ])
    assert sorted(paths) == sorted([tmp_path / "models" / "scrfd_10g_bnkps.onnx", tmp_path / "models" / "arcface.onnx"])
    assert (tmp_path / "models" / "arcface.onnx").read_bytes() == f"{ARC2FACE_REPO} arcface.onnx".encode()
    assert ARC2FACE_REVISION == "321709b2e9697ea2a5bd06c8a51b340592333e1e"
    assert DETECTOR_REVISION == "ba0c3e10f4548361eb9a63265d87ce1140ab5a05"


def test_download_failure_is_an_asset_error(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("huggingface.co unreachable")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(AssetError, match="unreachable") as info:
        download_paper_face_models(tmp_path)
    assert "place it at" in str(info.value)


def test_from_dir_names_the_missing_files(tmp_path):
    with pytest.raises(AssetError) as info:
        InsightFaceAnalyser.from_dir(tmp_path)
    message = str(info.value)
    assert "scrfd_10g_bnkps.onnx" in message and "arcface.onnx" in message
    assert "download_paper_face_models" in message and ARC2FACE_REVISION in message

    (tmp_path / "scrfd_10g_bnkps.onnx").write_bytes(b"")
    with pytest.raises(AssetError, match="arcface.onnx") as info:
        InsightFaceAnalyser.from_dir(tmp_path)
    assert "scrfd_10g_bnkps.onnx from" not in str(info.value)


# --- from_dir with tiny ONNX models shaped like SCRFD (9 outputs) and ArcFace (N x 3 x 112 x 112 -> N x 512) ---

STRIDES = (8, 16, 32)
FACE_HALF = 48.0  # half side, in pixels, of the box the tiny detector draws around a firing anchor


def tiny_scrfd(path):
    """Fires, at stride 32 only, on cells that are bright; boxes and keypoints are fixed offsets from the cell."""
    from onnx import TensorProto, helper, numpy_helper, save

    kps_offsets = (ARCFACE_TEMPLATE_112 / 112.0 * 2 * FACE_HALF - FACE_HALF).reshape(-1)
    nodes, inits, outputs = [], [], {"score": [], "bbox": [], "kps": []}
    for s in STRIDES:
        nodes.append(helper.make_node("AveragePool", ["input.1"], [f"pool{s}"], kernel_shape=[s, s], strides=[s, s]))
        heads = {
            "score": (np.full((2, 3, 1, 1), 10 / 3 if s == 32 else 0.0), np.full(2, 0.0 if s == 32 else -10.0), 1),
            "bbox": (np.zeros((8, 3, 1, 1)), np.full(8, FACE_HALF / s), 4),
            "kps": (np.zeros((20, 3, 1, 1)), np.tile(kps_offsets / s, 2), 10),
        }
        for head, (weight, bias, width) in heads.items():
            name = f"{head}{s}"
            inits += [numpy_helper.from_array(weight.astype(np.float32), f"{name}_w"),
                      numpy_helper.from_array(bias.astype(np.float32), f"{name}_b")]
            nodes.append(helper.make_node("Conv", [f"pool{s}", f"{name}_w", f"{name}_b"], [f"{name}_conv"]))
            source = f"{name}_conv"
            if head == "score":
                nodes.append(helper.make_node("Sigmoid", [source], [f"{name}_sig"]))
                source = f"{name}_sig"
            # Location-major, anchor-minor rows: the order of SCRFD's anchor centres.
            nodes.append(helper.make_node("Transpose", [source], [f"{name}_t"], perm=[0, 2, 3, 1]))
            inits.append(numpy_helper.from_array(np.array([-1, width], np.int64), f"{name}_shape"))
            nodes.append(helper.make_node("Reshape", [f"{name}_t", f"{name}_shape"], [name]))
            outputs[head].append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [f"anchors{s}", width]))
    graph = helper.make_graph(
        nodes, "tiny_scrfd",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, "height", "width"])],
        outputs["score"] + outputs["bbox"] + outputs["kps"], inits)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def tiny_arcface(path):
    pooled_linear_onnx(path, np.random.default_rng(0).normal(size=(3, 512)), "data", "fc1", "tiny_arcface")


def test_from_dir_loads_insightface_models_end_to_end(tmp_path):
    tiny_scrfd(tmp_path / "scrfd_10g_bnkps.onnx")
    tiny_arcface(tmp_path / "arcface.onnx")
    analyser = InsightFaceAnalyser.from_dir(tmp_path, det_size=(256, 256), det_thresh=0.2)

    face = np.zeros((256, 256, 3), np.uint8)
    face[128:160, 128:160] = (200, 180, 160)  # one bright stride-32 cell, anchor centre (128, 128)
    images = [("face", write_image(tmp_path / "face.png", face)),
              ("blank", write_image(tmp_path / "blank.png", np.zeros((256, 256, 3), np.uint8)))]

    frame = analyser.analyse(images, progress=False)

    assert frame["status"].tolist() == [FaceStatus.OK.value, FaceStatus.NO_FACE.value]
    np.testing.assert_allclose(frame.loc[0, "box"], [128 - FACE_HALF, 128 - FACE_HALF, 128 + FACE_HALF, 128 + FACE_HALF])
    embeddings = embedding_matrix(frame)
    assert embeddings.shape == (1, 512)
    assert np.linalg.norm(embeddings[0]) == pytest.approx(1.0, rel=1e-5)


def test_from_dir_rejects_a_swapped_file(tmp_path):
    tiny_arcface(tmp_path / "scrfd_10g_bnkps.onnx")  # a recognizer where the detector belongs
    tiny_arcface(tmp_path / "arcface.onnx")
    with pytest.raises(AssetError, match="not a face detection model"):
        InsightFaceAnalyser.from_dir(tmp_path)


# --- paper-path scoring: generated 512x512 frames are read at their own resolution ---

class BrightRegionDetector(StubDetector):
    """Finds the one face as the bounding box of the non-black pixels (template landmarks inside it), in float64
    so that a shifted face gives exactly shifted landmarks."""

    def __init__(self):
        super().__init__([])

    def detect(self, img, max_num=0):
        self.seen.append(img.copy())
        ys, xs = np.nonzero(img.max(axis=2))
        box = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
        return np.array([[*box, 0.9]], np.float64), np.array([face_landmarks(box)], np.float64)


def test_a_face_in_a_512_frame_is_detected_aligned_and_embedded_as_the_face_itself():
    from idunlearn.evaluation.generation import read_samples

    face = np.random.default_rng(0).integers(100, 256, (256, 256, 3), dtype=np.uint8)  # Arc2Face's face scale
    frame = np.zeros((512, 512, 3), np.uint8)
    frame[100:356, 130:386] = face
    results = {}
    for name, image in (("frame", frame), ("face", face)):
        detector, recognizer = BrightRegionDetector(), StubRecognizer()
        analyser = InsightFaceAnalyser(detector, recognizer, det_size=(640, 640))
        rows = read_samples(analyser, image[None], [name])
        assert detector.seen[0].shape == image.shape  # the detector saw the image as generated, not resized
        results[name] = rows.iloc[0], recognizer.batches[0][0]
    (frame_row, frame_aligned), (face_row, face_aligned) = results["frame"], results["face"]
    assert frame_row["status"] == face_row["status"] == FaceStatus.OK.value
    assert frame_aligned.shape == (112, 112, 3)
    # PIL's bilinear warp works in fixed point, so a shifted source agrees only up to one grey level
    assert np.abs(frame_aligned.astype(int) - face_aligned).max() <= 1
    assert np.abs(frame_aligned.astype(int) - face_aligned).mean() < 0.05
    np.testing.assert_allclose(frame_row["embedding"], face_row["embedding"], atol=1e-4)
    np.testing.assert_allclose(np.reshape(frame_row["landmarks"], (5, 2)),
                               np.reshape(face_row["landmarks"], (5, 2)) + [130, 100], atol=1e-4)
    np.testing.assert_allclose(frame_row["box"], np.add(face_row["box"], [130, 100, 130, 100]), atol=1e-4)


def test_quality_reads_the_landmarks_in_the_frame_it_is_given(tmp_path):
    from idunlearn.evaluation.generation import read_samples
    from idunlearn.evaluation.quality import EDifFIQAQuality

    pooled_linear_onnx(tmp_path / "q.onnx", [[1.0], [0.5], [0.25]], "input", "score", "tiny_quality")
    quality = EDifFIQAQuality(tmp_path / "q.onnx")
    face = np.random.default_rng(1).integers(100, 256, (256, 256, 3), dtype=np.uint8)
    frame = np.zeros((512, 512, 3), np.uint8)
    frame[100:356, 130:386] = face
    scores = []
    for image in (frame, face):
        rows = read_samples(InsightFaceAnalyser(BrightRegionDetector(), StubRecognizer()), image[None], ["x"])
        scores.append(quality(image[None], rows.assign(detected=rows["status"] == FaceStatus.OK.value))[0])
    assert np.isfinite(scores[0]) and scores[0] == pytest.approx(scores[1], abs=1e-3)  # up to PIL's rounding
    misplaced = quality(frame[None], rows.assign(detected=True))[0]  # the face's own landmarks read on the frame
    assert abs(misplaced - scores[1]) > 0.1


# --- which face, and where onnxruntime runs ---

def test_centre_weighted_choice_prefers_the_subject_in_the_middle_to_a_larger_face_at_the_edge():
    edge, centre = [0, 0, 120, 120], [90, 90, 190, 190]  # 14,400 px at the corner, 10,000 px in the middle
    image = coloured_image((280, 280))
    boxes = {}
    for choice in ("largest", "centre_weighted"):
        analyser = InsightFaceAnalyser(StubDetector([edge, centre]), StubRecognizer(), face_choice=choice)
        boxes[choice] = analyser.analyse([("x", image)], progress=False).loc[0, "box"]
    assert boxes == {"largest": edge, "centre_weighted": centre}
    with pytest.raises(ValueError, match="face choice 'middle'"):
        InsightFaceAnalyser(StubDetector([]), StubRecognizer(), face_choice="middle")


@pytest.mark.parametrize("cuda, offered, expected", [
    (True, ["CUDAExecutionProvider", "CPUExecutionProvider"], ["CUDAExecutionProvider", "CPUExecutionProvider"]),
    (False, ["CUDAExecutionProvider", "CPUExecutionProvider"], ["CPUExecutionProvider"]),
    (True, ["CPUExecutionProvider"], ["CPUExecutionProvider"]),  # a CPU-only onnxruntime build
])
def test_onnxruntime_runs_on_the_gpu_when_the_job_has_one(monkeypatch, tmp_path, cuda, offered, expected):
    import onnxruntime
    import torch
    from insightface import model_zoo

    from idunlearn.faces.insightface_backend import onnx_providers

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: offered)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert onnx_providers() == expected
    seen = []

    class Model:
        def __init__(self, taskname):
            self.taskname, self.use_kps = taskname, True

        def prepare(self, ctx_id, **kwargs):
            pass

    def get_model(path, providers):
        seen.append(providers)
        return Model("detection" if "scrfd" in path else "recognition")

    monkeypatch.setattr(model_zoo, "get_model", get_model)
    for name in ("scrfd_10g_bnkps.onnx", "arcface.onnx"):
        (tmp_path / name).write_bytes(b"")
    InsightFaceAnalyser.from_dir(tmp_path)
    assert seen == [expected, expected]


def test_the_paper_config_detects_as_the_piu_reimplementation(monkeypatch):
    import yaml

    from conftest import REPO
    from idunlearn.config import load_config
    from idunlearn.faces import build_face_analyser

    paper = load_config(REPO / "config" / "config.yaml", yaml.safe_load((REPO / "config" / "celebahq.yaml").read_text()))
    # edgarcancinoe/piu-unlearning, src/piu_unlearning/models/arcface.py: DET_SIZE (256, 256), DET_THRESH 0.2,
    # centre-weighted choice, for the dataset and for scoring (one analyser serves both here)
    seen = {}
    monkeypatch.setattr(InsightFaceAnalyser, "from_dir", classmethod(lambda cls, models_dir, **kwargs: seen.update(kwargs)))
    build_face_analyser(paper["faces"], "models")
    assert (seen["det_size"], seen["det_thresh"], seen["face_choice"]) == ((256, 256), 0.2, "centre_weighted")
    defaults = load_config(REPO / "config" / "config.yaml")["faces"]["insightface"]  # Arc2Face's README: 640, 0.5
    assert (defaults["det_size"], defaults["det_thresh"], defaults["face_choice"]) == ([640, 640], 0.5, "largest")
