"""Identity conditions sampled from real embeddings, shared by unlearning (training conditions) and evaluation
(evaluation-sample conditions)."""

from __future__ import annotations

import numpy as np


def dirichlet_mixtures(embeddings: np.ndarray, n: int, rng: np.random.Generator, k: int = 3,
                       alpha: float = 1.0) -> np.ndarray:
    """n synthetic identity conditions c = sum_k w_k c_k, w ~ Dir(alpha), over up to k random embeddings of one
    identity, renormalised (PIU Section 3.4, forget-set extension)."""
    embeddings = np.asarray(embeddings, np.float64)
    if len(embeddings) == 0:
        raise ValueError("cannot mix zero embeddings: the identity has no embedded image in this split")
    k = min(k, len(embeddings))
    out = np.empty((n, embeddings.shape[1]))
    for i in range(n):
        chosen = embeddings[rng.choice(len(embeddings), size=k, replace=False)]
        mix = rng.dirichlet(np.full(k, alpha)) @ chosen
        out[i] = mix / np.linalg.norm(mix)
    return out.astype(np.float32)


def draw_rows(embeddings: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n embeddings drawn uniformly with replacement (retain conditions from the retain-train pool)."""
    return np.asarray(embeddings, np.float32)[rng.integers(len(embeddings), size=n)]
