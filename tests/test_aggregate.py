import math

import numpy as np
import pandas as pd
import pytest

from idunlearn.evaluation.aggregate import before_after, mean_ci, summarise


def test_mean_ci_matches_hand_computed_t_interval():
    # mean 2.5; sample sd sqrt(5/3) = 1.290994; t_{0.975, 3} = 3.182446; half width 3.182446 * 1.290994 / 2
    mean, half = mean_ci([1, 2, 3, 4])
    assert mean == pytest.approx(2.5)
    assert half == pytest.approx(3.182446 * 1.290994 / 2.0, rel=1e-6)
    assert half == pytest.approx(2.05426, abs=1e-5)


def test_mean_ci_other_confidence_and_small_samples():
    # t_{0.95, 3} = 2.353363
    assert mean_ci([1, 2, 3, 4], confidence=0.90)[1] == pytest.approx(2.353363 * 1.290994 / 2.0, rel=1e-6)
    mean, half = mean_ci([7.0])
    assert mean == 7.0 and math.isnan(half)
    mean, half = mean_ci([])
    assert math.isnan(mean) and math.isnan(half)


def test_mean_ci_skips_nan():
    assert mean_ci([1, np.nan, 2, 3, 4]) == pytest.approx(mean_ci([1, 2, 3, 4]))
    mean, half = mean_ci([np.nan, 5.0])
    assert mean == 5.0 and math.isnan(half)


def test_summarise_groups_sorted_with_counts_and_nan_skipped():
    metrics = pd.DataFrame({
        "method": ["piu", "base", "piu", "piu", "piu", "base"],
        "set": ["forget"] * 6,
        "ism": [1.0, 0.5, 2.0, 3.0, 4.0, 0.7],
        "kd": [0.1, np.nan, 0.3, np.nan, np.nan, 0.2],
    })
    out = summarise(metrics, ["method", "set"], ["ism", "kd"])
    assert list(out.columns) == ["method", "set", "n", "ism_mean", "ism_ci95", "ism_n", "kd_mean", "kd_ci95", "kd_n"]
    assert list(out["method"]) == ["base", "piu"]  # sorted, whatever the input order
    piu = out.set_index("method").loc["piu"]
    assert piu["n"] == 4 and piu["ism_n"] == 4 and piu["kd_n"] == 2
    assert piu["ism_mean"] == pytest.approx(2.5) and piu["ism_ci95"] == pytest.approx(2.05426, abs=1e-5)
    assert (piu["kd_mean"], piu["kd_ci95"]) == pytest.approx(mean_ci([0.1, 0.3]))
    base = out.set_index("method").loc["base"]
    assert base["kd_n"] == 1 and base["kd_mean"] == pytest.approx(0.2) and math.isnan(base["kd_ci95"])


def test_summarise_single_and_no_group_columns():
    metrics = pd.DataFrame({"method": ["b", "a", "b"], "x": [1.0, 2.0, 3.0]})
    by_method = summarise(metrics, ["method"], ["x"])
    assert list(by_method["method"]) == ["a", "b"] and list(by_method["x_mean"]) == [2.0, 2.0]
    overall = summarise(metrics, [], ["x"])
    assert len(overall) == 1 and overall.loc[0, "n"] == 3 and overall.loc[0, "x_mean"] == pytest.approx(2.0)


def test_before_after_row():
    row = before_after({"ism": 0.8, "kd": 0.01, "other": 1}, {"ism": 0.3, "kd": 0.05}, ["ism", "kd"])
    assert row == pytest.approx({"ism_before": 0.8, "ism_after": 0.3, "ism_delta": -0.5,
                                 "kd_before": 0.01, "kd_after": 0.05, "kd_delta": 0.04})
    with pytest.raises(KeyError):
        before_after({"ism": 0.8}, {}, ["ism"])
