"""One experiment (a method configuration x a forget identity), usable without Snakemake: load the generator,
gather the identity data, unlearn, evaluate before and after."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from PIL import Image

from .faces.analyser import FaceAnalyser, aligned_crops, ok_embeddings
from .identities import centroid_matrix
from .models.generator import IdentityGenerator
from .unlearning.base import UnlearningData


def load_generator(cfg: dict, device: str = "cpu") -> IdentityGenerator:
    """The generator named by the ``generator`` config section."""
    if cfg["backend"] == "mini":
        from .models.mini import load_mini_generator

        return load_mini_generator(cfg["mini"]["checkpoint"], device)
    if cfg["backend"] == "arc2face":
        from .models.arc2face import load_arc2face

        return load_arc2face(device=device)
    raise ValueError(f"generator.backend {cfg['backend']!r} is unknown: use 'mini' or 'arc2face'")


def unlearning_data(selection: dict, faces: pd.DataFrame, labels: pd.DataFrame,
                    centroids: pd.DataFrame) -> UnlearningData:
    """Forget-train embeddings, the retain-train pool and the anchor centroid of one experiment."""
    emb = ok_embeddings(faces)
    retain_images = labels.loc[labels["identity"].isin(selection["retain_train_identities"]), "image_id"]
    cents = dict(zip(centroids["identity"], centroid_matrix(centroids)))
    return UnlearningData(
        forget_train=np.stack(emb.loc[selection["forget_train_images"]].to_numpy()).astype(np.float32),
        retain_train=np.stack(emb.loc[sorted(retain_images)].to_numpy()).astype(np.float32),
        anchor_centroid=cents[selection["anchor_identity"]].astype(np.float32),
    )


@dataclass
class ReferenceImages:
    """Retain-validation real faces, brought to the generator's resolution and back (so that the kernel distance
    compares generated and real faces at the same level of detail)."""

    image_ids: list[str]
    images: np.ndarray  # (N, 112, 112, 3) uint8


def reference_images(selection: dict, manifest: pd.DataFrame, faces: pd.DataFrame, labels: pd.DataFrame,
                     generator: IdentityGenerator) -> ReferenceImages:
    ids = sorted(labels.loc[labels["identity"].isin(selection["retain_val_identities"]), "image_id"])
    ok = faces[faces["status"] == "ok"].set_index("image_id").loc[ids]
    crops = aligned_crops(manifest.set_index("image_id").loc[ids, "path"], ok["landmarks"])
    if generator.vae is not None:  # latent-space generators decode at full resolution
        return ReferenceImages(ids, crops)
    channels, generator_size = generator.latent_shape[:2]
    mode = "L" if channels == 1 else "RGB"
    same_detail = [np.asarray(Image.fromarray(c).convert(mode).resize((generator_size,) * 2, Image.BOX)
                              .convert("RGB").resize((112, 112), Image.BICUBIC)) for c in crops]
    return ReferenceImages(ids, np.stack(same_detail))


def build_features(cfg: dict, analyser: FaceAnalyser):
    """Kernel-distance features named by ``evaluation.kd.features``."""
    from .evaluation.features import DinoV2Features, RecognizerFeatures

    if cfg["features"] == "recognizer":
        return RecognizerFeatures(analyser)
    if cfg["features"] == "dinov2":
        return DinoV2Features.from_hub(revision=cfg.get("dinov2_revision"))
    raise ValueError(f"evaluation.kd.features {cfg['features']!r} is unknown: use 'recognizer' or 'dinov2'")
