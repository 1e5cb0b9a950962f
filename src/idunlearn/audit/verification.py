"""Calibrated verification (forgetting audit, part 1): a cosine threshold at a fixed false-accept rate, learned from
impostor pairs of real images; which generated samples it verifies as the forget identity; Leak@k.

A sample is *verified* as identity i when a face was detected, its cosine to i's centroid is at least tau and i is
its nearest centroid. tau comes from image-to-image impostor pairs; a centroid averages out noise, so cosines to a
centroid run higher than pair cosines and the audit errs towards reporting leaks, the safe side for an auditor.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from ..identities import l2_normalise


def impostor_cosines(embeddings: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Cosines of every pair of images of different identities (each unordered pair once)."""
    emb = l2_normalise(np.asarray(embeddings, np.float64))
    labels = np.asarray(labels)
    i, j = np.triu_indices(len(emb), k=1)
    impostor = labels[i] != labels[j]
    return (emb[i[impostor]] * emb[j[impostor]]).sum(1)


def threshold_at_far(impostor: np.ndarray, far: float) -> float:
    """The smallest threshold whose false-accept rate share(impostor >= tau) is at most ``far``: just above the
    (m+1)-th largest impostor cosine, m = floor(far * n) the accepts allowed."""
    scores = np.sort(np.asarray(impostor, np.float64))[::-1]
    if not len(scores):
        raise ValueError("no impostor pairs: calibration needs images of at least two identities")
    allowed = int(np.floor(far * len(scores)))
    if allowed >= len(scores):
        return float(scores[-1])
    return float(np.nextafter(scores[allowed], np.inf))


def clopper_pearson(hits: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval of a share hits / n (Clopper and Pearson 1934); (nan, nan) when n = 0."""
    if n == 0:
        return float("nan"), float("nan")
    alpha = 1.0 - confidence
    low = 0.0 if hits == 0 else stats.beta.ppf(alpha / 2, hits, n - hits + 1)
    high = 1.0 if hits == n else stats.beta.ppf(1 - alpha / 2, hits + 1, n - hits)
    return float(low), float(high)


def calibrate(embeddings: np.ndarray, labels: np.ndarray, far: float, heldout_fraction: float, seed: int) -> dict:
    """tau at false-accept rate ``far`` from impostor pairs among a seeded share of the identities, checked on the
    impostor pairs of the others (held out): the record the audit keeps (tau, both FARs, pair counts, identities)."""
    if not 0 < far < 1 or not 0 < heldout_fraction < 1:
        raise ValueError(f"config keys 'audit.verification.far' ({far}) and 'heldout_fraction' ({heldout_fraction}) "
                         "must lie in (0, 1)")
    labels = np.asarray(labels)
    identities = np.unique(labels)
    if len(identities) < 4:
        raise ValueError(f"audit verification needs images of at least 4 identities (got {len(identities)})")
    shuffled = np.random.default_rng(seed).permutation(identities)
    n_heldout = min(max(2, int(round(heldout_fraction * len(identities)))), len(identities) - 2)
    heldout_ids, calibration_ids = np.sort(shuffled[:n_heldout]), np.sort(shuffled[n_heldout:])
    embeddings = np.asarray(embeddings, np.float64)
    calibration = np.isin(labels, calibration_ids)
    cal = impostor_cosines(embeddings[calibration], labels[calibration])
    held = impostor_cosines(embeddings[~calibration], labels[~calibration])
    tau = threshold_at_far(cal, far)
    held_hits = int((held >= tau).sum())
    low, high = clopper_pearson(held_hits, len(held))
    return {"tau": tau, "far_target": far, "far_calibration": float((cal >= tau).mean()),
            "far_heldout": held_hits / len(held), "far_heldout_ci_low": low, "far_heldout_ci_high": high,
            "n_pairs_calibration": int(len(cal)), "n_pairs_heldout": int(len(held)),
            "calibration_identities": calibration_ids.tolist(), "heldout_identities": heldout_ids.tolist(),
            "seed": seed}


def verified(samples: pd.DataFrame, tau: float) -> np.ndarray:
    """Per scored sample (``detected``, ``own_cosine``, ``predicted_identity``, ``target_identity``): verified as
    its target identity at threshold ``tau``."""
    return (samples["detected"].to_numpy(bool) & (samples["own_cosine"].to_numpy(np.float64) >= tau)
            & (samples["predicted_identity"].to_numpy() == samples["target_identity"].to_numpy()))


def leak_at_k(samples: pd.DataFrame, is_verified: np.ndarray, ks) -> dict[int, float]:
    """Leak@k: the share of conditions (``condition``) for which any of the first k seeds (``seed_index`` < k) is
    verified. A condition with fewer than max(ks) seeds is an error: Leak@k must compare like with like."""
    frame = pd.DataFrame({"condition": samples["condition"].to_numpy(), "seed_index": samples["seed_index"].to_numpy(),
                          "verified": is_verified})
    per_condition = frame.groupby("condition")["seed_index"].nunique()
    if per_condition.min() < max(ks):
        raise ValueError(f"Leak@{max(ks)} needs {max(ks)} seeds per condition; some condition has "
                         f"{per_condition.min()}")
    return {k: float(frame[frame["seed_index"] < k].groupby("condition")["verified"].any().mean()) for k in ks}
