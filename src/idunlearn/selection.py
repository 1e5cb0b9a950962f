"""Experiment selection (PIU Section 4): forget identities, forget/retain splits, proximity-based anchors (eq. 6).

Every draw is seeded from (config seed, purpose, identity), so adding a forget identity never changes the
selections already made: raising N only appends.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from .identities import centroid_lookup

# Stream tags keep the random draws for different purposes independent of each other.
_RETAIN_SPLIT, _FORGET_ORDER, _FORGET_SPLIT, _ANCHOR = 1, 2, 3, 4


@dataclass
class Selection:
    forget_identity: int
    forget_train_images: list[str]
    forget_val_images: list[str]
    anchor_identity: int
    anchor_cosine: float
    anchor_fallback: bool
    anchor_band_size: int
    tau: float
    tol: float
    seed: int
    retain_train_identities: list[int] = field(repr=False)
    retain_val_identities: list[int] = field(repr=False)

    def to_dict(self) -> dict:
        return asdict(self)

    def table_row(self) -> dict:
        return {
            "forget_identity": self.forget_identity, "anchor_identity": self.anchor_identity,
            "anchor_cosine": self.anchor_cosine, "anchor_fallback": self.anchor_fallback,
            "anchor_band_size": self.anchor_band_size, "tau": self.tau, "tol": self.tol,
            "n_forget_train": len(self.forget_train_images), "n_forget_val": len(self.forget_val_images),
            "n_retain_train_identities": len(self.retain_train_identities),
            "n_retain_val_identities": len(self.retain_val_identities), "seed": self.seed,
        }


def split_count(n: int, train_fraction: float) -> int:
    """Training share of n items: floor(fraction * n), kept in [1, n - 1] so both sides are non-empty."""
    if n < 2:
        raise ValueError(f"cannot split {n} item(s) into train and validation")
    return min(max(math.floor(train_fraction * n), 1), n - 1)


def retain_identity_split(identities: np.ndarray, train_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Identity-level split (90/10 in the paper): validation identities are never seen by unlearning."""
    ids = np.sort(np.asarray(identities))
    perm = np.random.default_rng([seed, _RETAIN_SPLIT]).permutation(ids)
    n_train = split_count(len(ids), train_fraction)
    return np.sort(perm[:n_train]), np.sort(perm[n_train:])


def forget_identity_order(sizes: pd.Series, candidates: np.ndarray, min_images: int, seed: int,
                          target_mean_size: float | None = None) -> list[int]:
    """Eligible candidates in the order they are taken as forget identities (a prefix is taken for any N).

    With ``target_mean_size`` the clusters closest in size come first (paper: mean size ~15), ties broken at random.
    """
    eligible = np.sort([int(c) for c in candidates if sizes[c] >= min_images])
    if len(eligible) == 0:
        raise ValueError(f"no identity with at least {min_images} images is available as a forget identity; "
                         "lower selection.min_forget_images or use a dataset with larger clusters")
    tiebreak = np.random.default_rng([seed, _FORGET_ORDER]).random(len(eligible))
    closeness = np.abs(sizes[eligible].to_numpy() - target_mean_size) if target_mean_size else np.zeros(len(eligible))
    return [int(eligible[i]) for i in np.lexsort((tiebreak, closeness))]


def select_anchor(forget_centroid: np.ndarray, candidate_ids: np.ndarray, candidate_centroids: np.ndarray,
                  tau: float, tol: float, rng: np.random.Generator) -> tuple[int, float, bool, int]:
    """Anchor by proximity (PIU eq. 6): uniform over {j : |cos(mu_f, mu_j) - tau| < tol}.

    If the band is empty, fall back to the candidate whose cosine is nearest to tau, and flag it.
    Returns (anchor id, its cosine, fallback flag, band size).
    """
    if len(candidate_ids) == 0:
        raise ValueError("no retain-train identity is available as an anchor")
    sims = candidate_centroids @ forget_centroid / (
        np.linalg.norm(candidate_centroids, axis=1) * np.linalg.norm(forget_centroid))
    band = np.flatnonzero(np.abs(sims - tau) < tol)
    if len(band):
        pick = int(band[rng.integers(len(band))])
        return int(candidate_ids[pick]), float(sims[pick]), False, int(len(band))
    pick = int(np.argmin(np.abs(sims - tau)))
    return int(candidate_ids[pick]), float(sims[pick]), True, 0


def experiment_anchor(centroids: dict, forget: int, retain_train, tau: float, tol: float,
                      seed: int) -> tuple[int, float, bool, int]:
    """The anchor of one forget identity among its retain-train identities (``centroids``: identity -> centroid),
    drawn from the (seed, anchor, identity) stream so that any tau can be re-drawn later (tau ablation)."""
    candidates = np.asarray(retain_train)
    return select_anchor(centroids[forget], candidates, np.stack([centroids[int(j)] for j in candidates]), tau, tol,
                         np.random.default_rng([seed, _ANCHOR, forget]))


def anchor_for_tau(selection: dict, centroids: pd.DataFrame, tau: float) -> dict:
    """A selection's anchor re-drawn at another proximity ``tau`` (same tolerance, seed and candidates):
    the anchor fields of the selection for that tau."""
    cent = centroid_lookup(centroids)
    anchor, cosine, fallback, band = experiment_anchor(cent, selection["forget_identity"],
                                                       selection["retain_train_identities"], tau, selection["tol"],
                                                       selection["seed"])
    return {"anchor_identity": anchor, "anchor_cosine": cosine, "anchor_fallback": fallback,
            "anchor_band_size": band, "tau": tau}


def select_experiments(labels: pd.DataFrame, centroids: pd.DataFrame, cfg: dict, seed: int) -> list[Selection]:
    """The first ``cfg['n_forget']`` forget identities with their splits and anchors.

    ``labels``: image_id, identity. ``centroids``: identity, size, centroid. ``cfg``: the ``selection`` config.
    """
    sizes = centroids.set_index("identity")["size"]
    all_ids = centroids["identity"].to_numpy()
    retain_train_all, retain_val = retain_identity_split(all_ids, cfg["retain_train_fraction"], seed)
    # forget identities come from the retain-train side, so every experiment evaluates the same unseen identities
    order = forget_identity_order(sizes, retain_train_all, cfg["min_forget_images"], seed, cfg.get("target_mean_size"))
    if cfg["n_forget"] > len(order):
        raise ValueError(f"selection.n_forget = {cfg['n_forget']} but only {len(order)} identities have at least "
                         f"{cfg['min_forget_images']} images; lower n_forget or min_forget_images")
    return experiment_selections(labels, centroids, order[: cfg["n_forget"]], retain_train_all, retain_val, cfg, seed)


def experiment_selections(labels: pd.DataFrame, centroids: pd.DataFrame, forget_identities, retain_pool, retain_val,
                          cfg: dict, seed: int) -> list[Selection]:
    """One experiment per forget identity: its seeded forget-train/validation split, its anchor (eq. 6) among the
    ``retain_pool`` identities other than itself (its retain-train identities), and the ``retain_val`` identities.
    ``cfg``: the ``selection`` config."""
    cent = centroid_lookup(centroids)
    images_by_identity = labels.sort_values("image_id").groupby("identity")["image_id"].apply(list)
    retain_pool = np.asarray(retain_pool)
    tau, tol = cfg["anchor"]["tau"], cfg["anchor"]["tol"]
    selections = []
    for forget in forget_identities:
        images = np.array(images_by_identity[forget])
        perm = np.random.default_rng([seed, _FORGET_SPLIT, forget]).permutation(len(images))
        n_train = split_count(len(images), cfg["forget_train_fraction"])
        retain_train = retain_pool[retain_pool != forget]
        anchor, cosine, fallback, band = experiment_anchor(cent, forget, retain_train, tau, tol, seed)
        selections.append(Selection(
            forget_identity=int(forget),
            forget_train_images=sorted(images[perm[:n_train]].tolist()),
            forget_val_images=sorted(images[perm[n_train:]].tolist()),
            anchor_identity=anchor, anchor_cosine=cosine, anchor_fallback=fallback, anchor_band_size=band,
            tau=tau, tol=tol, seed=seed,
            retain_train_identities=[int(j) for j in retain_train],
            retain_val_identities=[int(j) for j in retain_val],
        ))
    return selections


def selections_table(selections: list[Selection]) -> pd.DataFrame:
    return pd.DataFrame([s.table_row() for s in selections])
