"""Shared building blocks of gradient-based unlearning: real examples, clean latents, noisy latents, the one-step
estimate of the clean latent. Identity-condition sampling lives in ``idunlearn.conditions`` (shared with evaluation)."""

from __future__ import annotations

import numpy as np
import torch

from ..conditions import dirichlet_mixtures
from .base import UnlearningData


def draw_examples(latents: torch.Tensor, embeddings: np.ndarray, n: int,
                  rng: np.random.Generator) -> tuple[torch.Tensor, np.ndarray]:
    """n (clean latent, own embedding) pairs of real images, drawn uniformly with replacement."""
    if len(latents) != len(embeddings):
        raise ValueError(f"{len(latents)} latents but {len(embeddings)} embeddings: the rows must pair up")
    rows = rng.integers(len(latents), size=n)
    return latents[rows], np.asarray(embeddings, np.float32)[rows]


def group_counts(n: int, n_groups: int, rng: np.random.Generator, weights: np.ndarray | None = None) -> np.ndarray:
    """How many of a batch's n rows each of n_groups forget identities gets: n // n_groups each, one more for each
    of a random n % n_groups of them (drawn only when n_groups does not divide n: one identity draws nothing).
    With ``weights`` (one per group): floor(n w_g / sum w) each, the rows left over to random groups drawn without
    replacement with probability proportional to what their floor cut off (none drawn when nothing is cut off)."""
    if weights is None:
        counts = np.full(n_groups, n // n_groups)
        if n % n_groups:
            counts[rng.choice(n_groups, size=n % n_groups, replace=False)] += 1
        return counts
    weights = np.asarray(weights, np.float64)
    if weights.shape != (n_groups,) or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError(f"group weights {weights.tolist()}: need {n_groups} non-negative weights, not all zero")
    share = n * weights / weights.sum()
    counts = np.floor(share + 1e-9).astype(int)
    left = n - int(counts.sum())
    if left:
        cut = np.clip(share - counts, 0, None)
        counts[rng.choice(n_groups, size=left, replace=False, p=cut / cut.sum())] += 1
    return counts


def forget_conditions(data: UnlearningData, n: int, rng: np.random.Generator, k: int, alpha: float,
                      with_groups: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """n forget conditions, each a Dirichlet mixture of one forget identity's embeddings (PIU Section 3.4), the
    batch shared among the identities by ``group_counts`` (at ``data.group_weights``), with each condition's own
    anchor centroid (PIU eq. 6), or with ``with_groups`` its forget identity's index into ``data.anchors()``. One
    identity: the plain draw ``dirichlet_mixtures(forget_train, n, ...)``. Returns ((n, D) float32, (n, D) float32 or (n,) int)."""
    groups, anchors = data.groups(), np.asarray(data.anchors(), np.float32)
    counts = group_counts(n, len(anchors), rng, data.group_weights)
    conditions = [dirichlet_mixtures(data.forget_train[groups == g], count, rng, k, alpha)
                  for g, count in enumerate(counts)]
    which = np.repeat(np.arange(len(anchors)), counts)
    return np.concatenate(conditions), which if with_groups else anchors[which]


def noised(scheduler, x0: torch.Tensor, gen: torch.Generator, device) -> tuple:
    """Fresh noise eps, t ~ U{0..T-1} and x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps (DDPM forward process,
    PIU Section 3.1). Returns (x_t, t, eps) on ``device``."""
    noise = torch.randn(x0.shape, generator=gen)
    t = torch.randint(scheduler.config.num_train_timesteps, (len(x0),), generator=gen)
    return scheduler.add_noise(x0, noise, t).to(device), t.to(device), noise.to(device)


def noisy_latents(scheduler, shape: tuple[int, ...], n: int, gen: torch.Generator, device) -> tuple:
    """Clean latents from pure Gaussian noise (PIU Section 3.4), noised at random timesteps (``noised``)."""
    x_t, t, _ = noised(scheduler, torch.randn((n, *shape), generator=gen), gen, device)
    return x_t, t


def predicted_x0(scheduler, x_t: torch.Tensor, t: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """One-step estimate x0_hat = (x_t - sqrt(1 - abar_t) eps) / sqrt(abar_t) (PIU appendix eq. 46)."""
    abar = scheduler.alphas_cumprod.to(device=x_t.device, dtype=torch.float32)[t].view(-1, *[1] * (x_t.ndim - 1))
    return (x_t.float() - (1 - abar).sqrt() * eps.float()) / abar.sqrt()
