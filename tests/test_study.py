import numpy as np
import pandas as pd
import pytest

from idunlearn.config import validate_config
from idunlearn.evaluation.identity import srk
from idunlearn.evaluation.statistics import holm
from idunlearn.study import build_study, check_claims, claims_markdown, paper_tables

N = 10  # evaluation samples per kind and identity
METRICS = ["ism_forget", "ism_retain", "kd_forget", "kd_retain", "quality_forget", "quality_retain",
           "anchor_ism_retain"]
BEFORE = {"forget_hits": 9, "retain_hits": 9}  # the original model recognises 9 of 10 samples of each kind


def synthetic(after: dict[str, dict], identities=tuple(range(1, 13))):
    """(metrics, counts) tables. Before: every metric 0.8, hits ``BEFORE``. After: per run, values (scalar or one per
    identity) of the metrics and of ``forget_hits`` / ``retain_hits`` (of N); others as before. A run's
    ``identities`` key restricts it to those identities. ``srk_identity`` follows from the hits (PIU eq. 10)."""
    metrics, counts = [], []
    for run, values in after.items():
        ids = values.get("identities", identities)
        for k, ident in enumerate(ids):
            at = {key: (np.asarray(v)[k] if np.ndim(v) else v) for key, v in values.items() if key != "identities"}
            row = {"run": run, "forget_identity": ident}
            for m in METRICS:
                row[f"{m}_before"], row[f"{m}_after"] = 0.8, float(at.get(m, 0.8))
            hits = {phase: {h: int(at.get(h, BEFORE[h])) if phase == "after" else BEFORE[h] for h in BEFORE}
                    for phase in ("before", "after")}
            for phase, h in hits.items():
                row[f"srk_identity_{phase}"] = srk(h["retain_hits"] / N, h["forget_hits"] / N)
                counts.append({"run": run, "phase": phase, "forget_identity": ident, "forget_n": N,
                               "retain_n": N, **h})
            for m in [*METRICS, "srk_identity"]:
                row[f"{m}_delta"] = row[f"{m}_after"] - row[f"{m}_before"]
            metrics.append(row)
    return pd.DataFrame(metrics), pd.DataFrame(counts)


def study_config(study: dict, sweeps: dict | None = None, runs: dict | None = None) -> dict:
    return validate_config({"unlearning": {"runs": runs or {"piu": {}}, "sweeps": sweeps or {}}, "study": study})


TABLE1 = study_config({"table1": {"rows": {"before": "before", "PIU": "piu", "UCE": "uce"}}},
                      runs={"piu": {}, "uce": {"method": "uce"}})
TABLE2 = study_config({"table2": {"rows": {"before": "before", "Naive": "naive", "+ Preservation": "pres",
                                           "+ Neg. guidance": "neg"}}},
                      runs={"naive": {}, "pres": {}, "neg": {}})


def test_table_cells_pooled_srk_beside_the_per_identity_mean_and_the_paper():
    metrics, counts = synthetic({"piu": {"ism_forget": [0.10, 0.12], "forget_hits": [0, 2], "retain_hits": [10, 6]},
                                 "uce": {"ism_forget": 0.6}}, identities=(1, 2))
    table = build_study(metrics, counts, TABLE1)["table1"].set_index("row")
    # pooled (PIU eqs. 8-10): Acc_U = 2/20, Acc_R = 16/20; per identity: 1 / 0.01 and 0.6 / 0.21, averaged
    assert table.loc["PIU", "srk"] == pytest.approx(0.8 / 0.11)
    assert table.loc["PIU", "srk_identity"] == pytest.approx((100 + 0.6 / 0.21) / 2)
    assert table.loc["PIU", "srk_ci_low"] <= table.loc["PIU", "srk"] <= table.loc["PIU", "srk_ci_high"]
    assert table.loc["before", "srk"] == pytest.approx(0.9 / 0.91) and table.loc["PIU", "n_identities"] == 2
    assert table.loc["PIU", "srk_paper"] == paper_tables()["table1"]["rows"]["PIU"]["srk"]
    # other metrics: means with identity-bootstrap intervals; two identities (0.10, 0.12): resampled means are 0.10,
    # 0.11, 0.12 with probabilities 1/4, 1/2, 1/4, so the 95% interval is (0.10, 0.12)
    assert table.loc["PIU", "ism_forget"] == pytest.approx(0.11)
    assert (table.loc["PIU", "ism_forget_ci_low"], table.loc["PIU", "ism_forget_ci_high"]) == pytest.approx((0.10, 0.12))
    assert table.loc["UCE", "ism_forget_paper"] == 0.59 and np.isnan(table.loc["before", "kd_forget_delta"])


def _claims(after: dict, config: dict = TABLE2, identities=tuple(range(1, 13))) -> pd.DataFrame:
    metrics, counts = synthetic(after, identities)
    return check_claims(build_study(metrics, counts, config), metrics, counts, 42)


PRESERVATION = "Adding the preservation term raises retain ISM over naive unlearning"
NEGATIVE = "Adding negative guidance lowers forget ISM"
K = np.arange(12)


def test_consistent_large_effect_over_twelve_identities_is_established():
    naive = 0.4 + 0.01 * K
    claims = _claims({"naive": {"ism_retain": naive}, "pres": {"ism_retain": naive + 0.2 + 0.001 * K},
                      "neg": {"ism_forget": 0.5 - 0.001 * K}}).set_index("claim")
    row = claims.loc[PRESERVATION]
    assert row["n_identities"] == 12 and row["effect"] == pytest.approx(0.2055)
    assert row["effect_ci_low"] > 0.2 and row["t_ci_low"] > 0.2 and row["direction"] == 1
    assert row["p_wilcoxon"] == pytest.approx(1 / 2 ** 12)  # all 12 differences positive, exact one-sided test
    # Holm across the two claims of table 2 (both p = 1 / 4096): 2 x that
    assert claims["p_holm"].tolist() == pytest.approx(holm(claims["p_wilcoxon"]))
    assert row["p_holm"] == pytest.approx(2 / 2 ** 12)
    assert bool(row["holds"]) and bool(row["established"])
    assert bool(claims.loc[NEGATIVE, "established"])  # forget ISM 0.8 -> ~0.5 on every identity


def test_same_mean_but_noisy_or_few_identities_is_not_established():
    naive = np.full(12, 0.4)
    swing = np.array([0.5, -0.5, 0.6, -0.6, 0.7, -0.7, 0.8, -0.8, 0.9, -0.9, 1.0, -1.0])
    noisy = _claims({"naive": {"ism_retain": naive}, "pres": {"ism_retain": naive + 0.2 + swing},
                     "neg": {}}).set_index("claim")
    row = noisy.loc[PRESERVATION]
    assert row["effect"] == pytest.approx(0.2) and row["p_wilcoxon"] > 0.05 and row["t_ci_low"] < 0
    assert bool(row["holds"]) and not bool(row["established"])
    # the consistent effect on only 4 identities: the smallest one-sided signed-rank p is 1 / 2^4, Holm x 2
    few = _claims({"naive": {"ism_retain": naive[:4]}, "pres": {"ism_retain": naive[:4] + 0.2 + 0.001 * K[:4]},
                   "neg": {}}, identities=(1, 2, 3, 4)).set_index("claim")
    assert few.loc[PRESERVATION, "p_wilcoxon"] == pytest.approx(1 / 16) and few.loc[PRESERVATION, "n_identities"] == 4
    assert bool(few.loc[PRESERVATION, "holds"]) and not bool(few.loc[PRESERVATION, "established"])
    # no difference at all: p = 1, neither holds nor established
    assert noisy.loc[NEGATIVE, "p_wilcoxon"] == 1.0 and not bool(noisy.loc[NEGATIVE, "holds"])


def test_wrong_direction_does_not_hold():
    naive = 0.6 + 0.01 * K
    claims = _claims({"naive": {"ism_retain": naive}, "pres": {"ism_retain": naive - 0.2 - 0.001 * K}, "neg": {}})
    row = claims.set_index("claim").loc[PRESERVATION]
    # tested in the claimed direction (retain ISM rises): every difference negative, P(W+ >= 0) = 1
    assert row["effect"] == pytest.approx(-0.2055) and row["p_wilcoxon"] == pytest.approx(1.0)
    assert not bool(row["holds"]) and not bool(row["established"])
    md = claims_markdown(claims, 12)
    assert f"**does not hold** — {PRESERVATION} (table2: + Preservation > Naive in ism_retain, n = 12)" in md


def test_srk_claims_use_the_pooled_srk_and_test_per_identity_srk():
    # PIU forgets 11 identities fully (Acc_U 0) and one not at all; UCE keeps recognising 5 of 10 everywhere
    piu_hits = np.r_[np.zeros(11), 10]
    claims = _claims({"piu": {"forget_hits": piu_hits, "retain_hits": 9, "ism_forget": 0.2, "ism_retain": 0.75},
                      "uce": {"forget_hits": 5, "retain_hits": 9, "ism_forget": 0.5}}, TABLE1).set_index("claim")
    row = claims.loc["PIU reaches a higher SRK than every other method"]
    # pooled: PIU Acc_U 10/120, Acc_R 0.9; UCE Acc_U 0.5, Acc_R 0.9
    assert row["effect"] == pytest.approx(0.9 / (10 / 120 + 0.01) - 0.9 / 0.51)
    # per identity: 11 x (90 - 0.9/0.51) and one 0.9/1.01 - 0.9/0.51 < 0
    assert row["mean_identity_diff"] == pytest.approx((11 * 90 + 0.9 / 1.01) / 12 - 0.9 / 0.51)
    assert row["row_a"] == "UCE" and row["row_b"] == "PIU" and bool(row["established"])
    kept = claims.loc["PIU keeps retain ISM (above 0.9 x the original model's)"]
    # retain ISM 0.75 against 0.9 x 0.8 on every identity
    assert kept["effect"] == pytest.approx(0.75 - 0.72) and bool(kept["established"])


def test_ablation_runs_on_fewer_identities_pair_on_the_intersection():
    sweeps = {"lambda": {"run": "piu", "key": "lambda", "values": [0, 5, 10, 20]}}
    cfg = study_config({"table3": {"sweep": "lambda"}}, sweeps=sweeps)
    six = tuple(range(1, 7))
    after = {"piu": {"ism_forget": 0.3, "ism_retain": 0.7},
             "piu.lambda_0": {"identities": six, "ism_forget": 0.1, "ism_retain": 0.2 + 0.01 * K[:6]},
             "piu.lambda_5": {"identities": six, "ism_forget": 0.2, "ism_retain": 0.69},
             "piu.lambda_20": {"identities": six, "ism_forget": 0.4 + 0.01 * K[:6], "ism_retain": 0.71}}
    metrics, counts = synthetic(after)
    tables = build_study(metrics, counts, cfg)
    assert list(tables["table3"]["run"]) == ["piu.lambda_0", "piu.lambda_5", "piu", "piu.lambda_20"]
    assert list(tables["table3"]["n_identities"]) == [6, 6, 12, 6]
    claims = check_claims(tables, metrics, counts, 42).set_index("claim")
    collapse = claims.loc["lambda = 0 collapses retain ISM (lowest of the sweep)"]
    assert collapse["row_a"] == "5" and collapse["n_identities"] == 6
    # 6 consistent identities: one-sided p 1 / 2^6, Holm over the table's two claims 2 / 2^6 < 0.05
    assert collapse["p_wilcoxon"] == pytest.approx(1 / 2 ** 6) and collapse["p_holm"] == pytest.approx(2 / 2 ** 6)
    assert bool(collapse["established"])
    trend = claims.loc["Larger lambda weakens forgetting (forget ISM rises with lambda)"]
    assert trend["row_a"] == "0" and trend["row_b"] == "20" and trend["n_identities"] == 6
    assert trend["effect"] == pytest.approx(0.3 + 0.025)


def test_missing_runs_and_unknown_tables_are_named():
    cfg = study_config({"table1": {"rows": {"PIU": "piu", "SISS": "siss"}}})
    with pytest.raises(ValueError, match="siss"):
        build_study(*synthetic({"piu": {}}), cfg)
    with pytest.raises(Exception, match="table9"):
        study_config({"table9": {"sweep": "x"}})


def test_table1_compares_paper_settings_with_each_other_and_tuned_settings_with_each_other():
    # a tuned baseline that beats paper-setting PIU must not count against it: PIU meets each method on equal terms
    runs = {"piu": {}, "uce": {"method": "uce"}, "piu.tuned": {}, "uce.tuned": {"method": "uce"}}
    cfg = study_config({"table1": {"rows": {"before": "before", "PIU": "piu", "UCE": "uce", "PIU (tuned)": "piu.tuned",
                                            "UCE (tuned)": "uce.tuned"}}}, runs=runs)
    claims = _claims({"piu": {"ism_forget": 0.2 + 0.001 * K}, "uce": {"ism_forget": 0.5},
                      "piu.tuned": {"ism_forget": 0.3}, "uce.tuned": {"ism_forget": 0.1 + 0.001 * K}},
                     cfg).set_index("claim")
    paper = claims.loc["PIU has a lower forget ISM than every other method"]
    assert (paper["row_a"], paper["row_b"]) == ("UCE", "PIU") and bool(paper["established"])
    tuned = claims.loc["PIU has a lower forget ISM than every other method (every method at its tuned setting)"]
    assert (tuned["row_a"], tuned["row_b"]) == ("UCE (tuned)", "PIU (tuned)") and not bool(tuned["holds"])
    assert len(claims) == 6
    # without the tuned PIU row the tuned baselines have nothing to meet
    no_piu = study_config({"table1": {"rows": {"before": "before", "PIU": "piu", "UCE": "uce",
                                               "UCE (tuned)": "uce.tuned"}}}, runs=runs)
    assert len(_claims({"piu": {}, "uce": {}, "uce.tuned": {}}, no_piu)) == 3
