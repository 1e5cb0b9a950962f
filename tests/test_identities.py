import numpy as np
import pandas as pd
import pytest

from sklearn.cluster import DBSCAN
from sklearn.metrics import adjusted_rand_score

import idunlearn.identities as identities
from idunlearn.identities import (
    cluster_identities, clustering_summary, dbscan_identities, histogram_modes, identity_centroids,
    leave_one_out_1nn_accuracy, nearest_neighbours, neighbourhoods, run_identity_stage,
)


def _unit(v):
    v = np.asarray(v, float)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _three_people(rng, per_person=5, noise=0.05):
    centres = np.eye(8)[:3]
    emb = np.concatenate([_unit(c + noise * rng.standard_normal((per_person, 8))) for c in centres])
    truth = np.repeat(["a", "b", "c"], per_person)
    return emb, truth


def test_dbscan_recovers_people_and_turns_noise_into_singletons():
    rng = np.random.default_rng(0)
    emb, truth = _three_people(rng)
    outliers = np.eye(8)[5:7]  # two points far from everything (cosine distance 1)
    labels = cluster_identities(np.concatenate([emb, outliers]), eps=0.35, min_samples=2)
    assert labels.tolist() == [0] * 5 + [1] * 5 + [2] * 5 + [3, 4]


def test_labels_follow_first_appearance_order():
    rng = np.random.default_rng(1)
    emb, _ = _three_people(rng)
    order = np.array([10, 0, 5, 11, 1, 6, 12, 2, 7, 13, 3, 8, 14, 4, 9])
    labels = cluster_identities(emb[order])
    assert labels[:3].tolist() == [0, 1, 2]


def test_centroid_is_normalised_mean_eq5():
    emb = np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 2.0], [0.6, 0.8, 0.0]])
    cent = identity_centroids(emb, np.array([0, 1, 0]))
    # by hand: normalised rows (0.6, 0.8, 0) twice -> mean (0.6, 0.8, 0), already unit
    np.testing.assert_allclose(cent.loc[0, "centroid"], [0.6, 0.8, 0.0], atol=1e-6)
    np.testing.assert_allclose(cent.loc[1, "centroid"], [0.0, 0.0, 1.0], atol=1e-6)
    assert cent["size"].tolist() == [2, 1]


def test_nearest_neighbour_and_leave_one_out_by_hand():
    emb = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-1.0, 0.0]])
    # cosines: (0,1)=0.8 (0,2)=0 (0,3)=-1 (1,2)=0.6 (1,3)=-0.8 (2,3)=0
    nearest = nearest_neighbours(emb)
    np.testing.assert_allclose(nearest.cosine, [0.8, 0.8, 0.6, 0.0])
    # nearest: 0->1, 1->0, 2->1, 3->2 (cos(3,2)=0 beats cos(3,0)=-1 and cos(3,1)=-0.8)
    assert nearest.index.tolist() == [1, 0, 1, 2]
    assert leave_one_out_1nn_accuracy(nearest, ["x", "x", "y", "y"]) == pytest.approx(0.75)


def test_histogram_modes_of_a_bimodal_sample():
    rng = np.random.default_rng(2)
    values = np.concatenate([rng.normal(0.25, 0.04, 3000), rng.normal(0.8, 0.04, 5000)])
    hist = histogram_modes(values, bins=50)
    assert hist["mode_low"] == pytest.approx(0.25, abs=0.05)
    assert hist["mode_high"] == pytest.approx(0.8, abs=0.05)
    assert 0.35 < hist["valley"] < 0.7
    unimodal = histogram_modes(rng.normal(0.8, 0.03, 1000), bins=50)
    assert np.isnan(unimodal["mode_low"]) and unimodal["mode_high"] == pytest.approx(0.8, abs=0.05)


def test_summary_scores_a_perfect_clustering():
    rng = np.random.default_rng(3)
    emb, truth = _three_people(rng)
    labels = cluster_identities(emb)
    summary = clustering_summary(labels, nearest_neighbours(emb), n_images_total=16, true_labels=truth)
    summary = summary.set_index("metric")["value"]
    assert summary["adjusted_rand_index"] == 1.0 and summary["normalized_mutual_info"] == pytest.approx(1.0)
    assert summary["loo_1nn_accuracy"] == 1.0
    assert summary["images_total"] == 16 and summary["identities"] == 3 and summary["size_mean"] == 5


def test_identity_stage_drops_non_ok_and_non_finite_rows():
    rng = np.random.default_rng(4)
    emb, truth = _three_people(rng)
    rows = [{"image_id": f"i{k}", "status": "ok", "embedding": e.tolist()} for k, e in enumerate(emb)]
    rows.append({"image_id": "bad", "status": "no_face", "embedding": None})
    rows.append({"image_id": "nan", "status": "ok", "embedding": [np.nan] * 8})
    manifest = pd.DataFrame({"image_id": [r["image_id"] for r in rows], "true_identity": list(truth) + [None, None]})
    stage = run_identity_stage(pd.DataFrame(rows), manifest, {"eps": 0.35, "min_samples": 2, "histogram_bins": 20})
    summary = stage.summary.set_index("metric")["value"]
    assert summary["images_dropped_nonfinite"] == 1 and summary["images_embedded"] == 15
    assert summary["adjusted_rand_index"] == 1.0
    assert set(stage.labels["image_id"]) == {f"i{k}" for k in range(15)}
    assert stage.histogram_table["count"].sum() == 15


def test_no_embeddings_is_a_clear_error():
    with pytest.raises(ValueError, match="no embeddings to cluster"):
        cluster_identities(np.zeros((0, 4)))


# --- row blocks: same answers as the full float64 matrix, bounded memory at CelebA-HQ size ------------------------

def _with_duplicates(rng, n=23, dim=6):
    """Random embeddings plus exact copies of some rows (ties for the nearest neighbour), shuffled."""
    x = rng.standard_normal((n, dim))
    x = np.concatenate([x, x[[0, 0, 1, n - 1, n - 1]]])
    return x[rng.permutation(len(x))]


def _full_matrix_nearest(x):
    """The straightforward reference: whole float64 cosine matrix, self excluded, argmax (first index on ties)."""
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    sim = unit @ unit.T
    np.fill_diagonal(sim, -np.inf)
    return sim.argmax(axis=1), sim.max(axis=1)


@pytest.mark.parametrize("block_rows", [1, 3, 5, None])  # 28 rows: 3 and 5 leave a short last block
def test_nearest_neighbours_in_blocks_equal_the_full_matrix(block_rows):
    rng = np.random.default_rng(5)
    x = _with_duplicates(rng)
    ref_index, ref_cosine = _full_matrix_nearest(x)
    nearest = nearest_neighbours(x, block_rows=block_rows)
    assert nearest.index.tolist() == ref_index.tolist()
    np.testing.assert_allclose(nearest.cosine, ref_cosine, rtol=0, atol=1e-12)
    assert (nearest.index != np.arange(len(x))).all()  # never itself, even beside an exact copy
    truth = rng.integers(0, 4, len(x))
    assert leave_one_out_1nn_accuracy(nearest, truth) == pytest.approx(np.mean(truth[ref_index] == truth))


def test_nearest_neighbour_ties_go_to_the_lower_index():
    x = np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 2.0], [1.0, 0.1], [0.0, 3.0]])
    # rows 0, 2, 4 point the same way: each one's nearest is the lowest-index other copy
    assert nearest_neighbours(x, block_rows=2).index.tolist() == [2, 3, 0, 1, 0]


def test_float32_near_ties_are_decided_in_float64():
    # candidates 1 and 2 differ from row 0 by less than float32 resolves; the exact float64 winner is row 2
    x = np.array([[1.0, 0.0, 0.0], [1.0, 1e-4, 0.0], [1.0, 0.0, 0.99e-4], [0.0, 1.0, 0.0]])
    nearest = nearest_neighbours(x)
    assert nearest.index[0] == _full_matrix_nearest(x)[0][0] == 2


def test_a_single_sample_has_no_neighbour():
    nearest = nearest_neighbours(np.array([[1.0, 2.0]]))
    assert nearest.index.tolist() == [-1] and nearest.cosine.tolist() == [-np.inf]
    assert np.isnan(leave_one_out_1nn_accuracy(nearest, ["a"]))
    with pytest.raises(ValueError, match="3 true labels for 1 nearest neighbours"):
        leave_one_out_1nn_accuracy(nearest, ["a", "b", "c"])


def _dbscan_with_cosine_metric(x, eps, min_samples):
    """The reference: scikit-learn's DBSCAN on the cosine metric, renumbered by first appearance like ours."""
    raw = DBSCAN(eps=eps, min_samples=min_samples, metric="cosine").fit_predict(x)
    keys = [("c", r) if r >= 0 else ("n", i) for i, r in enumerate(raw)]
    first = {k: n for n, k in enumerate(dict.fromkeys(keys))}
    return [first[k] for k in keys]


@pytest.mark.parametrize("block_rows", [1, 4, None])
@pytest.mark.parametrize("eps,min_samples", [(0.1, 2), (0.3, 2), (0.3, 4), (0.5, 3)])
def test_dbscan_on_the_radius_graph_gives_the_cosine_metric_labels(block_rows, eps, min_samples):
    rng = np.random.default_rng(6)
    people = np.concatenate([c + 0.3 * rng.standard_normal((6, 8)) for c in 1.5 * np.eye(8)[:4]])
    x = np.concatenate([people, _with_duplicates(rng, n=9, dim=8)])[rng.permutation(len(people) + 14)]
    labels = cluster_identities(x, eps, min_samples, block_rows=block_rows)
    reference = _dbscan_with_cosine_metric(x, eps, min_samples)
    assert labels.tolist() == reference
    # the stage's single pass: the same labels and, from the same blocks, the nearest neighbours
    scan = neighbourhoods(x, eps, block_rows)
    assert dbscan_identities(scan.radius_graph, eps, min_samples).tolist() == reference
    assert scan.nearest.index.tolist() == _full_matrix_nearest(x)[0].tolist()
    assert 1 < len(set(reference)) < len(x)  # the data gives DBSCAN clusters, borders and noise to decide


def _pairs_at_distances(distances: list[float], dim: int, seed: int) -> np.ndarray:
    """Unit rows (2 per distance): row 2k and 2k + 1 at exactly cosine distance ``distances[k]`` (float64, up to
    1e-16), every other pair near distance 1; then turned by one random rotation, so that float32 rounds them all."""
    x = np.zeros((2 * len(distances), dim))
    for k, distance in enumerate(distances):
        angle = np.arccos(1.0 - distance)
        x[2 * k, 2 * k] = 1.0
        x[2 * k + 1, 2 * k], x[2 * k + 1, 2 * k + 1] = np.cos(angle), np.sin(angle)
    rotation, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((dim, dim)))
    return x @ rotation


@pytest.mark.parametrize("eps", [0.35, 0.1])
def test_pairs_within_1e7_of_eps_are_decided_on_the_right_side(eps):
    # 48 pairs at eps - delta and eps + delta, delta from 1e-7 down to 1e-9: far below float32's resolution of a
    # cosine (6e-8 near 0.65, the rounding of a 128-term dot product more), so only the float64 check decides.
    # Inside: the pair is a cluster of 2 (min_samples 2); outside: 2 noise points, each its own label.
    deltas = [1e-7, 3e-8, 1e-8, 3e-9, 1e-9, 5e-8, 2e-8, 5e-9] * 3
    distances = [eps + sign * delta for delta in deltas for sign in (-1.0, 1.0)]
    x = _pairs_at_distances(distances, dim=128, seed=11)
    exact = 1.0 - np.einsum("ij,ij->i", x[0::2], x[1::2])  # float64: still within 1e-15 of the placed distances
    assert np.all(np.sign(exact - eps) == np.repeat([[-1.0, 1.0]], len(deltas), axis=0).ravel())
    labels = cluster_identities(x, eps, min_samples=2, block_rows=7)
    together = labels[0::2] == labels[1::2]
    assert together.tolist() == [True, False] * len(deltas)
    assert len(set(labels.tolist())) == len(deltas) + 2 * len(deltas)  # one cluster per inside pair, the rest alone


def test_radius_graph_with_too_many_pairs_names_eps(monkeypatch):
    monkeypatch.setattr(identities, "MAX_RADIUS_PAIRS", 50)
    with pytest.raises(ValueError, match="lower identities.eps"):
        cluster_identities(np.random.default_rng(7).standard_normal((20, 4)), eps=1.9)


def test_centroids_of_unsorted_sparse_identity_numbers():
    rng = np.random.default_rng(8)
    emb, labels = rng.standard_normal((30, 6)), rng.choice([9, 2, 40], size=30)
    cent = identity_centroids(emb, labels).set_index("identity")
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    for ident in (2, 9, 40):
        mean = unit[labels == ident].mean(0)
        np.testing.assert_allclose(cent.loc[ident, "centroid"], mean / np.linalg.norm(mean), atol=1e-6)
        assert cent.loc[ident, "size"] == (labels == ident).sum()


@pytest.mark.slow
def test_identity_stage_at_celebahq_size():
    """28,000 x 512 embeddings of 6,000 synthetic people (4-5 images each), the whole stage as the rule runs it."""
    import time
    import tracemalloc

    rng = np.random.default_rng(9)
    sizes = np.where(np.arange(6000) < 4000, 5, 4)
    truth = np.repeat(np.arange(len(sizes)), sizes)
    centres = _unit(rng.standard_normal((len(sizes), 512)))
    emb = (centres[truth] + 0.02 * rng.standard_normal((len(truth), 512))).astype(np.float32)
    ids = [f"img{i:05d}" for i in range(len(truth))]
    faces = pd.DataFrame({"image_id": ids, "status": "ok", "embedding": list(emb)})
    manifest = pd.DataFrame({"image_id": ids, "true_identity": truth})

    tracemalloc.start()
    start = time.process_time()
    stage = run_identity_stage(faces, manifest, {"eps": 0.35, "min_samples": 2, "histogram_bins": 50})
    cpu_seconds = time.process_time() - start  # CPU, not wall: the suite's other worker shares the cores
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    summary = stage.summary.set_index("metric")["value"]
    assert summary["images_embedded"] == 28000
    assert adjusted_rand_score(truth, stage.labels["identity"]) > 0.95
    assert summary["adjusted_rand_index"] > 0.95 and summary["loo_1nn_accuracy"] > 0.95
    assert abs(summary["identities"] - 6000) < 300 and len(stage.centroids) == summary["identities"]
    assert stage.histogram_table["count"].sum() == 28000
    assert peak < 2**30  # traced numpy and Python memory; one float64 28,000 x 28,000 matrix alone is 5.8 GiB
    assert cpu_seconds <= 120, (f"identity stage took {cpu_seconds:.0f} CPU seconds on 28,000 embeddings (issue bound: "
                                "60 s on 2 cores)")
