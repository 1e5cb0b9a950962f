"""Forgetting many people: joint forget batches (every identity, each with its own anchor) and their budget, the
retain sets of joint, sequential and replaying jobs, identity orders, merging single runs, the pooled table of a job
and the strategies' intervals and paired comparisons over orders."""

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from idunlearn.conditions import dirichlet_mixtures
from idunlearn.config import ConfigError
from idunlearn.evaluation.statistics import mean_ci
from idunlearn.experiment import unlearn_selection, unlearning_data
from idunlearn.many import (chosen_identities, crossed_bootstrap, forget_order, identity_orders, job_selections,
                            job_table, joint_run, merge_names, merge_sizes, order_summary, replay_selections,
                            step_run, strategy_comparisons, strategy_table)
from idunlearn.models.export import merge_changes, merge_regmean
from idunlearn.models.mini import build_mini_generator
from idunlearn.selection import select_experiments
from idunlearn.unlearning import build_method
from idunlearn.unlearning.base import UnlearningData
from idunlearn.unlearning.conditions import forget_conditions, group_counts
from idunlearn.unlearning.runner import unlearn

from test_piu import RUN
from test_selection import _cfg, _world
from tiny_world import TINY, tiny_data, tiny_generator, unit


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
    after.loc[after.index[-1], "detected"] = False  # identity 2's last retain sample shows no face
    before = pd.concat([_samples(1, 4, 4, 0.8), _samples(2, 4, 4, 0.8)], ignore_index=True)
    # the second job was resumed: its steps took 4 s in all, 3 s in its last session; the first job's timings have
    # no seconds_total, as a merge's
    timings = [{"seconds_this_session": 2.0, "steps": 5},
               {"seconds_this_session": 3.0, "seconds_total": 4.0, "steps": 5}]
    table = job_table("sequential/none", 0, 2, [2, 1], after, before, timings, tau=0.5)
    assert table["identity"].tolist() == [2, 1] and table["forgotten_at"].tolist() == [1, 2]
    assert table[["strategy", "order", "size"]].drop_duplicates().values.tolist() == [["sequential/none", 0, 2]]
    assert table["ism_forget"].tolist() == pytest.approx([0.7, 0.1])
    # FA: verified = detected, cosine >= tau and nearest identity right: identity 2's one hit at 0.7, none for 1
    assert table["fa_forget"].tolist() == [0.25, 0.0] and table["fa_forget_before"].tolist() == [1.0, 1.0]
    # PIU eqs. 8-10 on pooled counts: Acc_U = 1/8, Acc_R = 6/8, SRK = 0.75 / (0.125 + 0.01)
    assert table.loc[0, "srk_pooled"] == pytest.approx(0.75 / 0.135)
    assert table.loc[0, "srk_pooled_before"] == pytest.approx(1.0 / 1.01)
    # retain faces detected: 7 of identity 1's and 2's 8 retain samples after, all 8 before
    assert table.loc[0, "detection_rate_retain"] == 0.875 and table.loc[0, "detection_rate_retain_before"] == 1.0
    # cost: this step's, and the chain's up to it
    assert table[["seconds", "seconds_total", "steps", "steps_total"]].drop_duplicates().values.tolist() == [
        [4.0, 6.0, 5, 10]]


def test_group_weights_give_the_new_identity_its_batch_and_share_the_replay_among_the_earlier_ones():
    rng = np.random.default_rng(0)
    # step 4 of a replay chain: forget batch 8 for the new identity, replay batch 6 among the 3 earlier ones
    assert group_counts(14, 4, rng, np.array([2.0, 2.0, 2.0, 8.0])).tolist() == [2, 2, 2, 8]
    counts = [group_counts(15, 4, rng, np.array([7 / 3] * 3 + [8.0])) for _ in range(200)]
    assert all(c[3] == 8 and c.sum() == 15 and sorted(c[:3].tolist()) == [2, 2, 3] for c in counts)
    assert np.all(np.sum(counts, axis=0)[:3] > 0)  # the leftover row goes to each earlier identity in turn
    with pytest.raises(ValueError, match="need 2 non-negative weights"):
        group_counts(4, 2, rng, np.array([1.0, -1.0]))


def test_joint_budget_grows_with_n_and_n_1_is_the_single_run():
    run = {**RUN, "steps": 200, "forget_batch": 8}
    grown = joint_run(run, 8, {"forget_batch": "per_identity", "steps": "shared"})
    assert (grown["forget_batch"], grown["steps"]) == (64, 200) and joint_run(run, 8, {"steps": "per_identity"})[
        "steps"] == 1600
    assert joint_run(run, 1, {"forget_batch": "per_identity", "steps": "per_identity"}) == run
    assert joint_run({"method": "uce"}, 4, {"forget_batch": "per_identity"}) == {"method": "uce"}  # closed form


def test_step_settings_per_protection():
    run = {**RUN, "forget_batch": 8}
    assert step_run(run, "none", 5, 8) == (run, None) and step_run(run, "replay", 1, 8) == (run, None)
    replay, weights = step_run(run, "replay", 5, 8)
    assert replay == {**run, "forget_batch": 16} and weights.tolist() == [2.0, 2.0, 2.0, 2.0, 8.0]
    eupmu, _ = step_run(run, "replay_eupmu", 3, 8)
    assert eupmu["optimiser"] == "eupmu" and eupmu["forget_batch"] == 16
    with pytest.raises(ConfigError, match="'consolidate' is unknown"):
        step_run(run, "consolidate", 2, 8)


def test_merge_sizes_default_to_the_joint_sizes_and_cannot_exceed_an_order():
    cfg = {"identities": None, "joint_sizes": [8, 1, 2], "sequential_length": 8, "merge_sizes": None}
    assert merge_sizes(cfg) == [2, 8]
    assert merge_sizes({**cfg, "merge_sizes": [8, 4]}) == [4, 8]
    with pytest.raises(ConfigError, match="'many.merge_sizes': N = 9 exceeds the 8 identities"):
        merge_sizes({**cfg, "merge_sizes": [9]})


def test_identity_orders_are_seeded_draws_after_the_chosen_one():
    order = list(range(100, 130))
    cfg = {"identities": None, "joint_sizes": [1, 8], "sequential_length": 8, "orders": 3}
    orders = identity_orders(cfg, order, seed=3)
    assert len(orders) == 3 and orders[0] == order[:8]
    assert all(len(set(o)) == 8 and set(o) <= set(order) for o in orders) and orders[1] != orders[2]
    assert identity_orders(cfg, order, seed=3) == orders  # seeded
    assert identity_orders({**cfg, "orders": 4}, order, seed=3)[:3] == orders  # one more order keeps the others
    assert identity_orders(cfg, order, seed=4)[1:] != orders[1:]


def test_replay_steps_share_step_is_retain_set_and_steer_no_identity_toward_a_forgotten_one():
    labels, centroids = _world()
    cfg = _cfg(n_forget=1, anchor={"tau": 0.0, "tol": 0.05})  # on this world, one step's anchor is a later identity
    ids = forget_order(centroids, cfg, seed=3)[:6]
    chain = job_selections(labels, centroids, ids, "sequential", cfg, seed=3)
    replay = replay_selections(labels, centroids, ids, cfg, seed=3)
    assert [s["forget_identity"] for s in replay] == ids
    for s, own in zip(replay, chain):
        assert s["retain_train_identities"] == chain[-1]["retain_train_identities"]
        assert s["anchor_identity"] not in ids and s["anchor_identity"] in s["retain_train_identities"]
        if own["anchor_identity"] not in ids:  # an anchor still retained is kept
            assert s["anchor_identity"] == own["anchor_identity"]
    assert any(own["anchor_identity"] in ids for own in chain)  # the re-draw was exercised
    assert replay[-1] == chain[-1]  # the step's own identity as its step drew it


def _two_identity_world():
    labels, centroids = _world()
    cfg, faces = _cfg(n_forget=1), _faces(labels)
    return labels, centroids, faces, cfg, forget_order(centroids, cfg, seed=3)


def test_joint_n_1_is_the_single_run_bit_for_bit(tmp_path):
    """The workflow takes the single job as joint N = 1 and as step 1 of every chain: the joint code path at N = 1
    (joint selection of one identity, budget grown by N = 1, a list of one selection, no weights, own teacher) must
    give the single run's weights exactly, not approximately (same batches, same float operations)."""
    labels, centroids, faces, cfg, order = _two_identity_world()
    run = joint_run({**RUN, "forget_batch": 2}, 1, {"forget_batch": "per_identity", "steps": "per_identity"})
    single = select_experiments(labels, centroids, cfg, seed=3)[0].to_dict()
    joint = job_selections(labels, centroids, order[:1], "joint", cfg, seed=3)
    models = []
    for name, selection in (("single", single), ("joint", joint)):
        gen = tiny_generator()
        unlearn_selection(gen, run, selection, faces, labels, centroids, None, {}, None, tmp_path / f"{name}.pt",
                          seed=3 + order[0])
        models.append(gen.unet.state_dict())
    changed = [n for n, p in tiny_generator().unet.named_parameters() if not torch.equal(p, models[0][n])]
    assert changed  # the run did change weights
    for name in models[0]:
        assert torch.equal(models[0][name], models[1][name]), name


def _changed(unet, names, seed):
    gen = torch.Generator().manual_seed(seed)
    return {n: p.detach() + 0.01 * torch.randn(p.shape, generator=gen) for n, p in unet.named_parameters()
            if n in names}


def test_merging_one_run_gives_that_run_and_merging_two_sums_their_changes():
    unet = tiny_generator().unet
    names = [n for n, _ in unet.named_parameters() if ".attn2." in n]
    base = {n: p.detach().clone() for n, p in unet.named_parameters() if n in names}
    one, two = _changed(unet, names, 1), _changed(unet, names, 2)
    merged = merge_changes(base, [one])
    assert all(torch.equal(merged[n], one[n]) for n in names)  # bit for bit, not within rounding
    both = merge_changes(base, [one, two])
    for n in names:
        torch.testing.assert_close(both[n], one[n] + two[n] - base[n], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="other parameters than run 0"):
        merge_changes(base, [one, {k: v for k, v in two.items() if k != names[0]}])


def test_regmean_merge_fits_each_runs_projection_on_its_own_conditions():
    gen = tiny_generator()
    names = [n for n, _ in gen.unet.named_parameters() if ".attn2." in n]
    base = {n: p.detach().clone() for n, p in gen.unet.named_parameters() if n in names}
    runs = [_changed(gen.unet, names, 1), _changed(gen.unet, names, 2)]
    rng = np.random.default_rng(0)
    with torch.no_grad():
        conditions = [gen.conditions(torch.from_numpy(unit(rng.standard_normal((6, 16))))) for _ in runs]
        preserve = gen.conditions(torch.from_numpy(unit(rng.standard_normal((6, 16)))))
    merged = merge_regmean(base, runs, conditions, preserve, preserve_weight=1.0, lam=1e-4)
    key = next(n for n in names if n.endswith("attn2.to_k.weight"))
    rows = [c.reshape(-1, c.shape[-1]) for c in conditions]
    summed = merge_changes(base, runs)[key]
    for run, c in zip(runs, rows):  # closer to each run's keys on its own conditions than the plain sum is
        assert (c @ merged[key].T - c @ run[key].T).norm() < (c @ summed.T - c @ run[key].T).norm()
    query = next(n for n in names if n.endswith("attn2.to_q.weight"))
    assert torch.equal(merged[query], merge_changes(base, runs)[query])  # not a projection: summed
    far = merge_regmean(base, runs, conditions, preserve, 1.0, lam=1e6)
    torch.testing.assert_close(far[key], base[key], rtol=0, atol=1e-4)  # a strong pull keeps the base
    # keys_values: the same closed-form keys and values, every other parameter left at the base (not in the result)
    only = merge_regmean(base, runs, conditions, preserve, preserve_weight=1.0, lam=1e-4, others="base")
    assert set(only) == {n for n in names if n.endswith(("attn2.to_k.weight", "attn2.to_v.weight"))} and query not in only
    assert all(torch.equal(only[n], merged[n]) for n in only)
    with pytest.raises(ValueError, match="others='mean'"):
        merge_regmean(base, runs, conditions, preserve, 1.0, 1e-4, others="mean")


def test_regmean_solves_the_normal_equations_by_hand():
    # one 2 x 2 key weight, two runs with one condition row each, no preservation: with a tiny ridge the merge must
    # give each run's output on its own row. Rows e1 and e2: G_1 = e1 e1^T, G_2 = e2 e2^T, so
    # W = (W_1 G_1 + W_2 G_2 + lam W_0)(G_1 + G_2 + lam I)^-1 = [W_1 e1, W_2 e2] (columns) as lam -> 0
    name = "down.attn2.to_k.weight"
    base = {name: torch.zeros(2, 2, dtype=torch.float64)}
    runs = [{name: torch.tensor([[1.0, 5.0], [2.0, 6.0]], dtype=torch.float64)},
            {name: torch.tensor([[7.0, 3.0], [8.0, 4.0]], dtype=torch.float64)}]
    conditions = [torch.tensor([[1.0, 0.0]], dtype=torch.float64), torch.tensor([[0.0, 1.0]], dtype=torch.float64)]
    preserve = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    merged = merge_regmean(base, runs, conditions, preserve, preserve_weight=0.0, lam=1e-9)
    torch.testing.assert_close(merged[name], torch.tensor([[1.0, 3.0], [2.0, 4.0]], dtype=torch.float64))
    # with the preservation term (weight 1, rows 1 1, base 0) and lam 0: G = [[2, 1], [1, 2]], right side
    # W_1 G_1 + W_2 G_2 = [[1, 3], [2, 4]], so W = [[1, 3], [2, 4]] [[2, 1], [1, 2]]^-1 = [[-1/3, 5/3], [0, 2]]
    kept = merge_regmean(base, runs, conditions, preserve, preserve_weight=1.0, lam=1e-12)
    torch.testing.assert_close(kept[name], torch.tensor([[-1 / 3, 5 / 3], [0.0, 2.0]], dtype=torch.float64))


def test_the_former_merge_name_is_read_with_a_warning():
    with pytest.warns(FutureWarning, match="'cross_attention' is the former name of the 'regmean' merge"):
        assert merge_names(["sum", "cross_attention", "regmean"]) == ["sum", "regmean"]


def _summary_table() -> pd.DataFrame:
    """Two strategies over three orders of two identities, with known FA, forget ISM and retain ratios."""
    rows = []
    for order, (fa_joint, ratio_joint, ratio_chain) in enumerate([(0.0, 0.96, 0.80), (0.2, 0.97, 0.85),
                                                                 (0.05, 0.99, 0.90)]):
        for strategy, fa, ratio in (("joint", fa_joint, ratio_joint), ("sequential/replay", 0.0, ratio_chain)):
            for identity, ism in ((order * 10 + 1, 0.1), (order * 10 + 2, 0.2)):
                rows.append({"strategy": strategy, "order": order, "size": 2, "identity": identity,
                             "fa_forget": fa if identity % 10 == 1 else 0.0, "ism_forget": ism + fa,
                             "ism_retain": ratio * 0.7, "ism_retain_before": 0.7, "detection_rate_retain": ratio,
                             "srk_pooled": 50.0,
                             "seconds_total": 100.0 * (1 + (strategy == "joint"))})
            rows.append({**rows[-1], "size": 1})  # a smaller size is not summarised
    return pd.DataFrame(rows)


def test_strategy_intervals_over_orders_and_targets():
    table = _summary_table()
    summary = order_summary(table)
    assert len(summary) == 6 and set(summary["size"]) == {2}
    strategies = strategy_table(summary).set_index("strategy")
    joint = strategies.loc["joint"]
    mean, half = mean_ci([0.96, 0.97, 0.99])
    assert joint["retain_ratio"] == pytest.approx(mean) and joint["retain_ratio_high"] == pytest.approx(mean + half)
    assert joint["detection_rate_retain"] == pytest.approx(mean)  # the rows' rate equals their ratio here
    assert joint["fa_max"] == pytest.approx(0.25 / 3) and joint["orders"] == 3
    # the joint target (FA <= 0.1, retain >= 0.95) holds on orders 0 and 2; order 1's FA 0.2 misses it
    assert joint["orders_meeting_joint_target"] == 2 and joint["retain_margin_joint"] == pytest.approx(mean - 0.95)
    chain = strategies.loc["sequential/replay"]
    assert chain["orders_meeting_sequential_target"] == 1 and chain["retain_margin_sequential"] < 0


def test_paired_comparisons_pair_orders_and_identities():
    table = _summary_table()
    comparisons = strategy_comparisons(table, order_summary(table), seed=0).set_index(["unit", "metric"])
    ratio = comparisons.loc[("order", "retain_ratio")]
    assert (ratio["a"], ratio["b"], ratio["n"]) == ("joint", "sequential/replay", 3)
    assert ratio["mean_diff"] == pytest.approx(np.mean([0.80 - 0.96, 0.85 - 0.97, 0.90 - 0.99]))
    fa = comparisons.loc[("order x identity", "fa_forget")]
    assert fa["n"] == 6 and fa["mean_diff"] == pytest.approx(-0.25 / 6) and np.isnan(fa["p_wilcoxon"])
    assert comparisons.loc[("order", "fa_mean"), "mean_diff"] == pytest.approx(-0.25 / 6)
    assert comparisons.loc[("order", "seconds_total"), "mean_diff"] == pytest.approx(-100.0)
    assert (fa["orders"], fa["identities"], fa["shared_identities"]) == (3, 6, 0)


def _cells_table(differences: dict[tuple[int, int], float], strategies=("joint", "sequential/replay")) -> pd.DataFrame:
    """A many table at one size whose forget ISM and FA of (order, identity) are 0 under the first strategy and
    ``differences`` plus the strategy's position - 1 under the others; retain and cost alike everywhere."""
    rows = []
    for position, strategy in enumerate(strategies):
        for (order, identity), diff in differences.items():
            value = 0.0 if position == 0 else diff + position - 1
            rows.append({"strategy": strategy, "order": order, "size": 8, "identity": identity, "fa_forget": value,
                         "ism_forget": value, "ism_retain": 0.7, "ism_retain_before": 0.7,
                         "detection_rate_retain": 1.0, "srk_pooled": 50.0, "seconds_total": 100.0})
    return pd.DataFrame(rows)


def test_an_order_is_one_unit_not_eight_identities():
    # 3 orders of 8 identities; the difference is 1 for every identity of order 2, 0 elsewhere. Resampling orders,
    # a replicate holds no order 2 with probability (2/3)^3 = 0.30 (mean 0) and order 2 alone with 1/27 = 0.037
    # (mean 1), both above 2.5%: the interval is [0, 1] exactly. 24 independent pairs would give 1/3 +- 0.20.
    cells = {(order, order * 8 + i): float(order == 2) for order in range(3) for i in range(8)}
    table = _cells_table(cells)
    row = strategy_comparisons(table, order_summary(table), seed=0).set_index(["unit", "metric"]).loc[
        ("order x identity", "ism_forget")]
    assert row["mean_diff"] == pytest.approx(1 / 3)
    assert (row["boot_low"], row["boot_high"]) == (0.0, 1.0)


def test_an_identity_in_several_orders_is_one_unit():
    # 6 orders, each with identity 99 (difference 1) and 3 identities of its own (0); every order's mean is 1/4, so
    # orders alone would give [0.25, 0.25]. Identity 99 is one of 19 identities: a replicate lacks it in every order at
    # once with probability (18/19)^19 = 0.36 > 2.5%, so the interval starts at 0 exactly; were its 6 cells 6
    # identities, a replicate would lack all of them with probability (18/24)^24 = 0.001 only.
    cells = {(order, 99): 1.0 for order in range(6)}
    cells.update({(order, 100 + 3 * order + i): 0.0 for order in range(6) for i in range(3)})
    index = pd.MultiIndex.from_tuples(cells, names=["order", "identity"])
    low, high = crossed_bootstrap(pd.Series(list(cells.values()), index=index), seed=0)
    assert low == 0.0 and high > 0.25
    table = _cells_table(cells)
    row = strategy_comparisons(table, order_summary(table), seed=0).set_index(["unit", "metric"]).loc[
        ("order x identity", "fa_forget")]
    assert (row["orders"], row["identities"], row["shared_identities"]) == (6, 19, 1)


def test_order_level_wilcoxon_and_holm_over_the_strategy_pairs():
    # every cell of strategy b and c above a: per order a difference of the same sign. An exact two-sided Wilcoxon
    # signed-rank test over n orders then gives 2 / 2^n: 0.25 with 3 orders, 0.03125 with 6 (24 or 48 pairs would
    # give far less). Holm (1979) over the 3 strategy pairs of a metric: a - b and a - c at 0.03125 and b - c
    # (differences 1 everywhere) at 0.03125: each x 3 -> 0.09375.
    for n_orders, p in ((3, 0.25), (6, 0.03125)):
        cells = {(order, order * 8 + i): 1.0 + 0.1 * order for order in range(n_orders) for i in range(8)}
        table = _cells_table(cells, strategies=("a", "b", "c"))
        out = strategy_comparisons(table, order_summary(table), seed=0)
        rows = out[(out["unit"] == "order") & (out["metric"] == "ism_forget_mean")].set_index(["a", "b"])
        assert rows["p_wilcoxon"].tolist() == pytest.approx([p] * 3)
        assert rows["p_smallest"].tolist() == pytest.approx([p] * 3)
        assert rows["p_holm"].tolist() == pytest.approx([min(1.0, 3 * p)] * 3)
