"""Tiny stand-ins shared by the unlearning tests: an Arc2Face-shaped mini generator and random identity data."""

from __future__ import annotations

import numpy as np
import torch

from idunlearn.models.mini import build_mini_generator
from idunlearn.unlearning.base import UnlearningData

TINY = {"image_size": 8, "text_width": 32, "text_heads": 2, "block_out_channels": [32, 32, 32, 32],
        "layers_per_block": 1}


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def tiny_data(dim: int = 16, seed: int = 0, latents: bool = False) -> UnlearningData:
    """5 forget-train and 12 retain-train embeddings, an anchor and 5 other retain centroids; with ``latents``,
    real-image latents of 8x8 grey images for the forget, retain and anchor sets."""
    rng = np.random.default_rng(seed)
    data = UnlearningData(unit(rng.standard_normal((5, dim))), unit(rng.standard_normal((12, dim))),
                          unit(rng.standard_normal(dim)), retain_centroids=unit(rng.standard_normal((5, dim))))
    if latents:
        torch.manual_seed(seed)
        data.forget_latents = torch.rand(5, 1, 8, 8) * 2 - 1
        data.retain_latents = torch.rand(12, 1, 8, 8) * 2 - 1
        data.anchor_latents = torch.rand(3, 1, 8, 8) * 2 - 1
    return data


def tiny_generator(seed: int = 0):
    torch.manual_seed(seed)
    return build_mini_generator(TINY)
