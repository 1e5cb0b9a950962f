"""The audit's verdicts (hidden or removed) and its paired comparisons between runs, on hand-made audit tables."""

import numpy as np
import pandas as pd
import pytest

import yaml

from conftest import REPO
from idunlearn.audit.verdicts import (DECIDE_COMMAND, HIDDEN, HIDDEN_FIRST_ONLY, NO_ATTACK, NOT_FORGOTTEN, REMOVED,
                                      UNDETERMINED, WEAK_ATTACK, identity_verdicts, paired_comparisons,
                                      run_verdict_lines, verdict_markdown)
from idunlearn.config import load_config

RULE = {"light_max_fa": 0.1, "recovered_min_fa": 0.5}


def rows(run: str, identity: int, **values) -> list[dict]:
    """Audit rows of one job; keys probe__setting__metric."""
    out = []
    for key, value in values.items():
        probe, setting, metric = key.split("__")
        out.append({"run": run, "identity": identity, "probe": probe, "setting": setting.replace("_", "="),
                    "metric": metric, "value": value, "ci_low": np.nan, "ci_high": np.nan, "n": 8, "cosine": np.nan})
    return out


def light(fa: float = 0.0, photo: float = 0.0) -> dict:
    return {"evaluation__forget__fa": fa, "photo__train__fa": photo, "photo__val__fa": 0.0}


def original(identity: int, attack_ism: float) -> list[dict]:
    """The original model's rows: the attack's control reads its attack ISM against its forget ISM (0.7)."""
    return rows("original", identity, evaluation__forget__fa=1.0, evaluation__forget__ism=0.7,
                attack__best__ism=attack_ism, attack__best__fa=1.0)


def attack(fa: float, second: float) -> dict:
    return {"attack__best__fa": fa, "attack__best__fa_second": second}


@pytest.fixture
def table() -> pd.DataFrame:
    records = [*original(1, 0.7), *original(2, 0.7), *original(3, 0.7), *original(4, 0.5), *original(5, 0.7),
               *rows("piu", 1, **light(), **attack(0.75, 0.625)),  # back under both recognizers: hidden
               *rows("piu", 2, **light(), **attack(0.75, 0.25)),  # only the attacker's recognizer agrees
               *rows("piu", 3, **light(0.1), **attack(0.125, 0.0)),  # FA at the bound still counts as forgotten
               *rows("piu", 4, **light(), **attack(0.125, 0.0)),  # attack below its control (0.5 < 0.9 x 0.7)
               *rows("piu", 5, **light(0.0, 0.5), **attack(1.0, 1.0))]  # a photo still brings the person back
    return pd.DataFrame.from_records(records)


def test_each_verdict_by_the_declared_rule(table):
    verdicts = identity_verdicts(table, **RULE).set_index("identity")
    assert list(verdicts["run"].unique()) == ["piu"]  # the original model is the control, not judged
    assert verdicts["verdict"].to_dict() == {1: HIDDEN, 2: HIDDEN_FIRST_ONLY, 3: REMOVED, 4: UNDETERMINED,
                                             5: NOT_FORGOTTEN}
    assert verdicts.loc[5, "photo_fa"] == 0.5 and not verdicts.loc[4, "control_passes"]
    # a recovered identity is hidden even where the control failed: the attack's success needs no control
    weak = table.copy()
    weak.loc[(weak["run"] == "original") & (weak["identity"] == 1) & (weak["probe"] == "attack")
             & (weak["metric"] == "ism"), "value"] = 0.3
    assert identity_verdicts(weak, **RULE).set_index("identity").loc[1, "verdict"] == HIDDEN
    # without a second recognizer, the first one's verdict stands
    first_only = table[table["metric"] != "fa_second"]
    assert identity_verdicts(first_only, **RULE).set_index("identity").loc[2, "verdict"] == HIDDEN
    # the light audit (no attack) never claims removal, and says why
    no_attack = table[table["probe"] != "attack"]
    light_only = identity_verdicts(no_attack, **RULE)
    assert set(light_only["verdict"]) == {UNDETERMINED, NOT_FORGOTTEN}
    assert set(light_only.loc[light_only["verdict"] == UNDETERMINED, "reason"]) == {NO_ATTACK}
    assert verdicts.loc[4, "reason"] == WEAK_ATTACK and (verdicts.drop(index=4)["reason"] == "").all()


def test_undetermined_verdicts_give_their_reason_and_what_decides_them(table):
    light_only = identity_verdicts(table[table["probe"] != "attack"], **RULE)
    line, = run_verdict_lines(light_only)
    assert f"undetermined 4: {NO_ATTACK}" in line
    text = verdict_markdown(light_only, paired_comparisons(table, None, seed=0), RULE)
    assert f"`{DECIDE_COMMAND}`" in text and "stronger attack" not in text
    weak = verdict_markdown(identity_verdicts(table, **RULE), paired_comparisons(table, None, seed=0), RULE)
    assert "stronger attack" in weak and DECIDE_COMMAND not in weak
    overlay = yaml.safe_load((REPO / DECIDE_COMMAND.split()[-1]).read_text())
    assert "attack" in load_config(REPO / "config" / "config.yaml", overlay)["audit"]["probes"]


def test_run_line_counts_and_share_hidden(table):
    line, = run_verdict_lines(identity_verdicts(table, **RULE))
    # 4 forgotten under the light probes, 2 of them hidden: 0.50 with the exact binomial interval of 2 of 4
    assert line.startswith("- **piu** (5 identities): not forgotten 1; hidden 1; hidden, first recognizer only 1; "
                           "undetermined 1; removed 1; hidden on 2 of the 4 it forgot")
    assert "(0.50, 0.07 to 0.93)" in line
    assert line.endswith("Most identities: hidden.")  # both kinds of hidden together: 2 against 1 each
    tie = identity_verdicts(table[table["identity"] != 2], **RULE)  # 1 each: the most cautious verdict wins
    assert run_verdict_lines(tie)[0].endswith("Most identities: not forgotten.")


def test_paired_comparisons_by_hand(table):
    extra = pd.DataFrame.from_records([*rows("robust", 1, **light(), **attack(0.25, 0.125)),
                                       *rows("robust", 2, **light(), **attack(0.5, 0.5)),
                                       *rows("robust", 3, **light(), **attack(0.0, np.nan))])
    both = pd.concat([table, extra], ignore_index=True)
    compared = paired_comparisons(both, "piu", seed=0).set_index(["probe", "metric"])
    first = compared.loc[("attack", "fa")]
    # robust - piu on identities 1, 2, 3 (only those both have): -0.5, -0.25, -0.125
    assert first["n"] == 3 and first["mean_diff"] == pytest.approx(-0.875 / 3)
    assert first["run"] == "robust" and first["reference"] == "piu"
    assert first["boot_low"] <= first["mean_diff"] <= first["boot_high"]
    second = compared.loc[("attack", "fa_second")]  # identity 3's second recognizer is not measured: left out
    assert second["n"] == 2 and second["mean_diff"] == pytest.approx((-0.5 + 0.25) / 2)
    assert paired_comparisons(both, None, seed=0).empty
    text = verdict_markdown(identity_verdicts(both, **RULE), paired_comparisons(both, "piu", seed=0), RULE)
    assert "## Paired differences against piu" in text and "| robust | attack | best | fa | 3 | -0.292" in text


def test_retain_ism_change_is_compared_as_the_sample_weighted_mean_of_the_locality_rows(table):
    def locality(run: str, identity: int, changes: dict) -> list[dict]:  # retain identity -> (ISM change, samples)
        return [{"run": run, "identity": identity, "probe": "locality", "setting": str(r), "metric": "ism_delta",
                 "value": v, "ci_low": np.nan, "ci_high": np.nan, "n": n, "cosine": 0.1} for r, (v, n) in changes.items()]

    extra = pd.DataFrame.from_records([*locality("piu", 1, {8: (-0.02, 3), 9: (0.0, 1)}),
                                       *locality("robust", 1, {8: (-0.06, 3), 9: (0.04, 1)})])
    compared = paired_comparisons(pd.concat([table, extra], ignore_index=True), "piu", seed=0)
    row = compared.set_index(["probe", "setting", "metric"]).loc[("locality", "mean", "ism_delta")]
    # piu: (3 x -0.02 + 0) / 4 = -0.015; robust: (3 x -0.06 + 0.04) / 4 = -0.035; difference -0.02
    assert row["n"] == 1 and row["mean_diff"] == pytest.approx(-0.02)
