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


def great_circle(centre: np.ndarray, direction: np.ndarray, cosines) -> np.ndarray:
    """Unit conditions on the great circle from ``centre`` towards ``direction``, at the given cosines to ``centre``:
    v = c cos(theta) + u sin(theta), u the unit component of ``direction`` orthogonal to c (forgetting audit,
    neighbourhood probe). Returns (len(cosines), D) float32."""
    c = np.asarray(centre, np.float64)
    c = c / np.linalg.norm(c)
    u = np.asarray(direction, np.float64)
    u = u - (u @ c) * c
    if np.linalg.norm(u) < 1e-8:
        raise ValueError("great circle: the direction is parallel to the centre; pick another direction")
    u = u / np.linalg.norm(u)
    cos = np.asarray(cosines, np.float64)
    if np.any(np.abs(cos) > 1):
        raise ValueError(f"great circle: cosines must lie in [-1, 1] (got {cos.tolist()})")
    return (cos[:, None] * c + np.sqrt(1.0 - cos[:, None] ** 2) * u).astype(np.float32)
