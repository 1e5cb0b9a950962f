"""The generator track's tuning protocol: disjoint tuning identities, declared grids under one budget, pooled scores
and the declared selection rule (idunlearn.tuning)."""

import json

import numpy as np
import pandas as pd
import pytest

from idunlearn.config import ConfigError, run_config, tuned_base, validate_config
from idunlearn.selection import retain_identity_split, select_experiments
from idunlearn.tuning import (choice_record, choose, grid_points, pooled_scores, score_settings,
                              tuned_settings, tuning_markdown, tuning_selections, tuning_settings)
from test_selection import _world

RULE, SUCCESS = {"retain_ratio_min": 0.95}, {"forget_ratio_max": 0.5, "retain_ratio_min": 0.9}


def _config(methods, **tuning):
    return validate_config({
        "unlearning": {"runs": {"piu": {"steps": 200, "n_identities": 2},
                                "siss": {"method": "siss", "optimiser": "siss_scaled", "steps": 60, "lr": 5.0e-6},
                                "uce": {"method": "uce", "regime": "all_cross_attention"}}},
        "tuning": {"methods": methods, **tuning}})


def test_grid_is_the_declared_product_in_order_and_capped():
    assert grid_points({"lr": [1, 2], "eta": [0, 1]}, "k", 12) == [
        {"lr": 1, "eta": 0}, {"lr": 1, "eta": 1}, {"lr": 2, "eta": 0}, {"lr": 2, "eta": 1}]
    with pytest.raises(ConfigError, match="'tuning.methods.piu.grid': 13 settings"):
        tuning_settings(_config({"piu": {"grid": {"lr": list(np.linspace(1e-5, 1e-3, 13))}}}))


def test_every_training_method_gets_the_same_budget_and_uce_none():
    settings = tuning_settings(_config({"piu": {"grid": {"lr": [1e-4, 3e-4]}}, "siss": {"grid": {"siss_beta": [0.1]}},
                                        "uce": {"grid": {"uce_lambda": [0.7]}}}))
    assert list(settings) == ["piu.tune.lr_0.0001", "piu.tune.lr_0.0003", "siss.tune.siss_beta_0.1",
                              "uce.tune.uce_lambda_0.7"]
    for name in ("piu.tune.lr_0.0003", "siss.tune.siss_beta_0.1"):
        run = settings[name]["run"]
        assert (run["steps"], run["forget_batch"], run["retain_batch"]) == (100, 8, 8)
    assert settings["piu.tune.lr_0.0003"]["run"]["lr"] == 3e-4
    assert settings["siss.tune.siss_beta_0.1"]["run"]["lr"] == 5e-6  # the paper-setting run's other settings stay
    assert "steps" not in settings["uce.tune.uce_lambda_0.7"]["run"]  # closed form: no steps, no budget


def test_a_setting_over_the_budget_or_an_unknown_knob_or_run_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"'tuning.methods.piu.grid'.*over the budget"):
        tuning_settings(_config({"piu": {"grid": {"steps": [50, 200]}}}))
    with pytest.raises(ConfigError, match=r"'tuning.methods.piu.grid': unknown setting\(s\) \['learning_rate'\]"):
        tuning_settings(_config({"piu": {"grid": {"learning_rate": [1e-4]}}}))
    with pytest.raises(ConfigError, match="'tuning.methods.wid'"):
        _config({"wid": {"grid": {"lr": [1e-4]}}}, study=True)
    with pytest.raises(ConfigError, match="'tuning.methods.wid'"):
        tuning_settings(_config({"wid": {"grid": {"lr": [1e-4]}}}))


def test_tuning_identities_are_disjoint_from_everything_the_study_evaluates():
    labels, centroids = _world()
    selection_cfg = validate_config({"selection": {"n_forget": 6}})["selection"]
    tuning_cfg = validate_config({})["tuning"]
    study = select_experiments(labels, centroids, selection_cfg, 42)
    study_forget = [s.forget_identity for s in study]
    tuning = tuning_selections(labels, centroids, study_forget, selection_cfg, tuning_cfg, 42)
    forget = {s.forget_identity for s in tuning}
    (retain_val,) = {tuple(s.retain_val_identities) for s in tuning}
    assert len(forget) == tuning_cfg["n_identities"] and len(retain_val) == tuning_cfg["retain_val_identities"]
    assert not forget & set(study_forget)
    assert not set(retain_val) & (set(study_forget) | forget | set(study[0].retain_val_identities))
    for s in tuning:
        assert s.forget_identity not in s.retain_train_identities
        assert not set(s.retain_train_identities) & set(retain_val)
        assert s.anchor_identity in s.retain_train_identities and s.seed == tuning_cfg["seed"]
    again = tuning_selections(labels, centroids, study_forget, selection_cfg, tuning_cfg, 42)
    assert [s.to_dict() for s in again] == [s.to_dict() for s in tuning]
    other = tuning_selections(labels, centroids, study_forget, selection_cfg, {**tuning_cfg, "seed": 8}, 42)
    assert [s.forget_identity for s in other] != [s.forget_identity for s in tuning]
    with pytest.raises(ConfigError, match="'tuning.n_identities'"):
        tuning_selections(labels, centroids, study_forget, selection_cfg, {**tuning_cfg, "n_identities": 30}, 42)


def test_the_study_selection_is_unchanged_by_the_shared_experiment_builder():
    labels, centroids = _world()
    cfg = validate_config({"selection": {"n_forget": 3}})["selection"]
    retain_train, retain_val = retain_identity_split(centroids["identity"].to_numpy(), cfg["retain_train_fraction"], 42)
    for s in select_experiments(labels, centroids, cfg, 42):
        assert s.retain_train_identities == [int(i) for i in retain_train if i != s.forget_identity]
        assert s.retain_val_identities == retain_val.tolist()
        assert len(s.forget_train_images) == 6 and len(s.forget_val_images) == 4


def _samples(forget_cos, retain_cos, forget_hits, retain_hits, identity):
    """A per-sample table: forget samples target identity 1, retain samples identity 2."""
    rows = [("forget", c, 1, 1 if h else 9) for c, h in zip(forget_cos, forget_hits)]
    rows += [("retain", c, 2, 2 if h else 9) for c, h in zip(retain_cos, retain_hits)]
    frame = pd.DataFrame(rows, columns=["kind", "own_cosine", "target_identity", "predicted_identity"])
    return frame.assign(forget_identity=identity)


def test_pooled_scores_pool_samples_not_identity_means():
    # identity 1: 1 forget sample, identity 2: 3 forget samples: the pooled mean differs from the mean of means
    samples = pd.concat([_samples([0.8], [0.6, 0.6], [True], [True, False], 1),
                         _samples([0.2, 0.2, 0.2], [0.4, 0.4], [False, False, True], [True, True], 2)])
    scores = pooled_scores(samples)
    assert scores["ism_forget"] == pytest.approx((0.8 + 3 * 0.2) / 4)  # not (0.8 + 0.2) / 2
    assert scores["ism_retain"] == pytest.approx(0.5)
    # PIU eqs. 8-10 on pooled counts: Acc_U = 2/4, Acc_R = 3/4, SRK = Acc_R / (Acc_U + 0.01)
    assert scores["srk"] == pytest.approx(0.75 / 0.51)


def _scores(rows):
    """Synthetic tuning scores: (method, setting, steps, forget ratio, retain ratio) with before ISMs 0.6 / 0.7."""
    return pd.DataFrame([{"method": m, "setting": s, "point": json.dumps({"i": k}), "steps": steps,
                          "ism_forget": 0.6 * f, "ism_retain": 0.7 * r, "srk": 1.0, "forget_ratio": f,
                          "retain_ratio": r} for k, (m, s, steps, f, r) in enumerate(rows)])


def test_the_rule_takes_the_lowest_forget_ism_among_settings_that_keep_retain():
    rows = [("siss", "a", 100, 0.9, 1.0), ("siss", "b", 100, 0.3, 0.94), ("siss", "c", 100, 0.5, 0.96)]
    table, choices = choose(_scores(rows), RULE, SUCCESS)
    assert choices["siss"]["setting"] == "c" and choices["siss"]["qualified"]
    assert table["chosen"].tolist() == [False, False, True]
    assert table["eligible"].tolist() == [True, False, True] and table["forgets"].tolist() == [False, True, True]
    # the same grid under a looser declared rule: the stronger forgetter b qualifies and wins
    _, looser = choose(_scores(rows), {"retain_ratio_min": 0.9}, SUCCESS)
    assert looser["siss"]["setting"] == "b"


def test_ties_go_to_fewer_steps_and_a_grid_that_fails_says_so():
    rows = [("piu", "long", 100, 0.4, 1.0), ("piu", "short", 50, 0.4, 1.0),
            ("wid", "x", 100, 0.2, 0.5), ("wid", "y", 100, 0.9, 0.8)]
    table, choices = choose(_scores(rows), RULE, SUCCESS)
    assert choices["piu"]["setting"] == "short"
    assert choices["wid"]["setting"] == "y" and not choices["wid"]["qualified"] and not choices["wid"]["any_forgets"]
    assert "no setting keeps retain ISM" in choices["wid"]["reason"]
    text = tuning_markdown(table, choices, RULE, SUCCESS, [3, 5])
    assert "## wid" in text and "Chosen: `y`" in text and "3, 5" in text


def test_scores_of_settings_are_ratios_to_the_original_on_the_same_identities():
    before = pd.concat([_samples([0.8, 0.6], [0.7, 0.7], [True, True], [True, True], i) for i in (1, 2)])
    after = pd.concat([_samples([0.2, 0.2], [0.7, 0.63], [False, False], [True, True], i) for i in (1, 2)])
    settings = {"piu.tune.lr_1": {"base": "piu", "point": {"lr": 1}, "run": {"method": "piu", "steps": 100}}}
    (row,) = score_settings(before, {"piu.tune.lr_1": after}, settings).to_dict("records")
    assert row["forget_ratio"] == pytest.approx(0.2 / 0.7) and row["retain_ratio"] == pytest.approx(0.665 / 0.7)
    assert row["n_identities"] == 2 and row["steps"] == 100


def test_tuned_runs_exist_beside_the_paper_runs_and_take_the_chosen_settings():
    config = _config({"piu": {"grid": {"lr": [1e-4, 3e-4]}}}, study=True)
    assert run_config(config, "piu.tuned") == run_config(config, "piu")
    assert tuned_base("piu.tuned") == "piu" and tuned_base("piu") is None
    settings = tuning_settings(config)
    choices = {"piu": {"setting": "piu.tune.lr_0.0003", "point": {"lr": 3e-4}, "reason": "r", "qualified": True,
                       "any_forgets": True}}
    record = json.loads(json.dumps(choice_record(choices, settings, RULE, [4])))
    tuned = tuned_settings(record, "piu.tuned")
    assert tuned["lr"] == 3e-4 and tuned["steps"] == 100
    with pytest.raises(ConfigError, match="no method 'siss'"):
        tuned_settings(record, "siss.tuned")
