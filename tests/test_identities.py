import numpy as np
import pandas as pd
import pytest

from idunlearn.identities import (
    cluster_identities, clustering_summary, histogram_modes, identity_centroids,
    leave_one_out_1nn_accuracy, nearest_neighbour_cosine, run_identity_stage,
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
    np.testing.assert_allclose(nearest_neighbour_cosine(emb), [0.8, 0.8, 0.6, 0.0])
    # nearest: 0->1, 1->0, 2->1, 3-> 2 (tie 0 with index 2 first? cos(3,2)=0 vs cos(3,0)=-1, so 2)
    assert leave_one_out_1nn_accuracy(emb, ["x", "x", "y", "y"]) == pytest.approx(0.75)


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
    summary = clustering_summary(labels, emb, n_images_total=16, true_labels=truth).set_index("metric")["value"]
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
