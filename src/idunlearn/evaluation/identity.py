"""Identity metrics of generated samples (PIU appendix A). A sample without a detected face counts as
unrecognised: it contributes 0 to ISM and is wrong for accuracy."""

from __future__ import annotations

import numpy as np

SRK_EPS = 1e-2


def _cosines(embeddings: np.ndarray, targets: np.ndarray) -> np.ndarray:
    e = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    t = targets / np.linalg.norm(targets, axis=1, keepdims=True)
    return (e * t).sum(1)


def identity_similarity(embeddings: np.ndarray, target_centroids: np.ndarray, detected: np.ndarray) -> np.ndarray:
    """Per-sample cos(embedding, own centroid) (the summand of PIU eq. 7); 0 where no face was detected."""
    detected = np.asarray(detected, bool)
    out = np.zeros(len(detected))
    if detected.any():
        out[detected] = _cosines(np.asarray(embeddings)[detected], np.asarray(target_centroids)[detected])
    return out


def ism(embeddings, target_centroids, detected) -> float:
    """ISM = mean cosine between each generated face's embedding and its identity centroid (PIU eq. 7)."""
    return float(identity_similarity(embeddings, target_centroids, detected).mean())


def nearest_centroid(embeddings: np.ndarray, centroid_ids: np.ndarray, centroids: np.ndarray,
                     detected: np.ndarray) -> np.ndarray:
    """Identity predicted by the highest cosine over all centroids (PIU eqs. 8-9); -1 where no face."""
    detected = np.asarray(detected, bool)
    pred = np.full(len(detected), -1, dtype=np.int64)
    if detected.any():
        e = np.asarray(embeddings)[detected]
        e = e / np.linalg.norm(e, axis=1, keepdims=True)
        c = centroids / np.linalg.norm(centroids, axis=1, keepdims=True)
        pred[detected] = np.asarray(centroid_ids)[(e @ c.T).argmax(1)]
    return pred


def accuracy(predicted: np.ndarray, targets: np.ndarray) -> float:
    """Acc_U (PIU eq. 8) or Acc_R (eq. 9): share of samples classified as their own identity."""
    return float(np.mean(np.asarray(predicted) == np.asarray(targets)))


def srk(acc_retain: float, acc_forget: float, eps: float = SRK_EPS) -> float:
    """Selective Removal and Keep, SRK = Acc_R / (Acc_U + eps) (PIU eq. 10, eps = 1e-2)."""
    return acc_retain / (acc_forget + eps)
