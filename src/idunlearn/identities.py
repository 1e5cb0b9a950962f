"""Identity discovery: DBSCAN over face embeddings (PIU Section 4 and appendix A), centroids (eq. 5), diagnostics."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.cluster import DBSCAN
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from .faces.analyser import embedding_matrix


def l2_normalise(x: np.ndarray, axis: int = -1) -> np.ndarray:
    norm = np.linalg.norm(x, axis=axis, keepdims=True)
    if np.any(~np.isfinite(norm)) or np.any(norm == 0):
        raise ValueError("cannot L2-normalise: some embeddings are zero, NaN or infinite")
    return x / norm


def cluster_identities(embeddings: np.ndarray, eps: float = 0.35, min_samples: int = 2) -> np.ndarray:
    """Identity label per embedding: DBSCAN with cosine distance (PIU appendix A), noise points as singletons.

    Labels are renumbered 0..K-1 in order of each identity's first image, so they do not depend on DBSCAN's numbering.
    """
    if len(embeddings) == 0:
        raise ValueError("no embeddings to cluster: every image failed face extraction")
    emb = l2_normalise(np.asarray(embeddings, np.float64))
    raw = DBSCAN(eps=eps, min_samples=min_samples, metric="cosine").fit_predict(emb)
    keys = [("c", int(r)) if r >= 0 else ("n", i) for i, r in enumerate(raw)]  # each noise point is its own key
    order: dict = {}
    for key in keys:
        order.setdefault(key, len(order))
    return np.array([order[k] for k in keys], dtype=np.int64)


def identity_centroids(embeddings: np.ndarray, labels: np.ndarray) -> pd.DataFrame:
    """Per identity: size and centroid, the L2-normalised mean of its L2-normalised embeddings (PIU eq. 5)."""
    emb = l2_normalise(np.asarray(embeddings, np.float64))
    ids = np.unique(labels)
    rows = []
    for ident in ids:
        members = emb[labels == ident]
        rows.append({"identity": int(ident), "size": int(len(members)),
                     "centroid": l2_normalise(members.mean(0)).astype(np.float32).tolist()})
    return pd.DataFrame(rows)


def centroid_matrix(centroids: pd.DataFrame) -> np.ndarray:
    return np.stack(centroids["centroid"].to_numpy()).astype(np.float64)


def centroid_lookup(centroids: pd.DataFrame) -> dict[int, np.ndarray]:
    """Identity -> its centroid (float64), from the centroids table."""
    return dict(zip(centroids["identity"].astype(int).tolist(), centroid_matrix(centroids)))


def nearest_neighbour_cosine(embeddings: np.ndarray) -> np.ndarray:
    """For each sample, the cosine similarity to its nearest other sample (PIU Fig. 7)."""
    emb = l2_normalise(np.asarray(embeddings, np.float64))
    sim = emb @ emb.T
    np.fill_diagonal(sim, -np.inf)
    return sim.max(axis=1)


def leave_one_out_1nn_accuracy(embeddings: np.ndarray, true_labels) -> float:
    """Fraction of samples whose nearest other sample (cosine) has the same true identity."""
    emb = l2_normalise(np.asarray(embeddings, np.float64))
    sim = emb @ emb.T
    np.fill_diagonal(sim, -np.inf)
    true_labels = np.asarray(true_labels)
    return float(np.mean(true_labels[sim.argmax(axis=1)] == true_labels))


def histogram_modes(values: np.ndarray, bins: int = 50, value_range=(-1.0, 1.0)) -> dict:
    """The two highest local maxima of the (3-bin smoothed) histogram and the lowest point between them.

    Returns bin centres; a missing second mode is NaN (a unimodal distribution is reported as such).
    """
    counts, edges = np.histogram(values, bins=bins, range=value_range)
    centres = (edges[:-1] + edges[1:]) / 2
    smooth = np.convolve(np.pad(counts.astype(float), 1, mode="edge"), np.ones(3) / 3, mode="valid")
    peaks = [i for i in range(bins) if smooth[i] > 0
             and smooth[i] >= (smooth[i - 1] if i > 0 else -1) and smooth[i] > (smooth[i + 1] if i < bins - 1 else -1)]
    peaks = sorted(sorted(peaks, key=lambda i: -smooth[i])[:2])
    out = {"mode_low": np.nan, "mode_high": np.nan, "valley": np.nan}
    if len(peaks) == 1:
        out["mode_high"] = float(centres[peaks[0]])
    elif len(peaks) == 2:
        lo, hi = peaks
        out.update(mode_low=float(centres[lo]), mode_high=float(centres[hi]),
                   valley=float(centres[lo + int(np.argmin(smooth[lo:hi + 1]))]))
    return {"counts": counts, "edges": edges, **out}


def clustering_summary(labels: np.ndarray, embeddings: np.ndarray, n_images_total: int, true_labels=None) -> pd.DataFrame:
    """Tidy (metric, value) table: images, clusters, size distribution, and agreement with true identities if known."""
    sizes = np.bincount(labels)
    rows = {
        "images_total": n_images_total,
        "images_embedded": len(labels),
        "identities": len(sizes),
        "clusters_2plus": int((sizes >= 2).sum()),
        "singletons": int((sizes == 1).sum()),
        "size_mean": float(sizes.mean()),
        "size_median": float(np.median(sizes)),
        "size_max": int(sizes.max()),
        "size_mean_2plus": float(sizes[sizes >= 2].mean()) if (sizes >= 2).any() else np.nan,
    }
    if true_labels is not None:
        rows.update(
            true_identities=int(pd.Series(true_labels).nunique()),
            adjusted_rand_index=float(adjusted_rand_score(true_labels, labels)),
            normalized_mutual_info=float(normalized_mutual_info_score(true_labels, labels)),
            loo_1nn_accuracy=leave_one_out_1nn_accuracy(embeddings, true_labels),
        )
    return pd.DataFrame({"metric": list(rows), "value": [float(v) for v in rows.values()]})


@dataclass
class IdentityStage:
    labels: pd.DataFrame  # image_id, identity, true_identity
    centroids: pd.DataFrame  # identity, size, centroid
    summary: pd.DataFrame  # metric, value
    histogram: dict  # counts, edges, modes (see histogram_modes)

    @property
    def histogram_table(self) -> pd.DataFrame:
        edges = self.histogram["edges"]
        return pd.DataFrame({"bin_left": edges[:-1], "bin_right": edges[1:], "count": self.histogram["counts"]})


def run_identity_stage(embeddings: pd.DataFrame, manifest: pd.DataFrame, cfg: dict) -> IdentityStage:
    """Cluster the ok embeddings of the face table; rows with non-finite embeddings are dropped and counted."""
    ok = embeddings[embeddings["status"] == "ok"]
    matrix = embedding_matrix(embeddings).astype(np.float64)
    finite = np.all(np.isfinite(matrix), axis=1) & (np.linalg.norm(matrix, axis=1) > 0)
    ok, matrix = ok[finite], matrix[finite]
    labels = cluster_identities(matrix, cfg["eps"], cfg["min_samples"])
    truth = manifest.set_index("image_id")["true_identity"].reindex(ok["image_id"]).to_numpy()
    has_truth = len(truth) > 0 and pd.notna(truth).all()
    summary = clustering_summary(labels, matrix, len(manifest), truth if has_truth else None)
    hist = histogram_modes(nearest_neighbour_cosine(matrix), bins=cfg["histogram_bins"])
    extra = {"images_dropped_nonfinite": int((~finite).sum()), "nn_mode_low": hist["mode_low"],
             "nn_mode_high": hist["mode_high"], "nn_valley": hist["valley"],
             "dbscan_eps": cfg["eps"], "dbscan_min_samples": cfg["min_samples"]}
    summary = pd.concat([summary, pd.DataFrame({"metric": list(extra), "value": [float(v) for v in extra.values()]})],
                        ignore_index=True)
    label_table = pd.DataFrame({"image_id": ok["image_id"].to_numpy(), "identity": labels, "true_identity": truth})
    return IdentityStage(label_table, identity_centroids(matrix, labels), summary, hist)
