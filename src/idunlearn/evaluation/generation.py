"""Generating evaluation samples and reading them with the face analyser."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..faces.analyser import FaceAnalyser, read_embeddings
from ..identities import centroid_matrix
from ..models.generator import IdentityGenerator, initial_noise
from .identity import accuracy, identity_similarity, nearest_centroid

def to_uint8_images(images: torch.Tensor) -> np.ndarray:
    """(N, 3, H, W) images in [0, 1] -> (N, H, W, 3) uint8 at the same resolution: generated images are scored as
    generated (the face analyser and the kernel-distance features bring them to their own input sizes)."""
    return (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


def read_samples(analyser: FaceAnalyser, images: np.ndarray, sample_ids: list[str]) -> pd.DataFrame:
    """Face-analyser rows for generated images at their own resolution (status ok = a face was detected, aligned
    and embedded; boxes and landmarks in the images' pixel coordinates)."""
    return analyser.analyse(list(zip(sample_ids, images)), batch_size=64, progress=False)


def identity_check(generator: IdentityGenerator, analyser: FaceAnalyser, identity_ids: np.ndarray,
                   condition_embeddings: np.ndarray, centroid_ids: np.ndarray, centroids: np.ndarray,
                   seeds: list[int], steps: int, guidance: float) -> dict:
    """Is this a real identity generator? One sample per condition: ISM to the own centroid and
    nearest-centroid accuracy over all centroids (the protocol of the evaluation stage)."""
    noise = initial_noise(generator.latent_shape, seeds)
    with torch.no_grad():
        images = generator.generate(torch.as_tensor(condition_embeddings, dtype=torch.float32), noise, steps, guidance)
    rows = read_samples(analyser, to_uint8_images(images), [str(i) for i in range(len(images))])
    emb, detected = read_embeddings(rows, centroids.shape[1])
    own = centroids[pd.Index(centroid_ids).get_indexer(identity_ids)]
    pred = nearest_centroid(emb, centroid_ids, centroids, detected)
    return {"ism": float(identity_similarity(emb, own, detected).mean()), "accuracy": accuracy(pred, identity_ids),
            "detection_rate": float(detected.mean())}


def identity_monitor(analyser: FaceAnalyser, centroids: pd.DataFrame, cfg: dict):
    """``monitor(ema, step)`` for ``models.pretrain.train_mini_generator``: ``identity_check`` of one sample per
    identity with 2+ images, conditioned on its centroid (``cfg``: seed, monitor_steps, monitor_guidance)."""
    multi = centroids[centroids["size"] >= 2]
    ids, cents, cond = centroids["identity"].to_numpy(), centroid_matrix(centroids), centroid_matrix(multi)
    seeds = [cfg["seed"] + i for i in range(len(multi))]

    def monitor(ema: IdentityGenerator, step: int) -> dict:
        return identity_check(ema.eval(), analyser, multi["identity"].to_numpy(), cond, ids, cents, seeds,
                              cfg["monitor_steps"], cfg["monitor_guidance"])
    return monitor
