"""Identity discovery: DBSCAN over face embeddings (PIU Section 4 and appendix A), centroids (eq. 5), diagnostics.

Every all-pairs step (DBSCAN's neighbourhoods, the nearest-neighbour histogram, leave-one-out 1-NN) comes from one
pass of float32 row blocks against the whole array, never holding an N x N matrix nor forming a same-array product
(OpenBLAS's symmetric path segfaults on float64 ``emb @ emb.T`` from about 20,000 rows; CelebA-HQ has 28,000 images).
The few pairs that float32 rounding could misorder are rescored in float64, so results equal the exact float64 ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd
from scipy import sparse
from sklearn.cluster import DBSCAN
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
from sklearn.neighbors import sort_graph_by_row_values

from .faces.analyser import embedding_matrix

BLOCK_ELEMENTS = 2**25  # one float32 similarity block is 128 MiB however many embeddings there are
MAX_RADIUS_PAIRS = 50_000_000  # DBSCAN neighbourhoods beyond this (about 600 MB) mean eps links near everything


def l2_normalise(x: np.ndarray, axis: int = -1) -> np.ndarray:
    norm = np.linalg.norm(x, axis=axis, keepdims=True)
    if np.any(~np.isfinite(norm)) or np.any(norm == 0):
        raise ValueError("cannot L2-normalise: some embeddings are zero, NaN or infinite")
    return x / norm


def _float32_slack(dim: int) -> float:
    """Bound on |float32 - float64| cosine of two unit vectors of length ``dim`` (input rounding, a dim-term sum)."""
    return float((dim + 2) * np.finfo(np.float32).eps)


def _similarity_blocks(unit: np.ndarray, block_rows: int | None) -> Iterator[tuple[int, np.ndarray]]:
    """(start, float32 cosines of rows start.. against every row), one bounded block of rows at a time."""
    n = len(unit)
    rows = block_rows if block_rows is not None else max(1, BLOCK_ELEMENTS // n)
    if rows < 1:
        raise ValueError(f"block_rows must be at least 1, got {block_rows}")
    unit32 = unit.astype(np.float32)
    columns = unit32.copy()  # a separate buffer: numpy sends a @ a.T of one buffer to BLAS's symmetric path
    for start in range(0, n, rows):
        yield start, unit32[start:start + rows] @ columns.T


def _pair_cosines(unit: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Float64 cosine of each listed pair of unit rows."""
    return np.einsum("ij,ij->i", unit[rows], unit[cols])


def _radius_pairs(unit: np.ndarray, start: int, sim: np.ndarray, eps: float) -> tuple[np.ndarray, ...]:
    """(rows, cols, cosine distances) of a block's pairs within ``eps``: 1 - cos in float64, clipped to [0, 2] as
    scikit-learn's cosine metric, self pairs exactly 0; float32 screens them with the rounding bound as slack."""
    rows, cols = np.nonzero(sim >= np.float32(1 - eps - _float32_slack(unit.shape[1])))
    rows += start
    dist = np.clip(1 - _pair_cosines(unit, rows, cols), 0, 2)
    dist[rows == cols] = 0.0
    keep = dist <= eps
    return rows[keep], cols[keep], dist[keep]


def _nearest_in_block(unit: np.ndarray, start: int, sim: np.ndarray, index: np.ndarray, cosine: np.ndarray) -> None:
    """Fill ``index`` and ``cosine`` for a block's rows: the float32 candidates within the rounding bound of each
    row's best are rescored in float64; ties go to the lower index, as argmax. Overwrites the block's self cosines."""
    local = np.arange(len(sim))
    sim[local, start + local] = -np.inf  # a sample is not its own neighbour
    margin = np.float32(2 * _float32_slack(unit.shape[1]))
    rows, cols = np.nonzero(sim >= (sim.max(axis=1) - margin)[:, None])
    rows += start
    exact = _pair_cosines(unit, rows, cols)
    ranked = np.lexsort((cols, -exact, rows))  # per row: highest float64 cosine, then lowest index
    best = ranked[np.r_[True, rows[ranked][1:] != rows[ranked][:-1]]]
    index[rows[best]], cosine[rows[best]] = cols[best], exact[best]


@dataclass(frozen=True)
class NearestNeighbours:
    index: np.ndarray  # (N,) each sample's nearest other sample, -1 when there is none
    cosine: np.ndarray  # (N,) float64 cosine to it, -inf when there is none


@dataclass(frozen=True)
class Neighbourhoods:
    radius_graph: sparse.csr_matrix | None  # cosine distances of the pairs within eps, self pairs explicit zeros
    nearest: NearestNeighbours


def neighbourhoods(embeddings: np.ndarray, eps: float | None, block_rows: int | None = None) -> Neighbourhoods:
    """One pass over float32 row blocks: the pairs within cosine distance ``eps`` (none when ``eps`` is None) and
    each sample's nearest other sample (PIU Fig. 7), both as the exact float64 cosines decide.

    Memory: one block, plus the within-eps pairs (grows with the pairs, not with N squared).
    """
    if len(embeddings) == 0:
        raise ValueError("no embeddings to cluster: every image failed face extraction")
    unit = l2_normalise(np.asarray(embeddings, np.float64))
    n = len(unit)
    index, cosine = np.full(n, -1, np.int64), np.full(n, -np.inf)
    found, pairs = [], 0
    for start, sim in _similarity_blocks(unit, block_rows):
        if eps is not None:  # before _nearest_in_block overwrites the self cosines
            found.append(_radius_pairs(unit, start, sim, eps))
            pairs += len(found[-1][0])
            if pairs > MAX_RADIUS_PAIRS:
                raise ValueError(f"identities.eps = {eps} links more than {MAX_RADIUS_PAIRS} embedding pairs, so "
                                 "DBSCAN would put nearly everyone in one identity: lower identities.eps (paper 0.35)")
        if n > 1:
            _nearest_in_block(unit, start, sim, index, cosine)
    graph = None
    if eps is not None:
        rows, cols, dist = (np.concatenate(parts) for parts in zip(*found))
        graph = sort_graph_by_row_values(sparse.csr_matrix((dist, (rows, cols)), shape=(n, n)), copy=False,
                                         warn_when_not_sorted=False)
    return Neighbourhoods(graph, NearestNeighbours(index, cosine))


def nearest_neighbours(embeddings: np.ndarray, block_rows: int | None = None) -> NearestNeighbours:
    """Each sample's nearest other sample by cosine and that cosine (``neighbourhoods`` without the radius pairs)."""
    return neighbourhoods(embeddings, None, block_rows).nearest


def dbscan_identities(radius_graph: sparse.csr_matrix, eps: float, min_samples: int) -> np.ndarray:
    """Identity label per embedding: DBSCAN with cosine distance (PIU appendix A), noise points as singletons.

    DBSCAN reads the sparse within-eps distances of ``neighbourhoods``, which give the labels of its cosine metric
    with memory bounded by the neighbourhoods. Labels are renumbered 0..K-1 in order of each identity's first image,
    so they do not depend on DBSCAN's numbering.
    """
    raw = DBSCAN(eps=eps, min_samples=min_samples, metric="precomputed").fit_predict(radius_graph)
    keys = [("c", int(r)) if r >= 0 else ("n", i) for i, r in enumerate(raw)]  # each noise point is its own key
    order: dict = {}
    for key in keys:
        order.setdefault(key, len(order))
    return np.array([order[k] for k in keys], dtype=np.int64)


def cluster_identities(embeddings: np.ndarray, eps: float = 0.35, min_samples: int = 2,
                       block_rows: int | None = None) -> np.ndarray:
    """``dbscan_identities`` on the embeddings' within-eps pairs."""
    return dbscan_identities(neighbourhoods(embeddings, eps, block_rows).radius_graph, eps, min_samples)


def identity_centroids(embeddings: np.ndarray, labels: np.ndarray) -> pd.DataFrame:
    """Per identity: size and centroid, the L2-normalised mean of its L2-normalised embeddings (PIU eq. 5)."""
    emb = l2_normalise(np.asarray(embeddings, np.float64))
    ids, member_of, sizes = np.unique(np.asarray(labels), return_inverse=True, return_counts=True)
    by_identity = np.argsort(member_of, kind="stable")
    sums = np.add.reduceat(emb[by_identity], np.r_[0, np.cumsum(sizes)[:-1]], axis=0)
    centroids = l2_normalise(sums / sizes[:, None]).astype(np.float32)
    return pd.DataFrame({"identity": ids.astype(np.int64), "size": sizes.astype(np.int64),
                         "centroid": [c.tolist() for c in centroids]})


def centroid_matrix(centroids: pd.DataFrame) -> np.ndarray:
    return np.stack(centroids["centroid"].to_numpy()).astype(np.float64)


def centroid_lookup(centroids: pd.DataFrame) -> dict[int, np.ndarray]:
    """Identity -> its centroid (float64), from the centroids table."""
    return dict(zip(centroids["identity"].astype(int).tolist(), centroid_matrix(centroids)))


def leave_one_out_1nn_accuracy(nearest: NearestNeighbours, true_labels) -> float:
    """Fraction of samples whose nearest other sample (cosine) has the same true identity; NaN below 2 samples."""
    true_labels = np.asarray(true_labels)
    if len(true_labels) != len(nearest.index):
        raise ValueError(f"{len(true_labels)} true labels for {len(nearest.index)} nearest neighbours")
    if len(true_labels) < 2:
        return float("nan")
    return float(np.mean(true_labels[nearest.index] == true_labels))


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


def clustering_summary(labels: np.ndarray, nearest: NearestNeighbours, n_images_total: int,
                       true_labels=None) -> pd.DataFrame:
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
            loo_1nn_accuracy=leave_one_out_1nn_accuracy(nearest, true_labels),
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
    scan = neighbourhoods(matrix, cfg["eps"])  # the one all-pairs pass
    labels = dbscan_identities(scan.radius_graph, cfg["eps"], cfg["min_samples"])
    truth = manifest.set_index("image_id")["true_identity"].reindex(ok["image_id"]).to_numpy()
    has_truth = len(truth) > 0 and pd.notna(truth).all()
    summary = clustering_summary(labels, scan.nearest, len(manifest), truth if has_truth else None)
    hist = histogram_modes(scan.nearest.cosine, bins=cfg["histogram_bins"])
    extra = {"images_dropped_nonfinite": int((~finite).sum()), "nn_mode_low": hist["mode_low"],
             "nn_mode_high": hist["mode_high"], "nn_valley": hist["valley"],
             "dbscan_eps": cfg["eps"], "dbscan_min_samples": cfg["min_samples"]}
    summary = pd.concat([summary, pd.DataFrame({"metric": list(extra), "value": [float(v) for v in extra.values()]})],
                        ignore_index=True)
    label_table = pd.DataFrame({"image_id": ok["image_id"].to_numpy(), "identity": labels, "true_identity": truth})
    return IdentityStage(label_table, identity_centroids(matrix, labels), summary, hist)
