"""Relearning recovery (audit/relearning.py): the ratio only over a declared minimum forget-ISM gap, the ISM regained
beside it, a negative gap counted as full recovery, and step 0 required; by hand on a made-up audit table."""

import math

import numpy as np
import pandas as pd
import pytest

from idunlearn.audit.relearning import recovery, relearning_rows, with_recovery
from idunlearn.config import ConfigError, validate_config


def ism_rows(run: str, identity: int, probe: str, ism: dict[int, float]) -> list[dict]:
    return [{"run": run, "identity": identity, "probe": probe, "setting": f"k={k}", "metric": "ism", "value": v,
             "ci_low": np.nan, "ci_high": np.nan, "n": 4, "cosine": np.nan} for k, v in ism.items()]


@pytest.fixture
def table() -> pd.DataFrame:
    original = [{"run": "original", "identity": i, "probe": "evaluation", "setting": "forget", "metric": "ism",
                 "value": 0.7, "ci_low": np.nan, "ci_high": np.nan, "n": 4, "cosine": np.nan} for i in (1, 2, 3)]
    stale = {**ism_rows("piu", 1, "relearning", {50: 0.0})[0], "metric": "recovery", "value": 99.0}  # the job's own
    return pd.DataFrame([*original, stale,
                         *ism_rows("piu", 1, "relearning", {0: 0.2, 50: 0.5}),  # gap 0.5
                         *ism_rows("piu", 2, "relearning", {0: 0.65, 50: 0.7}),  # gap 0.05: below 0.1
                         *ism_rows("piu", 3, "relearning", {0: 0.75, 50: 0.8}),  # gap -0.05
                         *ism_rows("piu", 1, "relearning_heldout:lr_x10", {0: 0.2, 10: 0.8}),
                         *ism_rows("original", 1, "relearning_control", {0: 0.5, 50: 0.6})])


def test_recovery_regained_and_gap_by_hand(table):
    out = with_recovery(table, min_gap=0.1).set_index(["run", "identity", "probe", "setting", "metric"])["value"]
    # identity 1: (0.5 - 0.2) / (0.7 - 0.2) = 0.6, regained 0.3, gap 0.5; the job's stale recovery row is replaced
    assert out[("piu", 1, "relearning", "k=50", "recovery")] == pytest.approx(0.6)
    assert out[("piu", 1, "relearning", "k=50", "regained")] == pytest.approx(0.3)
    assert out[("piu", 1, "relearning", "k=0", "gap")] == pytest.approx(0.5)
    assert out[("piu", 1, "relearning", "k=0", "recovery")] == 0.0
    # identity 2: gap 0.05 < 0.1: no ratio (it would read 1.0 from 0.05 of ISM), the ISM regained 0.05 still reported
    assert math.isnan(out[("piu", 2, "relearning", "k=50", "recovery")])
    assert out[("piu", 2, "relearning", "k=50", "regained")] == pytest.approx(0.05)
    # identity 3: unlearning left the person closer than the original: full recovery, a failure, never NaN
    assert out[("piu", 3, "relearning", "k=50", "recovery")] == 1.0
    assert out[("piu", 3, "relearning", "k=0", "gap")] == pytest.approx(-0.05)
    # a held-out variant: (0.8 - 0.2) / 0.5 = 1.2; the control's rows are left alone
    assert out[("piu", 1, "relearning_heldout:lr_x10", "k=10", "recovery")] == pytest.approx(1.2)
    assert not any(key[2] == "relearning_control" and key[4] != "ism" for key in out.index)
    assert (out.index.get_level_values("metric") == "recovery").sum() == 3 * 2 + 2


def test_recovery_function_thresholds():
    assert recovery(0.5, 0.2, 0.7, min_gap=0.1) == pytest.approx(0.6)
    assert recovery(0.5, 0.25, 0.75, min_gap=0.5) == 0.5  # a gap of exactly the minimum: still a ratio
    assert math.isnan(recovery(0.5, 0.25, 0.3, min_gap=0.1))
    assert recovery(0.1, 0.5, 0.4, min_gap=0.1) == 1.0


def test_step_zero_is_required(table):
    with pytest.raises(ValueError, match="no k=0 measurement"):
        with_recovery(table[table["setting"] != "k=0"], min_gap=0.1)
    with pytest.raises(ValueError, match="must include 0"):
        relearning_rows([{"k": 10, "ism": 0.3, "fa": 0.0}], "relearning", 0.7, 4)
    for probe in ("relearning", "relearning_heldout"):
        with pytest.raises(ConfigError, match=rf"audit\.probes\.{probe}\.steps"):
            validate_config({"audit": {"probes": {"relearning": {}, probe: {"steps": [10, 50]}}}})
