"""Tiny stand-ins shared by the unlearning tests: an Arc2Face-shaped mini generator and random identity data."""

from __future__ import annotations

import copy

import numpy as np
import torch

from idunlearn.models.mini import build_mini_generator
from idunlearn.unlearning import build_method
from idunlearn.unlearning.base import UnlearningData
from idunlearn.unlearning.runner import unlearn

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


def straight_and_resumed(base, data: UnlearningData, run: dict, tmp_path, seed: int = 5):
    """Unlearn a copy of ``base`` straight through, and another one interrupted after step 2 (a saved state) and
    resumed; assert both end with the same weights. Returns (straight model, straight log, resumed log)."""
    straight = copy.deepcopy(base)
    log_full, _ = unlearn(straight, build_method(run["method"], run), data, run, tmp_path / "a.pt", seed=seed)
    interrupted = copy.deepcopy(base)
    unlearn(interrupted, build_method(run["method"], run), data, {**run, "steps": 2, "checkpoint_every": 1},
            tmp_path / "b.pt", seed=seed)
    resumed = copy.deepcopy(base)
    log_resumed, _ = unlearn(resumed, build_method(run["method"], run), data, run, tmp_path / "b.pt", seed=seed)
    for (n, a), (_, b) in zip(straight.unet.named_parameters(), resumed.unet.named_parameters()):
        torch.testing.assert_close(a, b, msg=n)
    return straight, log_full, log_resumed
