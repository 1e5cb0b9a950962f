import math

import numpy as np
import pandas as pd
import pytest

from idunlearn.config import validate_config
from idunlearn.identities import identity_centroids
from idunlearn.selection import (
    anchor_for_tau, forget_identity_order, retain_identity_split, select_anchor, select_experiments, selections_table,
    split_count,
)


def _world(n_ids=30, per_id=10, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_ids, dim))
    emb, ids, images = [], [], []
    for i in range(n_ids):
        for k in range(per_id if i % 7 else 3):  # every 7th identity is small (3 images)
            emb.append(centres[i] + 0.1 * rng.standard_normal(dim))
            ids.append(i)
            images.append(f"img_{i:03d}_{k:02d}")
    emb = np.array(emb)
    labels = pd.DataFrame({"image_id": images, "identity": ids})
    return labels, identity_centroids(emb, np.array(ids))


def _cfg(**over):
    cfg = validate_config({"selection": over})["selection"]
    return cfg


def test_split_count_is_floor_and_keeps_both_sides():
    assert split_count(10, 0.65) == 6 and split_count(15, 0.65) == 9 and split_count(40, 0.9) == 36
    assert split_count(2, 0.65) == 1 and split_count(3, 0.99) == 2
    with pytest.raises(ValueError):
        split_count(1, 0.5)


def test_experiments_have_exact_splits_and_anchors_in_retain_train():
    labels, cents = _world()
    sel = select_experiments(labels, cents, _cfg(n_forget=5, anchor={"tau": 0.2, "tol": 0.05}), seed=7)
    sizes = labels.groupby("identity").size()
    n_ids = len(cents)
    for s in sel:
        n = sizes[s.forget_identity]
        assert len(s.forget_train_images) == math.floor(0.65 * n) and len(s.forget_train_images) + len(s.forget_val_images) == n
        assert set(s.forget_train_images).isdisjoint(s.forget_val_images)
        assert set(s.forget_train_images) | set(s.forget_val_images) == set(labels.loc[labels.identity == s.forget_identity, "image_id"])
        assert s.anchor_identity in s.retain_train_identities and s.anchor_identity != s.forget_identity
        assert s.forget_identity not in s.retain_train_identities + s.retain_val_identities
        assert set(s.retain_train_identities).isdisjoint(s.retain_val_identities)
        assert len(s.retain_train_identities) == math.floor(0.9 * n_ids) - 1
        assert len(s.retain_val_identities) == n_ids - math.floor(0.9 * n_ids)
        c = cents.set_index("identity")["centroid"]
        cos = float(np.dot(c[s.forget_identity], c[s.anchor_identity]))
        assert s.anchor_cosine == pytest.approx(cos, abs=1e-5)
        if not s.anchor_fallback:
            assert abs(s.anchor_cosine - 0.2) < 0.05 and s.anchor_band_size >= 1
    # every experiment evaluates the same unseen retain identities
    assert len({tuple(s.retain_val_identities) for s in sel}) == 1


def test_forget_identities_exclude_small_clusters_and_grow_by_prefix():
    labels, cents = _world()
    small = set(range(0, 30, 7))
    few = select_experiments(labels, cents, _cfg(n_forget=3), seed=1)
    more = select_experiments(labels, cents, _cfg(n_forget=4), seed=1)
    assert [s.to_dict() for s in more[:3]] == [s.to_dict() for s in few]
    assert not {s.forget_identity for s in more} & small


def test_same_seed_same_selection_other_seed_differs():
    labels, cents = _world()
    a = selections_table(select_experiments(labels, cents, _cfg(n_forget=4), seed=3))
    b = selections_table(select_experiments(labels, cents, _cfg(n_forget=4), seed=3))
    c = selections_table(select_experiments(labels, cents, _cfg(n_forget=4), seed=4))
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)


def test_anchor_band_uniform_and_fallback_when_empty():
    forget = np.array([1.0, 0.0])
    angles = np.arccos([0.195, 0.205, 0.5, 0.9])
    cands = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    ids = np.array([10, 11, 12, 13])
    picks = {select_anchor(forget, ids, cands, 0.2, 0.01, np.random.default_rng(s))[0] for s in range(40)}
    assert picks == {10, 11}  # both band members get drawn, nothing else
    anchor, cos, fallback, band = select_anchor(forget, ids[2:], cands[2:], 0.2, 0.01, np.random.default_rng(0))
    assert (anchor, fallback, band) == (12, True, 0) and cos == pytest.approx(0.5)


def test_target_mean_size_prefers_clusters_near_the_target():
    sizes = pd.Series({0: 2, 1: 15, 2: 30, 3: 14, 4: 16, 5: 4})
    order = forget_identity_order(sizes, np.array(list(sizes.index)), min_images=4, seed=0, target_mean_size=15)
    assert order[0] == 1 and set(order[1:3]) == {3, 4} and 0 not in order


def test_too_many_forget_identities_is_a_clear_error():
    labels, cents = _world()
    with pytest.raises(ValueError, match="n_forget = 100"):
        select_experiments(labels, cents, _cfg(n_forget=100), seed=0)


def test_retain_split_is_seeded():
    a = retain_identity_split(np.arange(40), 0.9, seed=5)
    b = retain_identity_split(np.arange(40), 0.9, seed=5)
    assert [x.tolist() for x in a] == [x.tolist() for x in b] and len(a[0]) == 36 and len(a[1]) == 4


def test_anchor_for_tau_reproduces_the_selection_and_moves_with_tau():
    labels, cents = _world()
    cfg = _cfg(n_forget=3, anchor={"tau": 0.2, "tol": 0.05})
    for s in select_experiments(labels, cents, cfg, seed=7):
        same = anchor_for_tau(s.to_dict(), cents, 0.2)
        assert same["anchor_identity"] == s.anchor_identity and same["anchor_cosine"] == s.anchor_cosine
        far = anchor_for_tau(s.to_dict(), cents, -0.5)  # a far-away target cosine picks a farther anchor
        assert far["tau"] == -0.5 and far["anchor_cosine"] <= same["anchor_cosine"]
        assert far["anchor_identity"] in s.retain_train_identities
