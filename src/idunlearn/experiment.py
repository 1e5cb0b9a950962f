"""One experiment (a method configuration x a forget identity), usable without Snakemake: load the generator,
gather the identity data, unlearn, evaluate before and after."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pandas as pd
import torch
from PIL import Image

from .faces import build_face_analyser
from .faces.analyser import FaceAnalyser, aligned_crops, load_rgb, ok_embeddings
from .evaluation.generation import to_uint8_images
from .identities import centroid_lookup
from .models.generator import IdentityGenerator, unit_rgb
from .models.pretrain import faces_to_training_images
from .unlearning import build_method
from .unlearning.base import UnlearningData
from .unlearning.runner import unlearn


def load_generator(cfg: dict, device: str = "cpu", changed: str | None = None, unet=None, folder=None,
                   never_saw: int | None = None) -> IdentityGenerator:
    """The generator named by the ``generator`` config section; with ``changed``, an unlearning run's changed
    parameters applied, with ``unet``, an external UNet installed (a delta file, or a diffusers folder or its files:
    ``models.export.install_unet``); with ``folder`` (a mini generator folder or its two files), that whole generator
    instead, refused when its config.json lists excluded identities without ``never_saw`` (a never-trained
    reference stands in only for the people it never saw)."""
    if folder is not None:
        from .models.mini import excluded_identities, load_mini_generator

        if cfg["backend"] != "mini":
            raise ValueError(f"an external mini generator ({folder}) replaces a generator.backend mini only, not "
                             f"{cfg['backend']!r}; give the external model as a unet")
        folder = folder if isinstance(folder, (str, os.PathLike)) else os.path.dirname(folder[0])
        excluded = excluded_identities(folder)
        if never_saw is not None and excluded is not None and int(never_saw) not in excluded:
            raise ValueError(f"the generator in {folder} was trained on identity {never_saw} (its config.json "
                             f"excludes {excluded} only): it cannot stand in for a model that never saw that person; "
                             "evaluate it on excluded identities, or retrain it excluding this one")
        return load_mini_generator(folder, device)
    if cfg["backend"] == "mini":
        from .models.mini import load_mini_generator

        generator = load_mini_generator(cfg["mini"]["checkpoint"], device)
    elif cfg["backend"] == "arc2face":
        from .models.arc2face import load_arc2face

        generator = load_arc2face(device=device)
    else:
        raise ValueError(f"generator.backend {cfg['backend']!r} is unknown: use 'mini' or 'arc2face'")
    if changed is not None:
        from .unlearning.runner import apply_changed_parameters

        apply_changed_parameters(generator, changed)
    if unet is not None:
        from .models.export import install_unet, unet_source

        install_unet(generator, unet_source(unet))
    return generator


def run_selection(selection: dict, run: dict, centroids: pd.DataFrame) -> dict:
    """The experiment as one run sees it: the selection, with the anchor re-drawn at the run's ``anchor_tau``
    when it sets one (PIU Table 4's tau ablation)."""
    from .selection import anchor_for_tau

    if run.get("anchor_tau") is None or run["anchor_tau"] == selection["tau"]:
        return selection
    return {**selection, **anchor_for_tau(selection, centroids, run["anchor_tau"])}


def unlearning_data(selection: dict | list[dict], faces: pd.DataFrame, labels: pd.DataFrame, centroids: pd.DataFrame,
                    latents_of: tuple[pd.DataFrame, IdentityGenerator] | None = None,
                    recognizer: torch.nn.Module | None = None) -> UnlearningData:
    """Forget-train embeddings, the retain-train pool, the anchor centroid and the other retain-train centroids of
    one experiment; with ``latents_of`` = (manifest, generator) also the forget-train, retain-train and anchor
    images as clean latents of that generator (``real_latents``), row for row with the embeddings.

    A list of selections (joint unlearning, sharing their retain-train identities) gives one forget group per
    selection, each with its own anchor; the other retain-train centroids then leave out every anchor, and there are
    no anchor images (the methods that need them unlearn one identity at a time). A list of one is one selection."""
    selections = [selection] if isinstance(selection, dict) else list(selection)
    retain = selections[0]["retain_train_identities"]
    if any(s["retain_train_identities"] != retain for s in selections):
        raise ValueError("joint unlearning: the selections must share their retain-train identities "
                         "(idunlearn.many.job_selections builds them so)")
    emb = ok_embeddings(faces)
    retain_ids = sorted(labels.loc[labels["identity"].isin(retain), "image_id"])
    cents = centroid_lookup(centroids)
    anchors = [s["anchor_identity"] for s in selections]
    forget_images = [image for s in selections for image in s["forget_train_images"]]
    data = UnlearningData(
        forget_train=np.stack(emb.loc[forget_images].to_numpy()).astype(np.float32),
        retain_train=np.stack(emb.loc[retain_ids].to_numpy()).astype(np.float32),
        anchor_centroid=cents[anchors[0]].astype(np.float32),
        retain_centroids=np.stack([cents[j] for j in sorted(retain) if j not in anchors]).astype(np.float32),
        recognizer=recognizer,
    )
    if len(selections) > 1:
        data.forget_groups = np.repeat(np.arange(len(selections)), [len(s["forget_train_images"]) for s in selections])
        data.anchor_centroids = np.stack([cents[a] for a in anchors]).astype(np.float32)
    if latents_of is not None:
        manifest, generator = latents_of
        data.forget_latents = real_latents(generator, manifest, faces, forget_images)
        data.retain_latents = real_latents(generator, manifest, faces, retain_ids)
        if len(selections) == 1:
            anchor_ids = sorted(labels.loc[labels["identity"] == anchors[0], "image_id"])
            data.anchor_latents = data.retain_latents[np.searchsorted(retain_ids, anchor_ids)]
    return data


def unlearn_selection(generator: IdentityGenerator, run: dict, selection: dict | list[dict], faces: pd.DataFrame,
                      labels: pd.DataFrame, centroids: pd.DataFrame, manifest: pd.DataFrame, faces_cfg: dict,
                      models_dir, state_path, seed: int, teacher: torch.nn.Module | None = None,
                      group_weights: np.ndarray | None = None) -> tuple[pd.DataFrame, dict]:
    """Unlearn the experiment ``selection`` (a list: jointly) from ``generator`` in place with the run settings
    ``run``, gathering what its method needs (real images as latents, a differentiable recognizer; its ``needs``).
    ``teacher`` and ``group_weights`` (the forget identities' shares of the batch): ``runner.unlearn`` and
    ``UnlearningData``. Returns ``runner.unlearn``'s (loss log, timings)."""
    method = build_method(run["method"], run)
    needs = getattr(method, "needs", ())  # real images as latents (SISS, WID), a differentiable recognizer (WID)
    data = unlearning_data(selection, faces, labels, centroids,
                           latents_of=(manifest, generator) if "latents" in needs else None,
                           recognizer=differentiable_recognizer(faces_cfg, models_dir).to(generator.device)
                           if "recognizer" in needs else None)
    data.group_weights = group_weights
    return unlearn(generator, method, data, run, state_path, seed, teacher)


def real_pixels(generator: IdentityGenerator, manifest: pd.DataFrame, faces: pd.DataFrame,
                image_ids: list[str]) -> torch.Tensor:
    """Real images (N, C, H, W) in [-1, 1] at the generator's pixel resolution, prepared the way the generator saw
    faces in training: pixel-space generators (the mini Arc2Face) take the aligned crop at their resolution and
    channels (``faces_to_training_images``); latent-space generators (Arc2Face) the whole image at the VAE's
    output size."""
    paths = manifest.set_index("image_id").loc[image_ids, "path"]
    if generator.vae is None:
        channels, size = generator.latent_shape[:2]
        landmarks = faces[faces["status"] == "ok"].set_index("image_id").loc[image_ids, "landmarks"]
        return faces_to_training_images(aligned_crops(paths, landmarks), size, channels)
    size = generator.latent_shape[1] * 2 ** (len(generator.vae.config.block_out_channels) - 1)
    images = np.stack([np.asarray(Image.fromarray(load_rgb(path)).resize((size, size), Image.BICUBIC))
                       for path in paths])
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1)


def real_latents(generator: IdentityGenerator, manifest: pd.DataFrame, faces: pd.DataFrame, image_ids: list[str],
                 batch_size: int = 16) -> torch.Tensor:
    """Clean latents (N, *latent_shape) of real images (``real_pixels``): the pixels themselves in pixel space,
    the VAE encoder's posterior mean, scaled by ``vae_scale``, for latent-space generators."""
    if generator.vae is None:
        return real_pixels(generator, manifest, faces, image_ids)
    vae, out = generator.vae, []
    for start in range(0, len(image_ids), batch_size):
        x = real_pixels(generator, manifest, faces, image_ids[start:start + batch_size])
        with torch.no_grad():
            x = x.to(device=generator.device, dtype=vae.dtype)
            out.append((vae.encode(x).latent_dist.mean * generator.vae_scale).float().cpu())
    return torch.cat(out)


def differentiable_recognizer(faces_cfg: dict, models_dir) -> torch.nn.Module:
    """The face analyser's recognizer as a frozen torch module (methods whose loss runs through it: WID)."""
    analyser = build_face_analyser(faces_cfg, models_dir)
    recognizer = getattr(analyser, "recognizer", None)
    if not isinstance(recognizer, torch.nn.Module):
        raise ValueError(
            f"faces.backend {faces_cfg['backend']!r} embeds faces with {type(recognizer).__name__}, which gradients "
            "cannot pass through; the method needs a differentiable (torch) recognizer. Use faces.backend 'offline' "
            "(MobileFaceNet in torch), or convert the paper's arcface.onnx to a torch module taking (N, 3, 112, 112) "
            "RGB in [0, 255] and expose it as the analyser's `recognizer`.")
    return recognizer.eval().requires_grad_(False)


def reference_batches(selection: dict, manifest: pd.DataFrame, faces: pd.DataFrame, labels: pd.DataFrame,
                      generator: IdentityGenerator, batch_size: int = 64) -> Iterator[np.ndarray]:
    """Retain-validation real faces prepared exactly like generated images, a batch at a time: ``real_pixels`` (the
    generator's resolution, channels and crop policy), then the generator's output convention ([0, 1], three channels)
    and ``to_uint8_images``; so the kernel-distance features see real and generated images at the same size and level
    of detail. Yields (n, H, W, 3) uint8 arrays, H x W the generator's output size, in image-id order."""
    ids = sorted(labels.loc[labels["identity"].isin(selection["retain_val_identities"]), "image_id"])
    for start in range(0, len(ids), batch_size):
        yield to_uint8_images(unit_rgb(real_pixels(generator, manifest, faces, ids[start:start + batch_size])))


def reference_features(selection: dict, manifest: pd.DataFrame, faces: pd.DataFrame, labels: pd.DataFrame,
                       generator: IdentityGenerator, features, batch_size: int = 64) -> np.ndarray:
    """Kernel-distance features of the real reference (``reference_batches``), one batch of images in memory at a
    time: on the paper path the reference images at 512 px would take about 2 GB at once."""
    return np.concatenate([features(batch) for batch in reference_batches(selection, manifest, faces, labels,
                                                                          generator, batch_size)])


def build_features(cfg: dict, analyser: FaceAnalyser, device: str = "cpu"):
    """Kernel-distance features named by ``evaluation.kd.features`` (DINOv2 runs on ``device``, the job's)."""
    from .evaluation.features import DinoV2Features, MobileFaceNetMapFeatures, RecognizerFeatures
    from .faces.mobilefacenet import MobileFaceNet

    if cfg["features"] == "mobilefacenet-maps":
        recognizer = getattr(analyser, "recognizer", None)
        if not isinstance(recognizer, MobileFaceNet):
            raise ValueError(f"evaluation.kd.features 'mobilefacenet-maps' reads the offline analyser's MobileFaceNet, "
                             f"but faces.backend {analyser.name!r} has none: use 'dinov2' (paper) or 'recognizer'")
        return MobileFaceNetMapFeatures(recognizer)
    if cfg["features"] == "recognizer":
        return RecognizerFeatures(analyser)
    if cfg["features"] == "dinov2":
        return DinoV2Features.from_hub(revision=cfg.get("dinov2_revision"), device=device)
    raise ValueError(f"evaluation.kd.features {cfg['features']!r} is unknown: use 'mobilefacenet-maps', "
                     "'recognizer' or 'dinov2'")
