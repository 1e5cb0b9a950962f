"""The audit's verdicts (hidden or removed) and its paired comparisons between runs, on hand-made audit tables."""

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from conftest import REPO
from idunlearn.audit.verdicts import (DECIDE_COMMAND, HIDDEN, HIDDEN_FIRST_ONLY, NO_ATTACK, NOT_FORGOTTEN, REMOVED,
                                      UNDETERMINED, WEAK_ATTACK, decide_note, identity_verdicts, paired_comparisons,
                                      run_verdict_lines, small_gap_line, verdict_markdown)
from idunlearn.config import load_config
from idunlearn.evaluation.statistics import equivalence_samples

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


def counted(run: str, identity: int, hits: int, samples: int, second: int | None = None) -> list[dict]:
    """Rows of a forgotten identity whose attack verified ``hits`` of ``samples`` (``second``: under the second
    recognizer too)."""
    values = {**light(), "attack__best__fa": hits / samples}
    if second is not None:
        values["attack__best__fa_second"] = second / samples
    return [{**row, "n": samples} for row in rows(run, identity, **values)]


def test_failing_to_show_hidden_is_not_removal():
    # retrain 1 of 8, the run 5 of 8: the one-sided Fisher test the old rule read says p = 0.059 (not below 0.05),
    # so it called the run removed although 5 of 8 is past recovered_min_fa 0.5
    assert stats.fisher_exact([[5, 3], [1, 7]], alternative="greater")[1] == pytest.approx(0.0594, abs=1e-4)
    table = pd.DataFrame([*original(1, 0.7), *original(2, 0.7), *counted("retrain", 1, 1, 8),
                          *counted("retrain", 2, 1, 8), *counted("piu", 1, 5, 8), *counted("piu", 2, 3, 8)])
    verdicts = identity_verdicts(table, **RULE, reference="retrain").set_index(["run", "identity"])
    assert verdicts.loc[("piu", 1), "verdict"] == HIDDEN  # the absolute bar fires
    # 3 of 8 against 1 of 8: neither test fires, and 8 samples cannot show equivalence: undetermined, with why
    assert verdicts.loc[("piu", 2), "verdict"] == UNDETERMINED
    reason = verdicts.loc[("piu", 2), "reason"]
    # retrain's pooled rate 2 / 16 = 0.125: the smallest n with 80% power at margin 0.1 (statistics.equivalence_samples)
    needed = equivalence_samples(0.125, 0.1, 0.8)
    assert reason.startswith("8 attack samples per arm cannot show equivalence") and f"{needed} per arm" in reason
    assert verdicts.loc[("piu", 2), "samples_needed"] == needed and verdicts.loc[("piu", 2), "samples"] == 8
    # the reference itself is judged by the absolute rule and the control: removed
    assert verdicts.loc[("retrain", 1), "verdict"] == REMOVED
    note = decide_note(verdicts.reset_index())
    assert any(f"audit.attack_samples: {needed}" in line for line in note)


def test_removal_shown_with_enough_samples_and_the_bar_on_either_recognizer():
    table = pd.DataFrame([*original(1, 0.7), *original(2, 0.7), *original(3, 0.7),
                          *counted("retrain", 1, 2, 100, 2), *counted("retrain", 2, 2, 100, 2),
                          *counted("retrain", 3, 2, 100, 1),
                          *counted("piu", 1, 3, 100, 2),  # upper bound 0.055 under both: shown within 0.1
                          *counted("piu", 2, 7, 100, 2),  # Fisher p 0.085, upper bound 0.106: not shown
                          *counted("piu", 3, 60, 100, 55)])  # both past the bar: hidden under both recognizers
    verdicts = identity_verdicts(table, **RULE, reference="retrain").set_index(["run", "identity"])
    assert verdicts.loc[("piu", 1), "verdict"] == REMOVED
    assert verdicts.loc[("piu", 1), "upper_difference"] == pytest.approx(0.05475, abs=1e-4)
    assert verdicts.loc[("piu", 2), "verdict"] == UNDETERMINED
    assert verdicts.loc[("piu", 2), "reason"].startswith("the attack's success is not shown within 0.1")
    assert verdicts.loc[("piu", 3), "verdict"] == HIDDEN
    # where the reference too is past the bar (50 of 100 under both recognizers), Fisher does not fire (60 against 50:
    # p 0.10; 55 against 50: p 0.28) and the old rule, which read Fisher alone once the reference was audited, called
    # the run removed; the absolute bar still fires
    generalises = table.copy()
    generalises.loc[(generalises["run"] == "retrain") & (generalises["identity"] == 3)
                    & (generalises["probe"] == "attack"), "value"] = 0.5
    assert stats.fisher_exact([[60, 40], [50, 50]], alternative="greater")[1] > 0.05
    again = identity_verdicts(generalises, **RULE, reference="retrain").set_index(["run", "identity"])
    assert again.loc[("piu", 3), "verdict"] == HIDDEN


def test_without_a_reference_a_run_past_the_bar_is_never_removed(table):
    for reference in (None, "missing"):
        verdicts = identity_verdicts(table, **RULE, reference=reference)
        past = verdicts[verdicts["attack_fa"] >= RULE["recovered_min_fa"]]
        assert len(past) and REMOVED not in set(past["verdict"])
        assert verdicts["samples_needed"].isna().all() and verdicts["upper_difference"].isna().all()


def test_verdict_table_lists_identities_whose_recovery_gap_is_too_small(table):
    gaps = pd.DataFrame([{"run": "piu", "identity": i, "probe": "relearning", "setting": "k=0", "metric": "gap",
                          "value": gap, "ci_low": np.nan, "ci_high": np.nan, "n": 8, "cosine": np.nan}
                         for i, gap in ((1, 0.4), (2, 0.05), (3, -0.02))])
    verdicts = identity_verdicts(pd.concat([table, gaps], ignore_index=True), **RULE, recovery_min_gap=0.1)
    line = small_gap_line(verdicts)
    assert "at least 0.1" in line and "listed and not averaged: `piu` 2 (+0.05)." in line
    assert line.endswith("counts as full recovery (a failure): `piu` 3 (-0.02).")
    assert small_gap_line(identity_verdicts(table, **RULE)) == ""


def test_docs_block_gives_counts_in_a_fixed_order_with_the_equivalence_design(tmp_path):
    from idunlearn.docs import render_audit_verdicts

    table = pd.DataFrame([*original(1, 0.7), *original(2, 0.7), *counted("retrain", 1, 0, 8),
                          *counted("retrain", 2, 1, 8), *counted("piu", 1, 6, 8), *counted("piu", 2, 1, 8)])
    (tmp_path / "tables").mkdir()
    identity_verdicts(table, **RULE, reference="retrain").to_csv(tmp_path / "tables" / "audit_verdicts.csv", index=False)
    block = render_audit_verdicts(tmp_path, "piu,retrain")
    assert block.splitlines()[0] == "| run | hidden | undetermined | removed |"
    assert "| `piu` | 1 (1) | 1 (2) | 0 |" in block and "| `retrain` | 0 | 0 | 2 (1, 2) |" in block
    # retrain's pooled rate 1 / 16; 8 samples per arm drawn
    needed = equivalence_samples(1 / 16, 0.1, 0.8)
    assert (f"retrain's pooled attack success is 0.062, and with run and reference both at that rate the test shows "
            f"equivalence with 80% power from {needed} samples per arm; with the 8 drawn its power is") in block


def test_more_attack_samples_replace_the_audit_jobs_and_decide_what_8_could_not():
    """audit.attack_samples: the rows of the jobs that drew more samples from the attack's condition replace the audit
    jobs' attack rows for their (run, identity) only; 0 of 8 on both arms is undetermined, 0 of 42 removed."""
    from idunlearn.audit.tables import with_attack_samples

    table = pd.DataFrame([*original(1, 0.7), *original(2, 0.7), *counted("retrain", 1, 0, 8),
                          *counted("retrain", 2, 0, 8), *counted("piu", 1, 0, 8), *counted("piu", 2, 0, 8)])
    before = identity_verdicts(table, **RULE, reference="retrain").set_index(["run", "identity"])
    assert before.loc[("piu", 1), "verdict"] == UNDETERMINED

    def drawn(run: str, identity: int, hits: int) -> tuple[str, int, pd.DataFrame]:
        part = [r for r in counted(run, identity, hits, 42) if r["probe"] == "attack"]
        return run, identity, pd.DataFrame(part).drop(columns=["run", "identity"])

    more = with_attack_samples(table, [drawn("retrain", 1, 0), drawn("piu", 1, 0), drawn("piu", 2, 20)])
    assert list(more.columns) == list(table.columns) and len(more) == len(table)
    attack_n = more[more["probe"] == "attack"].set_index(["run", "identity"])["n"]
    assert attack_n.loc[("piu", 1)] == 42 and attack_n.loc[("retrain", 2)] == 8  # retrain's identity 2 kept its 8
    assert (more[more["probe"] != "attack"].sort_values(["run", "identity", "probe", "setting", "metric"])
            .reset_index(drop=True).equals(table[table["probe"] != "attack"]
                                           .sort_values(["run", "identity", "probe", "setting", "metric"])
                                           .reset_index(drop=True)))
    after = identity_verdicts(more, **RULE, reference="retrain").set_index(["run", "identity"])
    # 0 of 42 against 0 of 42: the upper bound 1.645^2 / (42 + 1.645^2) = 0.061 is within the margin 0.1
    assert after.loc[("piu", 1), "verdict"] == REMOVED
    assert after.loc[("piu", 1), "upper_difference"] == pytest.approx(1.645 ** 2 / (42 + 1.645 ** 2), abs=2e-3)
    assert after.loc[("piu", 2), "verdict"] == HIDDEN  # 20 of 42 against retrain's 0 of 8: the Fisher test fires
    assert with_attack_samples(table, []) is table
