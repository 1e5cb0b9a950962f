import math

import numpy as np
import pandas as pd
import pytest

from idunlearn.evaluation.identity import accuracy, srk
from idunlearn.evaluation.statistics import (bootstrap_mean, bootstrap_pooled, difference_upper_bound,
                                             equivalence_power, equivalence_samples, holm, mean_ci, mean_difference,
                                             newcombe_interval, paired_differences, pooled_difference, pooled_srk,
                                             sample_counts, verdict, wilcoxon_p)


def samples(forget_identity: int, forget_hits: int, retain_hits: int, n: int = 4) -> pd.DataFrame:
    """A per-sample table: n forget samples of ``forget_identity`` and n retain samples of identity 100; the first
    ``*_hits`` of each kind are predicted as their own identity, the rest as identity 999."""
    kind = ["forget"] * n + ["retain"] * n
    target = [forget_identity] * n + [100] * n
    predicted = [t if (i % n) < (forget_hits if k == "forget" else retain_hits) else 999
                 for i, (k, t) in enumerate(zip(kind, target))]
    return pd.DataFrame({"kind": kind, "target_identity": target, "predicted_identity": predicted})


def counts_of(tables: dict[int, pd.DataFrame]) -> pd.DataFrame:
    return pd.DataFrame([sample_counts(t) for t in tables.values()], index=list(tables))


def test_pooled_srk_differs_from_the_mean_of_per_identity_ratios():
    # identity 1: Acc_U 0/4, Acc_R 4/4 -> SRK 1 / 0.01 = 100; identity 2: Acc_U 2/4, Acc_R 2/4 -> 0.5 / 0.51
    tables = {1: samples(1, forget_hits=0, retain_hits=4), 2: samples(2, forget_hits=2, retain_hits=2)}
    assert sample_counts(tables[2]) == {"forget_n": 4, "forget_hits": 2, "retain_n": 4, "retain_hits": 2}
    per_identity = [srk(accuracy(t.loc[t.kind == "retain", "predicted_identity"], t.loc[t.kind == "retain",
                                                                                       "target_identity"]),
                        accuracy(t.loc[t.kind == "forget", "predicted_identity"], t.loc[t.kind == "forget",
                                                                                        "target_identity"]))
                    for t in tables.values()]
    assert per_identity == pytest.approx([100.0, 0.5 / 0.51])
    assert np.mean(per_identity) == pytest.approx(50.490196, rel=1e-6)
    # pooled (PIU eqs. 8-10): Acc_U = 2/8, Acc_R = 6/8, SRK = 0.75 / 0.26
    assert pooled_srk(counts_of(tables).sum()) == pytest.approx(0.75 / 0.26)
    assert pooled_srk(counts_of(tables).sum()) == pytest.approx(2.884615, rel=1e-6)


def test_bootstrap_over_identities_takes_the_pooled_ratio_of_resampled_identities():
    counts = counts_of({1: samples(1, 0, 4), 2: samples(2, 2, 2)})
    value, low, high = bootstrap_pooled(counts, pooled_srk, seed=0)
    # a resample of two identities is {1, 1} (SRK 100), {1, 2} (2.885) or {2, 2} (0.980), each end with chance
    # 1/4 > 2.5%, so the percentile interval spans exactly the two single-identity SRKs
    assert value == pytest.approx(0.75 / 0.26)
    assert (low, high) == pytest.approx((0.5 / 0.51, 100.0))
    assert bootstrap_pooled(counts, pooled_srk, seed=0) == bootstrap_pooled(counts, pooled_srk, seed=0)
    # identities that all agree leave no spread; one identity leaves no interval
    same = counts_of({i: samples(i, 1, 3) for i in range(5)})
    assert bootstrap_pooled(same, pooled_srk, seed=1) == pytest.approx((0.75 / 0.26,) * 3)
    single = bootstrap_pooled(counts.iloc[:1], pooled_srk, seed=0)
    assert single[0] == pytest.approx(100.0) and math.isnan(single[1]) and math.isnan(single[2])


def test_pooled_difference_pairs_identities_present_in_both():
    a = counts_of({1: samples(1, 4, 4), 2: samples(2, 4, 4), 3: samples(3, 4, 4)})  # SRK 1 / 1.01
    b = counts_of({2: samples(2, 0, 4), 3: samples(3, 2, 4), 4: samples(4, 0, 0)})
    n, value, low, high = pooled_difference(a, b, pooled_srk, seed=0)
    # shared identities 2 and 3: b pools Acc_U 2/8, Acc_R 8/8 -> 1 / 0.26; a -> 1 / 1.01
    assert n == 2 and value == pytest.approx(1 / 0.26 - 1 / 1.01)
    assert (low, high) == pytest.approx((1 / 0.51 - 1 / 1.01, 100.0 - 1 / 1.01))


def test_bootstrap_mean_by_hand_and_inside_the_range_of_a_rate():
    # two identities, rates 0 and 1: resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the 2.5% and
    # 97.5% quantiles of 2000 resamples are 0 and 1 (each end has ~500 resamples)
    assert bootstrap_mean([0.0, 1.0, np.nan], seed=0) == (0.5, 0.0, 1.0)
    # detection rates near 1: the t interval passes 1, the bootstrap interval stays within [0.75, 1]
    rates = [1.0, 1.0, 1.0, 0.75]
    mean, half = mean_ci(rates)
    assert mean + half > 1.0
    value, low, high = bootstrap_mean(rates, seed=0)
    assert value == pytest.approx(0.9375) and 0.75 <= low < value < high <= 1.0
    assert all(math.isnan(v) for v in bootstrap_mean([np.nan], seed=0))
    assert bootstrap_mean([0.3], seed=0)[0] == 0.3 and math.isnan(bootstrap_mean([0.3], seed=0)[1])


def test_mean_difference_by_hand():
    a = pd.Series([0.5, 0.5, 0.5, 0.5, 9.0], index=[1, 2, 3, 4, 5])
    b = pd.Series([1.5, 2.5, 3.5, 4.5, np.nan], index=[1, 2, 3, 4, 5])
    diffs = paired_differences(a, b)
    assert diffs.index.tolist() == [1, 2, 3, 4] and diffs.tolist() == [1.0, 2.0, 3.0, 4.0]
    out = mean_difference(diffs, seed=0)
    # t interval: 2.5 +- t_{0.975,3} sd / sqrt(4) = 2.5 +- 3.182446 * 1.290994 / 2
    assert out["n"] == 4 and out["mean_diff"] == pytest.approx(2.5)
    assert (out["t_low"], out["t_high"]) == pytest.approx((2.5 - 2.05426, 2.5 + 2.05426), abs=1e-5)
    # bootstrap means of four values lie between 1 and 4, and around 2.5
    assert 1.0 <= out["boot_low"] < 2.5 < out["boot_high"] <= 4.0
    # exact two-sided signed-rank p with all 4 differences positive: 2 / 2^4
    assert out["p_wilcoxon"] == pytest.approx(2 / 16)


def test_wilcoxon_exact_and_degenerate_cases():
    assert wilcoxon_p(np.arange(1, 13)) == pytest.approx(2 / 2 ** 12)
    # one-sided in the claimed direction: half of that, or 1 when every difference goes the other way
    assert wilcoxon_p(np.arange(1, 13), +1) == pytest.approx(1 / 2 ** 12)
    assert wilcoxon_p(np.arange(1, 13), -1) == pytest.approx(1.0)
    assert wilcoxon_p(np.zeros(6)) == 1.0  # no difference at all: no evidence of an effect
    assert math.isnan(wilcoxon_p([0.3]))  # one identity cannot be tested
    assert math.isnan(wilcoxon_p([]))


def test_holm_step_down_by_hand():
    # sorted 0.01, 0.03, 0.04 times 3, 2, 1 = 0.03, 0.06, 0.04 -> running max 0.03, 0.06, 0.06; NaN not counted
    assert np.allclose(holm([0.01, 0.04, 0.03, np.nan]), [0.03, 0.06, 0.06, np.nan], equal_nan=True)
    assert np.allclose(holm([0.5, 0.6]), [1.0, 1.0])
    assert holm([]).size == 0


def test_holm_on_a_published_example():
    # Wikipedia's Holm-Bonferroni example (four hypotheses, alpha 0.05): p1 0.01, p2 0.04, p3 0.03, p4 0.005; the
    # procedure rejects H4 and H1 and stops at H3 (0.03 > 0.05 / 2). Adjusted: 4 x 0.005, 3 x 0.01, then the running
    # maximum of 2 x 0.03 and 1 x 0.04
    adjusted = holm([0.01, 0.04, 0.03, 0.005])
    assert np.allclose(adjusted, [0.03, 0.06, 0.06, 0.02])
    assert list(adjusted < 0.05) == [True, False, False, True]


# Newcombe (1998), Statistics in Medicine 17:873-890, Table II, method 10 (hybrid score), 95% intervals
NEWCOMBE_TABLE_II = [((56, 70, 48, 80), (0.0524, 0.3339)), ((9, 10, 3, 10), (0.1705, 0.8090)),
                     ((5, 56, 0, 29), (-0.0381, 0.1926)), ((0, 10, 0, 20), (-0.1611, 0.2775)),
                     ((10, 10, 0, 20), (0.6791, 1.0000))]


def test_newcombe_hybrid_score_interval_reproduces_newcombes_table():
    for counts, published in NEWCOMBE_TABLE_II:
        assert np.allclose(newcombe_interval(*counts, z=1.959964), published, atol=5e-5), counts
        # each end of the two-sided 95% interval is a one-sided 97.5% bound
        assert difference_upper_bound(*counts, confidence=0.975) == pytest.approx(published[1], abs=5e-5)


def test_equivalence_power_agrees_with_simulation():
    rng = np.random.default_rng(7)
    draws = 40_000
    for n, rate, margin in ((8, 0.3, 0.4), (42, 0.021, 0.1), (60, 0.2, 0.15)):
        run, reference = rng.binomial(n, rate, draws), rng.binomial(n, rate, draws)
        simulated = np.mean(difference_upper_bound(run, n, reference, n) <= margin)
        exact = equivalence_power(n, rate, margin)
        assert abs(simulated - exact) < 4 * np.sqrt(exact * (1 - exact) / draws) + 1e-3, (n, rate, simulated, exact)


def test_equivalence_sample_size_by_hand():
    # both arms at rate 0: every draw is 0 of n, whose bound is the Wilson upper end z^2 / (n + z^2); it reaches the
    # margin 0.1 from n = z^2 (1 - 0.1) / 0.1 = 1.6449^2 x 9 = 24.35, so 25 samples per arm, with power 1
    assert equivalence_samples(0.0, 0.1) == 25
    assert equivalence_power(24, 0.0, 0.1) == 0.0 and equivalence_power(25, 0.0, 0.1) == 1.0
    # at rate 0.3 the normal approximation for a non-inferiority test of two proportions (Blackwelder 1982):
    # n = (z_0.95 + z_0.8)^2 x 2 p (1 - p) / margin^2 = (1.6449 + 0.8416)^2 x 0.42 / 0.01 = 259.7
    needed = equivalence_samples(0.3, 0.1)
    assert abs(needed - 259.7) / 259.7 < 0.05
    assert equivalence_power(needed, 0.3, 0.1) >= 0.8 > equivalence_power(needed - 1, 0.3, 0.1)
    with pytest.raises(ValueError, match="margin"):
        equivalence_samples(0.2, 0.0)


def test_verdict_needs_direction_and_corrected_significance():
    assert verdict(0.2, 0.01, +1) == (True, True)
    assert verdict(0.2, 0.2, +1) == (True, False)
    assert verdict(-0.2, 0.01, +1) == (False, False)
    assert verdict(-0.2, 0.01, -1) == (True, True)
    assert verdict(0.0, 0.01, +1) == (False, False)
    assert verdict(0.2, float("nan"), +1) == (True, False)
