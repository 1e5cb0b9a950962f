"""Recognizer tuning protocol: grids, epoch budget, disjoint tuning requests and the declared selection rule against
hand-made grids."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from idunlearn.config import ConfigError, validate_config
from idunlearn.recognizer import tuning


def test_passes_sum_the_epoch_knobs_but_not_scrubs_max_epochs():
    assert tuning.passes({"sgo_epochs": 4, "co_epochs": 1, "sgo_lr": 0.1}) == 5
    assert tuning.passes({"epochs": 3, "max_epochs": 3}) == 3
    assert tuning.passes({"damping": 0.1}) == 0


def test_grid_settings_product_and_errors_name_the_key():
    base = {"epochs": 1, "lr": 0.1, "batch_size": 8}
    grid = tuning.grid_settings(base, {"epochs": [1, 2], "lr": [0.1, 0.2]}, "k", budget=2)
    assert [(s["epochs"], s["lr"]) for s in grid] == [(1, 0.1), (1, 0.2), (2, 0.1), (2, 0.2)]
    assert all(s["batch_size"] == 8 for s in grid)
    with pytest.raises(ConfigError, match="'k'.*unknown knob"):
        tuning.grid_settings(base, {"epoch": [1]}, "k", budget=2)
    with pytest.raises(ConfigError, match="'k.lr'.*1.0e-05"):
        tuning.grid_settings(base, {"lr": ["1e-05"]}, "k", budget=2)
    with pytest.raises(ConfigError, match="'k.epochs'"):
        tuning.grid_settings(base, {"epochs": [1.5]}, "k", budget=2)
    with pytest.raises(ConfigError, match="13 settings"):
        tuning.grid_settings(base, {"lr": [0.1 * i for i in range(1, 14)]}, "k", budget=2)
    with pytest.raises(ConfigError, match="epoch budget of 2"):
        tuning.grid_settings(base, {"epochs": [1, 3]}, "k", budget=2)


def test_default_protocol_is_valid_and_treats_every_method_alike():
    rcfg = validate_config({})["recognizer"]
    tuning.check(rcfg, {"random_subset": ["orl", "fashion_mnist"], "classwise": ["orl"]})
    for task in ("random_subset", "classwise"):
        methods = tuning.tuned_methods(rcfg, task)
        assert "gsuo" in methods and "retrain" not in methods and "original" not in methods
        assert set(methods) <= set(rcfg["tuning"]["grids"][task])
    assert "unsir" not in tuning.tuned_methods(rcfg, "random_subset")
    # a grids.<task> map replaces the default one: every method run must be in it
    missing = validate_config({"recognizer": {"tuning": {"grids": {"classwise": {"gsuo": {}}}}}})["recognizer"]
    with pytest.raises(ConfigError, match="recognizer.tuning.grids.classwise.ft' is missing"):
        tuning.check(missing, {"classwise": ["orl"]})
    with pytest.raises(ConfigError, match="empty grid"):
        tuning.method_grid(missing, "classwise", "gsuo", rcfg["methods"]["classwise"]["gsuo"])


def test_tuning_requests_are_disjoint_from_the_evaluation():
    shared = validate_config({"recognizer": {"tuning": {"random_subset": {"seeds": [2, 100]}}}})["recognizer"]
    with pytest.raises(ConfigError, match="recognizer.tuning.random_subset.seeds"):
        tuning.check_seeds(shared)
    drawn = tuning.tuning_identities(range(10), [2, 7], 3, seed=42)
    assert drawn == tuning.tuning_identities(range(10), [7, 2], 3, seed=42)
    assert len(set(drawn)) == 3 and not set(drawn) & {2, 7} and drawn == sorted(drawn)
    with pytest.raises(ConfigError, match="n_identities"):
        tuning.tuning_identities(range(4), [2, 7], 4, seed=42)


def _grid(**columns) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    base = {"setting_index": list(range(n)), "acc_retain": [1.0] * n, "acc_test": [0.9] * n, "diff": [0.05] * n,
            "passes": [5] * n}
    return pd.DataFrame({**base, **columns})


def test_selection_rule_by_hand():
    rule, original = {"utility_floor": 0.95, "tie_tolerance": 0.0}, {"acc_retain": 1.0, "acc_test": 0.9}
    # setting 0: best |Diff| but test accuracy 0.8 < 0.95 x 0.9 -> not admissible; 1 and 2 tie, 2 needs fewer passes
    grid = _grid(acc_test=[0.8, 0.9, 0.88, 0.9], diff=[0.0, 0.02, 0.02, 0.03], passes=[5, 10, 2, 1])
    index, reason, table = tuning.select(grid, original, "random_subset", rule)
    assert index == 2 and "2 tied" in reason
    assert table["admissible"].tolist() == [False, True, True, True]
    assert table["utility_ratio"].tolist() == pytest.approx([0.8 / 0.9, 1.0, 0.88 / 0.9, 1.0])
    # a tolerance of 0.01 also ties setting 3, which needs the fewest passes
    index, _, _ = tuning.select(grid, original, "random_subset", {**rule, "tie_tolerance": 0.01})
    assert index == 3
    # nothing admissible: the highest worst utility ratio
    low = _grid(acc_test=[0.5, 0.6], diff=[0.0, 0.3])
    index, reason, _ = tuning.select(low, original, "random_subset", rule)
    assert index == 1 and "no setting kept" in reason


def test_classwise_quality_is_the_mean_of_both_forget_accuracies():
    grid = _grid(acc_retain_test=[0.9, 0.9], acc_forget=[0.0, 0.2], acc_forget_test=[0.5, 0.0])
    original = {"acc_retain": 1.0, "acc_retain_test": 0.9}
    index, _, table = tuning.select(grid, original, "classwise", {"utility_floor": 0.95, "tie_tolerance": 0.0})
    assert table["forget_quality"].tolist() == pytest.approx([0.25, 0.1]) and index == 1


def test_choose_all_and_chosen_settings():
    rows = pd.DataFrame({"task": "random_subset", "dataset": "orl", "method": "ft",
                         "experiment": ["seed100", "seed101"] * 2,
                         "setting_index": [0, 0, 1, 1], "acc_retain": 1.0, "acc_retain_test": float("nan"),
                         "acc_forget": 1.0, "acc_forget_test": float("nan"), "acc_test": 0.9,
                         "diff": [0.1, 0.3, 0.1, 0.1], "f_acc": 0.8, "mia_auc": 0.5, "mia_auc_loss": 0.5, "time_s": 1.0,
                         "settings": [json.dumps({"epochs": 1})] * 2 + [json.dumps({"epochs": 2})] * 2,
                         "passes": [1, 1, 2, 2]})
    requests = pd.DataFrame({"task": "random_subset", "dataset": "orl", "original_acc_retain": [1.0, 1.0],
                             "original_acc_test": [0.9, 0.9]})
    grid, choice = tuning.choose_all(rows, requests, {"utility_floor": 0.95, "tie_tolerance": 0.0})
    # means over the two requests: |Diff| 0.2 (setting 0) and 0.1 (setting 1)
    assert grid["diff"].tolist() == pytest.approx([0.2, 0.1]) and grid["chosen"].tolist() == [False, True]
    assert choice["setting_index"].item() == 1 and choice["grid_size"].item() == 2
    assert tuning.chosen_settings(choice) == {"random_subset": {"orl": {"ft": {"epochs": 2}}}}
