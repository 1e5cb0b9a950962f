"""Forgetting many people: joint forget batches (every identity, each with its own anchor), the retain sets of joint
and sequential jobs, and the pooled table of a job."""

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from idunlearn.conditions import dirichlet_mixtures
from idunlearn.config import ConfigError
from idunlearn.experiment import unlearning_data
from idunlearn.many import chosen_identities, forget_order, job_selections, job_table
from idunlearn.models.mini import build_mini_generator
from idunlearn.selection import select_experiments
from idunlearn.unlearning import build_method
from idunlearn.unlearning.base import UnlearningData
from idunlearn.unlearning.conditions import forget_conditions, group_counts
from idunlearn.unlearning.runner import unlearn

from test_piu import RUN
from test_selection import _cfg, _world
from tiny_world import TINY, tiny_data, unit


def joint_data(dim: int = 16) -> UnlearningData:
    """Two forget identities (3 and 2 forget-train rows, in disjoint coordinate blocks) with their own anchors."""
    data = tiny_data(dim)
    rng = np.random.default_rng(7)
    first, second = np.abs(rng.standard_normal((3, dim))), np.abs(rng.standard_normal((2, dim)))
    first[:, 8:], second[:, :8] = 0, 0
    data.forget_train = unit(np.concatenate([first, second]))
    data.forget_groups = np.array([0, 0, 0, 1, 1])
    data.anchor_centroids = unit(rng.standard_normal((2, dim)))
    data.anchor_centroid = data.anchor_centroids[0]
    return data


def test_group_counts_share_the_batch_and_one_group_draws_nothing():
    rng = np.random.default_rng(0)
    state = copy.deepcopy(rng.bit_generator.state)
    assert group_counts(5, 1, rng).tolist() == [5] and rng.bit_generator.state == state
    assert group_counts(8, 4, rng).tolist() == [2, 2, 2, 2] and rng.bit_generator.state == state
    counts = [group_counts(2, 8, rng) for _ in range(200)]
    assert all(sorted(c.tolist()) == [0] * 6 + [1] * 2 for c in counts)
    assert np.all(np.sum(counts, axis=0) > 0)  # every identity gets its turn


def test_joint_forget_conditions_mix_within_each_identity_and_carry_its_anchor():
    data = joint_data()
    conditions, anchors = forget_conditions(data, 6, np.random.default_rng(1), 3, 1.0)
    assert conditions.shape == anchors.shape == (6, 16)
    # the first three mix identity 0's rows (its coordinate block only), the last three identity 1's
    assert np.allclose(conditions[:3, 8:], 0) and np.allclose(conditions[3:, :8], 0)
    assert np.array_equal(anchors[:3], np.repeat(data.anchor_centroids[:1], 3, 0))
    assert np.array_equal(anchors[3:], np.repeat(data.anchor_centroids[1:], 3, 0))
    # one identity: exactly the single-identity draw
    single = tiny_data()
    conditions, anchors = forget_conditions(single, 4, np.random.default_rng(2), 3, 1.0)
    assert np.array_equal(conditions, dirichlet_mixtures(single.forget_train, 4, np.random.default_rng(2), 3, 1.0))
    assert np.array_equal(anchors, np.repeat(single.anchor_centroid[None], 4, 0))


def test_joint_piu_steers_each_identitys_conditions_to_its_own_anchor():
    torch.manual_seed(0)
    gen = build_mini_generator(TINY)
    teacher = copy.deepcopy(gen.unet)
    data, run = joint_data(), {**RUN, "forget_batch": 4}
    obj = build_method("piu", run).objectives(gen, teacher, data, np.random.default_rng(3),
                                              torch.Generator().manual_seed(3))
    # replay: two conditions of each identity (PIU Section 3.4 mixtures), targets from each one's anchor (eq. 1)
    rng, tgen = np.random.default_rng(3), torch.Generator().manual_seed(3)
    with torch.no_grad():
        forget = np.concatenate([dirichlet_mixtures(data.forget_train[:3], 2, rng),
                                 dirichlet_mixtures(data.forget_train[3:], 2, rng)])
        c_f = gen.conditions(torch.from_numpy(forget))
        c_a = gen.conditions(torch.from_numpy(np.repeat(data.anchor_centroids, 2, axis=0)))
        x0, noise = torch.randn((4, 1, 8, 8), generator=tgen), torch.randn((4, 1, 8, 8), generator=tgen)
        t = torch.randint(1000, (4,), generator=tgen)
        x_t = gen.training_scheduler().add_noise(x0, noise, t)
        target = teacher(x_t, t, c_a).sample - (teacher(x_t, t, c_f).sample - teacher(x_t, t, c_a).sample)
        expected = ((gen.unet(x_t, t, c_f).sample - target) ** 2).mean()
    assert obj.forget.item() == pytest.approx(expected.item(), rel=1e-4)


def test_a_single_identity_method_refuses_joint_data(tmp_path):
    gen = build_mini_generator(TINY)
    run = {**RUN, "method": "wid", "eta": 0.0, "wid_lambda": 0.1}
    with pytest.raises(ValueError, match="'wid' unlearns one identity per run.*many.joint_sizes"):
        unlearn(gen, build_method("wid", run), joint_data(), run, tmp_path / "s.pt", seed=0)


def _faces(labels: pd.DataFrame, dim: int = 16) -> pd.DataFrame:
    rng = np.random.default_rng(5)
    return pd.DataFrame({"image_id": labels["image_id"], "status": "ok",
                         "embedding": list(unit(rng.standard_normal((len(labels), dim))))})


def test_joint_and_sequential_retain_sets_leave_out_the_forgotten_identities():
    labels, centroids = _world()
    cfg = _cfg(n_forget=1)
    order = forget_order(centroids, cfg, seed=3)
    ids = order[:4]
    joint = job_selections(labels, centroids, ids, "joint", cfg, seed=3)
    assert [s["forget_identity"] for s in joint] == ids
    for s in joint:  # no forgotten identity is retained or an anchor
        assert not set(ids) & set(s["retain_train_identities"]) and s["anchor_identity"] not in ids
        assert s["retain_train_identities"] == joint[0]["retain_train_identities"]
    chain = job_selections(labels, centroids, ids, "sequential", cfg, seed=3)
    for step, s in enumerate(chain, start=1):  # step i leaves out identities 1..i, keeps the later ones
        assert not set(ids[:step]) & set(s["retain_train_identities"])
        assert set(ids[step:]) <= set(s["retain_train_identities"])
    # a step's selection depends on identities 1..i only: the chain with another 4th identity agrees on steps 1-3
    assert job_selections(labels, centroids, [*ids[:3], order[5]], "sequential", cfg, seed=3)[:3] == chain[:3]
    # one identity, either way, is the selection stage's experiment of that identity
    single = select_experiments(labels, centroids, cfg, seed=3)[0].to_dict()
    assert job_selections(labels, centroids, ids[:1], "joint", cfg, seed=3) == [single] == chain[:1]


def test_joint_unlearning_data_has_one_group_per_identity_and_one_is_the_single_experiment():
    labels, centroids = _world()
    cfg, faces = _cfg(n_forget=1), _faces(labels)
    ids = forget_order(centroids, cfg, seed=3)[:3]
    selections = job_selections(labels, centroids, ids, "joint", cfg, seed=3)
    data = unlearning_data(selections, faces, labels, centroids)
    sizes = [len(s["forget_train_images"]) for s in selections]
    assert data.forget_groups.tolist() == [g for g, n in enumerate(sizes) for _ in range(n)]
    anchors = centroids.set_index("identity").loc[[s["anchor_identity"] for s in selections], "centroid"]
    np.testing.assert_array_equal(data.anchor_centroids, np.stack(anchors.to_numpy()).astype(np.float32))
    assert len(data.retain_centroids) == len(selections[0]["retain_train_identities"]) - len(set(anchors.index))
    one = unlearning_data(selections[:1], faces, labels, centroids)
    alone = unlearning_data(selections[0], faces, labels, centroids)
    assert one.forget_groups is None and alone.forget_groups is None
    for field in ("forget_train", "retain_train", "anchor_centroid", "retain_centroids"):
        np.testing.assert_array_equal(getattr(one, field), getattr(alone, field))


def test_chosen_identities_take_the_order_or_a_checked_list():
    order = [7, 3, 9, 1, 4]
    cfg = {"identities": None, "joint_sizes": [1, 2], "sequential_length": 3}
    assert chosen_identities(cfg, order) == [7, 3, 9]
    assert chosen_identities({**cfg, "identities": [4, 1, 3, 9]}, order) == [4, 1, 3]
    with pytest.raises(ConfigError, match="'many.identities': \\[8\\] are not eligible"):
        chosen_identities({**cfg, "identities": [4, 1, 8]}, order)
    with pytest.raises(ConfigError, match="3 distinct identities needed"):
        chosen_identities({**cfg, "identities": [4, 4, 1]}, order)
    with pytest.raises(ConfigError, match="6 identities needed"):
        chosen_identities({**cfg, "sequential_length": 6}, order)


def _samples(identity: int, forget_hits: int, retain_hits: int, cosine: float) -> pd.DataFrame:
    """Four forget and four retain samples of one identity's evaluation, all detected."""
    rows = [{"kind": "forget", "target_identity": identity, "predicted_identity": identity if k < forget_hits else -1,
             "own_cosine": cosine} for k in range(4)]
    rows += [{"kind": "retain", "target_identity": 100 + k, "predicted_identity": 100 + k if k < retain_hits else -1,
              "own_cosine": 0.5} for k in range(4)]
    return pd.DataFrame(rows).assign(detected=True, forget_identity=identity)


def test_job_table_pools_counts_over_identities_before_one_srk():
    after = pd.concat([_samples(1, 0, 4, 0.1), _samples(2, 1, 2, 0.7)], ignore_index=True)
    before = pd.concat([_samples(1, 4, 4, 0.8), _samples(2, 4, 4, 0.8)], ignore_index=True)
    timings = [{"seconds_this_session": 2.0, "steps": 5}, {"seconds_this_session": 3.0, "steps": 5}]
    table = job_table("sequential", 2, [2, 1], after, before, timings, tau=0.5)
    assert table["identity"].tolist() == [2, 1] and table["forgotten_at"].tolist() == [1, 2]
    assert table["ism_forget"].tolist() == pytest.approx([0.7, 0.1])
    # FA: verified = detected, cosine >= tau and nearest identity right: identity 2's one hit at 0.7, none for 1
    assert table["fa_forget"].tolist() == [0.25, 0.0] and table["fa_forget_before"].tolist() == [1.0, 1.0]
    # PIU eqs. 8-10 on pooled counts: Acc_U = 1/8, Acc_R = 6/8, SRK = 0.75 / (0.125 + 0.01)
    assert table.loc[0, "srk_pooled"] == pytest.approx(0.75 / 0.135)
    assert table.loc[0, "srk_pooled_before"] == pytest.approx(1.0 / 1.01)
    # cost: this step's, and the chain's up to it
    assert table[["seconds", "seconds_total", "steps", "steps_total"]].drop_duplicates().values.tolist() == [
        [3.0, 5.0, 5, 10]]
