import numpy as np
import pandas as pd
import pytest

from idunlearn.config import validate_config
from idunlearn.study import build_study, check_claims, claims_markdown, paper_tables

METRICS = ["ism_forget", "ism_retain", "srk", "kd_forget", "kd_retain", "quality_forget", "quality_retain",
           "anchor_ism_retain"]


def synthetic_metrics(after: dict[str, dict], identities=(1, 2)) -> pd.DataFrame:
    """Metrics rows: before values 0.8 everywhere (srk 1), after values from ``after[run]`` (+0.01 per identity)."""
    rows = []
    for run, values in after.items():
        for k, ident in enumerate(identities):
            row = {"run": run, "forget_identity": ident}
            for m in METRICS:
                before = 1.0 if m == "srk" else 0.8
                row[f"{m}_before"] = before
                row[f"{m}_after"] = values.get(m, before) + 0.01 * k
                row[f"{m}_delta"] = row[f"{m}_after"] - before
            rows.append(row)
    return pd.DataFrame(rows)


def study_config(study: dict, sweeps: dict | None = None, runs: dict | None = None) -> dict:
    return validate_config({"unlearning": {"runs": runs or {"piu": {}}, "sweeps": sweeps or {}}, "study": study})


def test_table1_cells_are_identity_means_beside_the_paper():
    cfg = study_config({"table1": {"rows": {"before": "before", "PIU": "piu", "UCE": "uce"}}},
                       runs={"piu": {}, "uce": {"method": "uce"}})
    metrics = synthetic_metrics({"piu": {"ism_forget": 0.1, "srk": 80.0}, "uce": {"ism_forget": 0.6, "srk": 1.0}})
    table = build_study(metrics, cfg)["table1"].set_index("row")
    assert table.loc["PIU", "ism_forget"] == pytest.approx(0.105)  # mean of 0.10 and 0.11
    assert table.loc["PIU", "ism_forget_ci95"] > 0 and table.loc["PIU", "n_identities"] == 2
    assert table.loc["before", "ism_forget"] == pytest.approx(0.8) and np.isnan(table.loc["before", "kd_forget_delta"])
    assert table.loc["PIU", "kd_forget_delta"] == pytest.approx(0.005)  # after - before: 0.00 and 0.01
    paper = paper_tables()["table1"]["rows"]
    assert table.loc["PIU", "srk_paper"] == paper["PIU"]["srk"] and table.loc["UCE", "ism_forget_paper"] == 0.59
    claims = check_claims(build_study(metrics, cfg)).set_index("claim")
    assert claims["holds"].tolist() == ["yes", "yes"]  # best SRK with retain ISM kept; lowest forget ISM
    # 95% half width of two identities 0.01 apart: t(0.975, 1) 0.01 / sqrt(2) / sqrt(2) = 0.0635 per row
    assert claims["beyond_noise"].tolist() == ["yes", "yes"]
    metrics = synthetic_metrics({"piu": {"ism_forget": 0.1, "srk": 80.0, "ism_retain": 0.5},
                                 "uce": {"ism_forget": 0.05, "srk": 1.0}})
    assert check_claims(build_study(metrics, cfg))["holds"].tolist() == ["no", "no"]


def test_sweep_claims_follow_the_numbers():
    sweeps = {"lambda": {"run": "piu", "key": "lambda", "values": [0, 5, 10, 20]},
              "eta": {"run": "piu", "key": "eta", "values": [0, 1, 3]}}
    cfg = study_config({"table3": {"sweep": "lambda"}, "table5": {"sweep": "eta"}}, sweeps=sweeps)
    after = {"piu": {"ism_forget": 0.3, "ism_retain": 0.7, "srk": 50},
             "piu.lambda_0": {"ism_forget": 0.1, "ism_retain": 0.2, "srk": 10},
             "piu.lambda_5": {"ism_forget": 0.2, "ism_retain": 0.69, "srk": 60},
             "piu.lambda_20": {"ism_forget": 0.4, "ism_retain": 0.71, "srk": 20},
             "piu.eta_0": {"ism_forget": 0.6, "ism_retain": 0.72, "srk": 1.5},
             "piu.eta_3": {"ism_forget": 0.2, "ism_retain": 0.65, "srk": 70}}
    tables = build_study(synthetic_metrics(after), cfg)
    assert list(tables["table3"]["row"]) == ["0", "5", "10", "20"]
    assert list(tables["table3"]["run"]) == ["piu.lambda_0", "piu.lambda_5", "piu", "piu.lambda_20"]
    claims = check_claims(tables).set_index("claim")["holds"]
    assert claims["lambda = 0 collapses retain ISM (lowest of the sweep)"] == "yes"
    assert claims["Larger lambda weakens forgetting (forget ISM rises with lambda)"] == "yes"
    assert claims["eta = 0 forgets weakly (highest forget ISM and lowest SRK of the sweep)"] == "yes"
    # the same sweep with eta = 0 forgetting best: the claim must flip
    after["piu.eta_0"] = {"ism_forget": 0.05, "ism_retain": 0.72, "srk": 90}
    flipped = check_claims(build_study(synthetic_metrics(after), cfg)).set_index("claim")["holds"]
    assert flipped["eta = 0 forgets weakly (highest forget ISM and lowest SRK of the sweep)"] == "no"
    assert "**yes** (beyond noise)" in claims_markdown(check_claims(tables), 2)
    # forget ISM 0.10, 0.20, 0.30, 0.12 over lambda 0..20 still rises (Spearman +0.4), but its ends lie 0.02 apart,
    # inside their intervals (2 x 0.0635): the verdict stays, marked within noise
    after["piu.lambda_20"] = {"ism_forget": 0.12, "ism_retain": 0.71, "srk": 20}
    claim = "Larger lambda weakens forgetting (forget ISM rises with lambda)"
    noisy = check_claims(build_study(synthetic_metrics(after), cfg)).set_index("claim").loc[claim]
    assert noisy["holds"] == "yes" and noisy["beyond_noise"] == "no"


def test_missing_runs_and_unknown_tables_are_named():
    cfg = study_config({"table1": {"rows": {"PIU": "piu", "SISS": "siss"}}})
    with pytest.raises(ValueError, match="siss"):
        build_study(synthetic_metrics({"piu": {}}), cfg)
    with pytest.raises(Exception, match="table9"):
        study_config({"table9": {"sweep": "x"}})
