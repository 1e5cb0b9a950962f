"""The statistics behind every reported number and verdict: pooled identity metrics (PIU eqs. 8-10), identity-
bootstrap and Student-t intervals, and paired comparisons of two runs on the same forget identities (Wilcoxon signed-rank
test in the claimed direction, Holm correction across the claims of one table), and the equivalence test of two
attack success proportions behind the audit's *removed* verdict (Newcombe's hybrid score interval) with its power and
the samples per arm it needs.

The unit of resampling is the forget identity: samples of one identity share its conditions and its unlearned model,
so they are not independent draws. NaN means "not measured" and is left out."""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import pandas as pd
from scipy import stats

from .identity import srk

N_BOOTSTRAP = 2000  # identity resamples per bootstrap interval
CONFIDENCE = 0.95
ALPHA = 0.05  # level at which a (Holm-corrected) test "establishes" a claim
COUNT_COLUMNS = ["forget_n", "forget_hits", "retain_n", "retain_hits"]

Statistic = Callable[[Mapping[str, np.ndarray]], np.ndarray]


def mean_ci(values, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Mean and half width of its two-sided Student-t confidence interval, over the non-NaN ``values``
    (NaN half width below two values)."""
    x = np.asarray(values, np.float64).ravel()
    x = x[~np.isnan(x)]
    mean = float(x.mean()) if len(x) else float("nan")
    if len(x) < 2:
        return mean, float("nan")
    # Student-t interval: half width = t_{(1 + confidence)/2, n-1} * s / sqrt(n), s the sample sd (ddof = 1)
    half_width = stats.t.ppf((1.0 + confidence) / 2.0, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return mean, float(half_width)


def sample_counts(samples: pd.DataFrame) -> dict:
    """One evaluation's per-sample table (``kind``, ``target_identity``, ``predicted_identity``) reduced to the
    numerators and denominators of Acc_U and Acc_R: ``forget_n``, ``forget_hits``, ``retain_n``, ``retain_hits``."""
    hits = samples["predicted_identity"].to_numpy() == samples["target_identity"].to_numpy()
    out = {}
    for kind in ("forget", "retain"):
        mask = (samples["kind"] == kind).to_numpy()
        out[f"{kind}_n"], out[f"{kind}_hits"] = int(mask.sum()), int(hits[mask].sum())
    return out


def pooled_srk(sums: Mapping[str, np.ndarray]) -> np.ndarray:
    """SRK of pooled counts (sums of ``sample_counts`` over identities; arrays give one SRK per entry)."""
    # PIU eqs. 8-10: Acc_U and Acc_R over all forget / retain samples of all forget identities, then one ratio
    return srk(np.divide(sums["retain_hits"], sums["retain_n"]), np.divide(sums["forget_hits"], sums["forget_n"]))


def bootstrap_pooled(table: pd.DataFrame, statistic: Statistic, seed: int, n_boot: int = N_BOOTSTRAP,
                     confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """A pooled statistic and its percentile bootstrap interval over identities. ``table``: one row per identity of
    additive quantities (counts, sums); ``statistic``: column -> column sums (scalars, or arrays over resamples) to
    the statistic. Identities are resampled with replacement and the statistic recomputed on the resampled sums.
    Returns (value, low, high); the interval is NaN below two identities."""
    columns = {c: table[c].to_numpy(np.float64) for c in table.columns}
    value = float(statistic({c: v.sum() for c, v in columns.items()}))
    if len(table) < 2:
        return value, float("nan"), float("nan")
    picks = np.random.default_rng(seed).integers(0, len(table), size=(n_boot, len(table)))
    replicates = np.asarray(statistic({c: v[picks].sum(axis=1) for c, v in columns.items()}), np.float64)
    # percentile bootstrap interval (Efron and Tibshirani 1993, ch. 13)
    low, high = np.quantile(replicates, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return value, float(low), float(high)


def _prefixed(sums: Mapping[str, np.ndarray], prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in sums.items() if k.startswith(prefix)}


def pooled_difference(a: pd.DataFrame, b: pd.DataFrame, statistic: Statistic, seed: int,
                      n_boot: int = N_BOOTSTRAP) -> tuple[int, float, float, float]:
    """statistic(b) - statistic(a) on the identities (index) both tables have, with a paired bootstrap interval:
    each resample draws identities once and takes both tables' rows of them. Returns (n, value, low, high)."""
    both = a.index.intersection(b.index)
    joined = pd.concat([a.loc[both].add_prefix("a."), b.loc[both].add_prefix("b.")], axis=1)
    value, low, high = bootstrap_pooled(
        joined, lambda s: statistic(_prefixed(s, "b.")) - statistic(_prefixed(s, "a.")), seed, n_boot)
    return len(both), value, low, high


def paired_differences(a: pd.Series, b: pd.Series) -> pd.Series:
    """b - a per forget identity (index), over the identities where both are measured."""
    both = a.dropna().index.intersection(b.dropna().index).sort_values()
    return b.loc[both] - a.loc[both]


def wilcoxon_p(differences, direction: int = 0) -> float:
    """Wilcoxon signed-rank p-value of paired differences: one-sided in ``direction`` (+1: they tend to be positive,
    -1: negative), two-sided for 0. All differences zero: 1.0 (no evidence of any effect; scipy would fail); fewer
    than two: NaN (untestable)."""
    d = np.asarray(differences, np.float64)
    if len(d) < 2:
        return float("nan")
    if not np.any(d != 0):
        return 1.0
    alternative = {1: "greater", -1: "less", 0: "two-sided"}[direction]
    # Wilcoxon (1945) signed-rank test; zero differences dropped (zero_method "wilcox"), exact for small n
    return float(stats.wilcoxon(d, alternative=alternative).pvalue)


def bootstrap_mean(values, seed: int, n_boot: int = N_BOOTSTRAP) -> tuple[float, float, float]:
    """Mean of the non-NaN ``values`` (one per identity) and its percentile bootstrap interval over identities.
    The interval lies within the values' range, so a rate keeps its bounds (a Student-t interval of a rate near 1
    can pass 1). Returns (mean, low, high); NaN where nothing is measured, the interval NaN below two values."""
    x = np.asarray(values, np.float64).ravel()
    x = x[~np.isnan(x)]
    if not len(x):
        return float("nan"), float("nan"), float("nan")
    return bootstrap_pooled(pd.DataFrame({"value": x, "n": 1.0}), lambda s: s["value"] / s["n"], seed, n_boot)


def mean_difference(differences: pd.Series, seed: int, direction: int = 0, n_boot: int = N_BOOTSTRAP) -> dict:
    """Mean of paired differences with its bootstrap and Student-t 95% intervals, and the Wilcoxon p-value
    (one-sided in ``direction``, see ``wilcoxon_p``)."""
    mean, boot_low, boot_high = bootstrap_mean(differences, seed, n_boot)
    _, half = mean_ci(differences)
    return {"n": len(differences), "mean_diff": mean, "boot_low": boot_low, "boot_high": boot_high,
            "t_low": mean - half, "t_high": mean + half, "p_wilcoxon": wilcoxon_p(differences, direction)}


def paired_with(values: pd.Series, run: str, other: str | None, seed: int) -> dict:
    """``run`` - ``other`` per identity (``values`` indexed by run and forget identity), as ``mean_difference`` with
    the other run's name; empty without the other run, with the run itself or without shared identities."""
    runs = set(values.index.get_level_values("run"))
    if other is None or other == run or other not in runs:
        return {}
    differences = paired_differences(values.loc[other], values.loc[run])
    return {"run": other, **mean_difference(differences, seed)} if len(differences) else {}


def holm(pvalues) -> np.ndarray:
    """Holm-adjusted p-values of one family of tests; NaN (untestable) entries stay NaN and are not counted."""
    p = np.asarray(pvalues, np.float64)
    out = np.full(p.shape, np.nan)
    tested = np.flatnonzero(~np.isnan(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    m = len(order)
    # Holm (1979) step-down: the i-th smallest p (i = 0..m-1) times (m - i), running maximum, capped at 1
    out[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    return out


def verdict(effect: float, p_corrected: float, direction: int, alpha: float = ALPHA) -> tuple[bool, bool]:
    """(holds in direction, established): the effect has the claimed sign (``direction`` +1: b > a, -1: b < a);
    established only if it also does so with a corrected p-value below ``alpha``."""
    holds = bool(np.sign(effect) == direction)
    return holds, bool(holds and p_corrected < alpha)


def wilson_interval(hits, n, z: float) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of a binomial proportion hits / n at normal quantile ``z`` (arrays broadcast)."""
    hits, n = np.asarray(hits, np.float64), np.asarray(n, np.float64)
    p = hits / n
    # Wilson (1927): (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    centre, spread = p + z ** 2 / (2 * n), z * np.sqrt(p * (1 - p) / n + z ** 2 / (4 * n ** 2))
    return (centre - spread) / (1 + z ** 2 / n), (centre + spread) / (1 + z ** 2 / n)


def newcombe_interval(hits, n, base_hits, base_n, z: float) -> tuple[np.ndarray, np.ndarray]:
    """Interval of the difference of proportions hits / n - base_hits / base_n: Newcombe's hybrid score interval
    (Newcombe 1998, method 10) at normal quantile ``z`` (1.96: two-sided 95%; 1.645: each end a one-sided 95%
    bound). Arrays broadcast."""
    low, high = wilson_interval(hits, n, z)
    base_low, base_high = wilson_interval(base_hits, base_n, z)
    p, base = np.asarray(hits, np.float64) / n, np.asarray(base_hits, np.float64) / base_n
    # Newcombe (1998) eq. for method 10: L = d - sqrt((p1 - l1)^2 + (u2 - p2)^2), U = d + sqrt((u1 - p1)^2 + (p2 - l2)^2)
    return (p - base - np.sqrt((p - low) ** 2 + (base_high - base) ** 2),
            p - base + np.sqrt((high - p) ** 2 + (base - base_low) ** 2))


def difference_upper_bound(hits, n, base_hits, base_n, confidence: float = CONFIDENCE) -> np.ndarray:
    """One-sided ``confidence`` upper bound of hits / n - base_hits / base_n (Newcombe's hybrid score interval's
    upper end at z = the ``confidence`` normal quantile)."""
    return newcombe_interval(hits, n, base_hits, base_n, float(stats.norm.ppf(confidence)))[1]


def equivalence_power(n: int, rate: float, margin: float, confidence: float = CONFIDENCE) -> float:
    """Exact probability that the equivalence test (``difference_upper_bound`` <= ``margin``) shows equivalence when
    both arms draw ``n`` samples at the same true ``rate``: the sum over every pair of binomial outcomes."""
    hits = np.arange(n + 1)
    weights = stats.binom.pmf(hits, n, rate)
    shown = difference_upper_bound(hits[:, None], n, hits[None, :], n, confidence) <= margin + 1e-12
    return float(weights @ shown @ weights)


def equivalence_samples(rate: float, margin: float, power: float = 0.8, confidence: float = CONFIDENCE,
                        largest: int = 2000) -> int:
    """The fewest samples per arm at which ``equivalence_power`` reaches ``power`` (both arms at the true ``rate``,
    the assumption under which a removed model should be called removed). Raises when ``largest`` is not enough."""
    if not 0 <= rate <= 1 or not 0 < margin < 1:
        raise ValueError(f"equivalence sample size: rate must lie in [0, 1] and margin in (0, 1) "
                         f"(got rate {rate}, margin {margin})")
    for n in range(1, largest + 1):
        if equivalence_power(n, rate, margin, confidence) >= power:
            return n
    raise ValueError(f"equivalence at margin {margin} with power {power} needs more than {largest} samples per arm "
                     f"at rate {rate}: widen the margin (audit.verdict.equivalence_margin)")
