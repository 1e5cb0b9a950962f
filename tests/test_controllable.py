import numpy as np
import pandas as pd
import pytest
import torch

from idunlearn.config import ConfigError, controllable_runs, epsilon_boundary_runs, run_config, validate_config
from idunlearn.controllable import (
    PARETO_METRICS, bound_activity, bounded_column, final_objective, pareto_figure, pareto_summary, pareto_table,
    phase_two_epsilon, run_epsilon,
)
from idunlearn.unlearning.optimisers import build_optimiser


def config(fractions=(0.75, 0.25)):
    return validate_config({"unlearning": {"runs": {"piu": {"steps": 20, "eta": 2.0}}, "controllable": {
        "piu": {"fractions": list(fractions), "overrides": {"steps": 10}}}}})


def test_controllable_expands_phase_one_and_two_runs_in_completeness_order():
    cfg = config()
    points = controllable_runs(cfg)["piu"]
    assert [(p, n) for p, n, _ in points] == [("highest", "piu.eps_highest"), ("0.25", "piu.eps_0.25"),
                                              ("0.75", "piu.eps_0.75"), ("lowest", "piu.eps_lowest")]
    phase2 = run_config(cfg, "piu.eps_0.25")
    assert phase2["optimiser"] == "epsilon_constrained" and phase2["epsilon_phase"] == "controlled"
    assert phase2["epsilon_fraction"] == 0.25 and phase2["steps"] == 10 and phase2["eta"] == 2.0
    assert run_config(cfg, "piu.eps_lowest")["epsilon_phase"] == "lowest"  # the paper's Phase I by default
    assert epsilon_boundary_runs(cfg, "piu.eps_0.25") == ["piu.eps_highest", "piu.eps_lowest"]
    assert epsilon_boundary_runs(cfg, "piu") == [] and epsilon_boundary_runs(cfg, "piu.eps_highest") == []


def test_phase_two_hold_bound_is_set_through_overrides_and_absent_elsewhere():
    # epsilon_hold_bound has no schema default: runs that do not set it keep the parameters cached runs had
    cfg = validate_config({"unlearning": {"runs": {"piu": {}}, "controllable": {
        "piu": {"fractions": [0.5], "overrides": {"epsilon_hold_bound": True}}}}})
    assert run_config(cfg, "piu.eps_0.5")["epsilon_hold_bound"] is True
    assert "epsilon_hold_bound" not in run_config(cfg, "piu")
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['epsilon_hold'\]"):
        run_config(validate_config({"unlearning": {"runs": {"piu": {}}, "controllable": {
            "piu": {"fractions": [0.5], "overrides": {"epsilon_hold": True}}}}}), "piu.eps_0.5")


def test_the_lowest_boundary_is_the_papers_phase_one_run_or_the_original_model():
    cfg = validate_config({"unlearning": {"runs": {"piu": {}}, "controllable": {
        "piu": {"fractions": [0.5], "lowest": "original"}}}})
    assert run_config(cfg, "piu.eps_lowest")["epsilon_phase"] == "original"  # the extension
    with pytest.raises(ConfigError, match="unlearning.controllable.piu.lowest"):
        validate_config({"unlearning": {"controllable": {"piu": {"fractions": [0.5], "lowest": "zero"}}}})


def test_epsilon_constrained_runs_default_to_no_weight_decay_and_others_keep_pius():
    # epsilon-constrained paper, Appendix E.1: AdamW (Adam) with no weight decay; PIU's runs keep 0.01
    cfg = validate_config({"unlearning": {"runs": {"piu": {}, "mine": {"optimiser": "epsilon_constrained"},
                                                   "decayed": {"optimiser": "epsilon_constrained", "weight_decay": 0.1}},
                                          "controllable": {"piu": {"fractions": [0.5]}}}})
    assert [run_config(cfg, run)["weight_decay"] for run in ("piu", "mine", "decayed")] == [0.01, 0.0, 0.1]
    assert {run_config(cfg, f"piu.eps_{p}")["weight_decay"] for p in ("highest", "0.5", "lowest")} == {0.0}
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert build_optimiser(params, run_config(cfg, "mine")).adamw.param_groups[0]["weight_decay"] == 0.0


def test_epsilon_constrained_runs_default_to_the_papers_adamw_betas_and_others_keep_adamws():
    # epsilon-constrained paper, Appendix E.1: AdamW with beta = (0.90, 0.95); every other run PyTorch's (0.9, 0.999)
    cfg = validate_config({"unlearning": {"runs": {"piu": {}, "mine": {"optimiser": "epsilon_constrained"},
                                                   "own": {"optimiser": "epsilon_constrained", "betas": [0.8, 0.9]}},
                                          "controllable": {"piu": {"fractions": [0.5]}}}})
    assert [run_config(cfg, run)["betas"] for run in ("piu", "mine", "own")] == [[0.9, 0.999], [0.9, 0.95], [0.8, 0.9]]
    assert {tuple(run_config(cfg, f"piu.eps_{p}")["betas"]) for p in ("highest", "0.5", "lowest")} == {(0.9, 0.95)}
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert build_optimiser(params, run_config(cfg, "mine")).adamw.param_groups[0]["betas"] == (0.9, 0.95)


def test_eupmu_alpha_follows_the_runs_lr_unless_given():
    cfg = validate_config({"unlearning": {"runs": {"fast": {"optimiser": "eupmu_fast", "lr": 3e-4},
                                                   "own": {"optimiser": "eupmu", "lr": 3e-4, "eupmu_alpha": 1e-3}}}})
    assert run_config(cfg, "fast")["eupmu_alpha"] == 3e-4 and run_config(cfg, "own")["eupmu_alpha"] == 1e-3
    assert build_optimiser([torch.nn.Parameter(torch.zeros(2))], run_config(cfg, "fast")).alpha == 3e-4


def test_bad_controllable_settings_name_the_key():
    with pytest.raises(ConfigError, match="unlearning.controllable.nope"):
        validate_config({"unlearning": {"controllable": {"nope": {"fractions": [0.5]}}}})
    with pytest.raises(ConfigError, match="fractions"):
        validate_config({"unlearning": {"controllable": {"piu": {"fractions": [1.5]}}}})
    cfg = validate_config({"unlearning": {"runs": {"piu": {}, "mine": {"epsilon_fraction": 0.5}}}})
    with pytest.raises(ConfigError, match="Phase I runs"):
        epsilon_boundary_runs(cfg, "mine")


def test_final_objective_and_phase_two_epsilon_by_hand():
    steps = np.arange(1, 21)
    highest = pd.DataFrame({"step": steps, "forget_loss": np.r_[np.full(18, 9.0), 1.0, 3.0]})  # tail mean 2
    lowest = pd.DataFrame({"step": steps[::-1], "forget_loss": np.r_[10.0, 6.0, np.full(18, 0.0)]})  # step-sorted
    assert final_objective(highest, "forget_loss") == pytest.approx(2.0)
    assert final_objective(lowest, "forget_loss") == pytest.approx(8.0)
    assert phase_two_epsilon(0.25, highest, lowest) == pytest.approx(2.0 + 0.25 * 6.0)
    assert phase_two_epsilon(0.5, lowest, highest) == pytest.approx(8.0)  # empty range: the highest boundary's f1


def test_batch_scale_takes_epsilon_from_the_relative_column_and_refuses_mixed_scales():
    steps = np.arange(1, 11)
    highest = pd.DataFrame({"step": steps, "forget_loss": 0.01, "forget_relative": np.r_[np.full(9, 0.9), 0.3]})
    lowest = pd.DataFrame({"step": steps, "forget_loss": 0.05, "forget_relative": np.r_[np.full(9, 0.2), 0.9]})
    assert bounded_column(highest) == "forget_relative" and bounded_column(highest[["step", "forget_loss"]]) == \
        "forget_loss"
    # the last tenth (one step): 0.3 and 0.9, so fraction 0.5 is 0.6, not 0.03 on f1 itself
    batch_run = {"epsilon_scale": "batch", "epsilon_fraction": 0.5}
    assert run_epsilon(batch_run, highest, lowest) == pytest.approx(0.6)
    plain = [log[["step", "forget_loss"]] for log in (highest, lowest)]
    assert run_epsilon({"epsilon_scale": "first_step", "epsilon_fraction": 0.5}, *plain) == pytest.approx(0.03)
    with pytest.raises(ValueError, match="same epsilon_scale"):
        run_epsilon(batch_run, *plain)
    with pytest.raises(ValueError, match="same epsilon_scale"):
        run_epsilon({"epsilon_scale": "first_step", "epsilon_fraction": 0.5}, highest, lowest)


def test_bound_activity_by_hand():
    # logged out of order; batch f1 first <= 0.5 at step 3; from there eta_t = 0 on steps 3, 5 (2 of 4 steps)
    log = pd.DataFrame({"step": [5, 1, 2, 3, 4, 6], "forget_loss": [0.2, 0.9, 0.7, 0.5, 0.6, 0.3],
                        "eta_t": [0.0, 1.0, 2.0, 0.0, 0.4, 0.1]})
    assert bound_activity(log, 0.5) == (3, pytest.approx(0.5))
    first, share = bound_activity(log, 0.1)  # never reached
    assert first is None and np.isnan(share)


def test_tracking_by_hand():
    from idunlearn.controllable import epsilon_spacing, tracking

    assert epsilon_spacing(["0.25", "0.5", "0.75"]) == 0.25 and epsilon_spacing([0.3]) == 0.3
    # 20 steps: f1 falls 1.0, 0.9, ..., crosses epsilon 0.5 at step 6, dips to 0.3 (steps 8-10), ends at 0.45
    f1 = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.3, 0.3, 0.35, 0.35, 0.4, 0.4, 0.4, 0.4, 0.45, 0.45, 0.45, 0.45]
    log = pd.DataFrame({"step": np.arange(1, 21), "forget_relative": f1, "eta_t": [1.0] * 6 + [0.0] * 14})
    tracked = tracking(log, epsilon=0.5, column="forget_relative", spacing=0.2)
    # end: mean of the last 10% (2 steps) 0.45, gap -0.05 / 0.2; lowest tenth from step 6 on: steps 9-10, 0.3
    assert tracked["bound_gap_spacings"] == pytest.approx(-0.25)
    assert tracked["overshoot_spacings"] == pytest.approx(-1.0)
    assert tracked["first_step_at_bound"] == 6 and tracked["bound_idle_share"] == pytest.approx(14 / 15)
    never = tracking(log, epsilon=0.1, column="forget_relative", spacing=0.2)
    assert never["first_step_at_bound"] is None and np.isnan(never["overshoot_spacings"])


def test_pareto_table_summary_and_figure():
    points = {"piu": [("highest", "piu.eps_highest"), ("0.5", "piu.eps_0.5"), ("lowest", "piu.eps_lowest")]}
    metrics, losses = [], {}
    for rank, (_, run) in enumerate(points["piu"]):
        for ident in (3, 5):
            metrics.append({"run": run, "forget_identity": ident, **{m: 0.1 * rank + 0.01 * ident for m in PARETO_METRICS}})
            losses[(run, ident)] = pd.DataFrame({"step": [1, 2], "forget_loss": [9.0, 1.0 + rank],
                                                 "retain_loss": [0.0, 2.0 - rank], "eta_t": [1.0, 0.0]})
    table = pareto_table(points, pd.DataFrame(metrics), losses, {"piu": 1.5})
    assert len(table) == 6 and table["f1_forget"].tolist() == [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
    # Phase II's bound at fraction 0.5 of [f1(highest), f1(lowest)] = [1, 3] (last step of two: 10% rounds to 1)
    np.testing.assert_array_equal(table["epsilon"], [np.nan, 2.0, np.nan, np.nan, 2.0, np.nan])
    assert (table["f1_range"] == 2.0).all() and not table["degenerate"].any()
    # Phase II ends at its bound (f1 2.0 at the last step), first reached at step 2, where eta_t = 0
    phase_two = table[table["point"] == "0.5"]
    assert (phase_two["bound_gap_spacings"] == 0.0).all() and (phase_two["first_step_at_bound"] == 2).all()
    assert (phase_two["bound_idle_share"] == 1.0).all() and table.loc[table["point"] != "0.5", "bound_gap_spacings"].isna().all()
    # a range within the tolerance is a degenerate front: flagged, and the table is still written
    assert pareto_table(points, pd.DataFrame(metrics), losses, {"piu": 2.0})["degenerate"].all()
    # per-sample counts: every point's identity 3 forgets all 4 forget samples and keeps all 4 retain samples,
    # identity 5 keeps 1 of 4 forget and 3 of 4 retain samples
    counts = pd.DataFrame([{"run": run, "phase": "after", "forget_identity": ident, "forget_n": 4, "retain_n": 4,
                            "forget_hits": {3: 0, 5: 1}[ident], "retain_hits": {3: 4, 5: 3}[ident]}
                           for _, run in points["piu"] for ident in (3, 5)])
    summary = pareto_summary(table, counts, seed=0)
    # SRK = Acc_R / (Acc_U + 0.01) on the pooled counts (PIU eqs. 8-10), not the mean of per-identity SRKs
    assert summary["srk_after"].tolist() == pytest.approx([(7 / 8) / (1 / 8 + 0.01)] * 3)
    assert (summary["srk_after_ci_low"] <= summary["srk_after"]).all()
    assert (summary["srk_after"] <= summary["srk_after_ci_high"]).all()
    assert (summary["n_degenerate"] == 0).all()
    assert summary["point"].tolist() == ["highest", "0.5", "lowest"]
    assert summary["ism_forget_after_mean"].tolist() == pytest.approx([0.04, 0.14, 0.24])
    assert summary["epsilon_mean"].iloc[1] == 2.0 and summary["epsilon_mean"].iloc[[0, 2]].isna().all()
    assert summary["ism_forget_rank_spearman"].iloc[0] > 0.8  # forget ISM rises as completeness falls
    fig = pareto_figure(table, summary)
    assert len(fig.axes) == 2

