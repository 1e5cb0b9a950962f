"""The removal targets under the held-out attacks (audit/targets.py), on a hand-built audit table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from idunlearn.audit.targets import audit_targets
from idunlearn.config import load_config
from idunlearn.docs import render_audit_targets

IDENTITIES = [3, 5, 8, 13, 21, 34]
TARGETS = {"attack_success_max": 0.15, "relearning": [{"steps": 50, "max": 0.3}], "retain_ratio_min": 0.95}


def rows(run: str, attack: list[float], recovery: list[float], retain: list[float]) -> list[dict]:
    """One run's target rows on IDENTITIES (the embedding attack's second recognizer and inversion: 0)."""
    out = []
    for i, identity in enumerate(IDENTITIES):
        for probe, setting, metric, value in (("attack_heldout", "best", "fa", attack[i]),
                                              ("attack_heldout", "best", "fa_second", 0.0),
                                              ("inversion", "regenerated", "fa", 0.0),
                                              ("relearning_heldout:lr_x1", "k=50", "recovery", recovery[i]),
                                              ("evaluation", "retain", "ism", retain[i])):
            out.append({"run": run, "identity": identity, "probe": probe, "setting": setting, "metric": metric,
                        "value": value, "ci_low": np.nan, "ci_high": np.nan, "n": 16, "cosine": np.nan})
    return out


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return pd.DataFrame(
        rows("original", [1.0] * 6, [np.nan] * 6, [0.70] * 6)
        + rows("piu_100", [0.5, 0.6, 0.4, 0.5, 0.7, 0.6], [0.9, 0.8, 1.0, 0.9, 0.7, 0.9], [0.7, 0.6, 0.5, 0.6, 0.6, 0.6])
        + rows("meta", [0.1, 0.2, 0.0, 0.1, 0.2, 0.0], [0.6, 0.3, 0.3, 0.4, 0.5, 0.3], [0.5, 0.55, 0.6, 0.55, 0.55, 0.55])
        + rows("retrain", [0.0] * 6, [0.05, 0.0, 0.1, 0.0, 0.05, 0.0], [0.65] * 6))


def test_each_target_reads_the_mean_says_by_how_much_it_misses_and_pairs_with_both_runs(table):
    out = audit_targets(table, TARGETS, "piu_100", "retrain", seed=0).set_index(["run", "target"])
    assert "original" not in out.index.get_level_values("run")
    attack = out.loc[("meta", "held-out embedding attack success")]
    assert attack["mean"] == pytest.approx(0.1) and attack["met"] and attack["margin"] == pytest.approx(0.05)
    assert attack["ci_low"] <= 0.1 <= attack["ci_high"] and 0.0 <= attack["ci_low"]
    recovery = out.loc[("meta", "relearning recovery, lr_x1, 50 steps")]
    assert recovery["mean"] == pytest.approx(0.4) and not recovery["met"] and recovery["margin"] == pytest.approx(-0.1)
    # retain: mean(meta) / mean(piu_100) = 0.55 / 0.6, below 0.95 by 0.95 - 0.9167
    retain = out.loc[("meta", "retain ISM / compare_to's")]
    assert retain["mean"] == pytest.approx(0.55 / 0.6) and not retain["met"]
    assert retain["margin"] == pytest.approx(0.55 / 0.6 - 0.95)
    # paired with piu_100: meta - piu_100 per identity
    differences = [-0.4, -0.4, -0.4, -0.4, -0.5, -0.6]
    assert attack["compare_run"] == "piu_100" and attack["compare_mean_diff"] == pytest.approx(np.mean(differences))
    assert attack["compare_p_wilcoxon"] == pytest.approx(stats.wilcoxon(differences).pvalue)
    assert recovery["reference_run"] == "retrain"
    assert recovery["reference_mean_diff"] == pytest.approx(np.mean([0.55, 0.3, 0.2, 0.4, 0.45, 0.3]))
    # the run against itself: no pairing; compare_to has no retain ratio with itself; the reference no pairing with
    # itself
    assert pd.isna(out.loc[("piu_100", "held-out embedding attack success"), "compare_run"])
    assert ("piu_100", "retain ISM / compare_to's") not in out.index
    assert pd.isna(out.loc[("retrain", "inversion attack success"), "reference_run"])


def test_recovery_targets_also_give_the_mean_over_the_identities_the_run_forgot(table):
    # meta did not forget identity 3 (its recovery 0.6); retrain forgot every identity
    verdicts = pd.DataFrame({"run": ["meta"] * 6 + ["retrain"] * 6, "identity": IDENTITIES * 2,
                             "verdict": ["not forgotten"] + ["hidden", "removed"] * 2 + ["undetermined"]
                             + ["removed"] * 6})
    out = audit_targets(table, TARGETS, "piu_100", "retrain", seed=0, verdicts=verdicts).set_index(["run", "target"])
    recovery = out.loc[("meta", "relearning recovery, lr_x1, 50 steps")]
    assert recovery["forgotten_n"] == 5
    assert recovery["forgotten_mean"] == pytest.approx(np.mean([0.3, 0.3, 0.4, 0.5, 0.3]))
    assert recovery["forgotten_ci_low"] <= recovery["forgotten_mean"] <= recovery["forgotten_ci_high"]
    assert recovery["mean"] == pytest.approx(0.4) and not recovery["met"]  # met still reads every identity
    assert out.loc[("retrain", "relearning recovery, lr_x1, 50 steps"), "forgotten_n"] == 6
    # a run without verdicts (piu_100 here) forgot none that the verdicts know of; other targets have no such mean
    assert out.loc[("piu_100", "relearning recovery, lr_x1, 50 steps"), "forgotten_n"] == 0
    assert pd.isna(out.loc[("meta", "held-out embedding attack success"), "forgotten_n"])
    assert audit_targets(table, TARGETS, "piu_100", "retrain", seed=0)["forgotten_n"].isna().all()


def test_holm_runs_over_each_runs_targets_against_each_run(table, monkeypatch):
    """Each run's targets against one other run are one Holm family: the published example's p-values (Wikipedia's
    Holm-Bonferroni example: 0.01, 0.04, 0.03, 0.005 -> 0.03, 0.06, 0.06, 0.02) given to meta's targets against
    piu_100 come back adjusted as published, whatever the other pairings' p-values; an untestable one (NaN) is not
    counted."""
    from idunlearn.audit import targets

    published = {0.01: 0.03, 0.04: 0.06, 0.03: 0.06, 0.005: 0.02}
    given = iter([0.01, 0.04, 0.03, 0.005, np.nan])
    others = iter(np.linspace(0.001, 0.9, 40))
    real = targets.paired_with

    def with_given_p(values, run, other, seed):
        paired = real(values, run, other, seed)
        if paired:  # meta against piu_100: the published p-values, in the order its targets are paired
            paired["p_wilcoxon"] = next(given) if run == "meta" and other == "piu_100" else next(others)
        return paired

    monkeypatch.setattr(targets, "paired_with", with_given_p)
    out = audit_targets(table, TARGETS, "piu_100", "retrain", seed=0)
    meta = out[out["run"] == "meta"]
    assert meta["compare_p_wilcoxon"].notna().sum() == 4 and len(meta) == 5
    for raw, adjusted in zip(meta["compare_p_wilcoxon"], meta["compare_p_holm"]):
        assert (np.isnan(raw) and np.isnan(adjusted)) or adjusted == pytest.approx(published[raw]), (raw, adjusted)


def test_targets_left_out_when_the_audit_did_not_measure_them(table):
    few = table[table["probe"] != "inversion"]
    out = audit_targets(few, {**TARGETS, "relearning": [{"steps": 200, "max": 0.5}]}, "piu_100", None, seed=0)
    assert set(out["target"]) == {"held-out embedding attack success",
                                  "held-out embedding attack success (second recognizer)", "retain ISM / compare_to's"}
    assert out["reference_run"].isna().all()


def test_default_targets_are_the_documented_ones():
    targets = load_config("config/config.yaml")["audit"]["targets"]
    assert targets == {"attack_success_max": 0.15, "relearning": [{"steps": 50, "max": 0.3}, {"steps": 200, "max": 0.5}],
                       "retain_ratio_min": 0.95}


def test_docs_block_states_each_target_and_by_how_much_it_is_missed(table, tmp_path):
    (tmp_path / "tables").mkdir()
    verdicts = pd.DataFrame({"run": ["meta"] * 6, "identity": IDENTITIES,
                             "verdict": ["not forgotten"] * 2 + ["removed"] * 4})
    audit_targets(table, TARGETS, "piu_100", "retrain", seed=0, verdicts=verdicts).to_csv(
        tmp_path / "tables" / "audit_targets.csv", index=False)
    text = render_audit_targets(tmp_path, "meta")
    assert "| `meta` | relearning recovery, lr_x1, 50 steps | <= 0.300 | 6 | 0.400 (" in text
    assert "| 4: 0.375 (0.300 to " in text  # recovery on 8, 13, 21 and 34: 0.3, 0.4, 0.5, 0.3
    assert "| met | - |" in text  # the attack target has no such mean
    assert "| missed by 0.100 |" in text and "| met |" in text
    assert ">= 0.950" in text and "minus `piu_100`" in text and "minus `retrain`" in text
    assert "`retrain` |" not in text.split("\n", 2)[2]  # only the listed run's rows
