"""Kernel Distance (KD) between two feature sets, the realism measure of PIU section 4 (Delta KD in its tables).

It follows dgm-eval's kernel distance, i.e. KID (Binkowski et al. 2018, "Demystifying MMD GANs"): a cubic
polynomial kernel, the unbiased MMD^2 estimator, averaged over random equal-size subsets of the two sets."""

from __future__ import annotations

import numpy as np


def polynomial_kernel(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kernel matrix k(x_i, y_j) over all row pairs, in float64."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    # k(x, y) = (x.y / d + 1)^3, the KID kernel (Binkowski et al. 2018; dgm-eval: degree 3, gamma 1/d, coef0 1)
    return (x @ y.T / x.shape[1] + 1.0) ** 3


def mmd2_unbiased(features_a: np.ndarray, features_b: np.ndarray) -> float:
    """Unbiased MMD^2 between all rows of ``features_a`` (n, d) and ``features_b`` (m, d); n, m >= 2.

    It can be slightly negative when the two sets come from the same distribution."""
    n, m = len(features_a), len(features_b)
    if n < 2 or m < 2:
        raise ValueError(f"the unbiased MMD^2 needs at least 2 samples per set, got {n} and {m}")
    k_aa = polynomial_kernel(features_a, features_a)
    k_bb = polynomial_kernel(features_b, features_b)
    k_ab = polynomial_kernel(features_a, features_b)
    # MMD^2_u = sum_{i!=j} k(a_i,a_j)/(n(n-1)) + sum_{i!=j} k(b_i,b_j)/(m(m-1)) - 2 sum_{i,j} k(a_i,b_j)/(nm)
    # (unbiased estimator of Gretton et al. 2012, Lemma 6, as used by KID, Binkowski et al. 2018)
    within_a = (k_aa.sum() - np.trace(k_aa)) / (n * (n - 1))
    within_b = (k_bb.sum() - np.trace(k_bb)) / (m * (m - 1))
    return float(within_a + within_b - 2.0 * k_ab.mean())


def kernel_distance(features_a: np.ndarray, features_b: np.ndarray, num_subsets: int = 100,
                    max_subset_size: int = 1000, seed: int = 0) -> float:
    """KD: mean unbiased MMD^2 over ``num_subsets`` pairs of subsets, each of min(max_subset_size, n, m) rows
    drawn without replacement from each set (numpy default_rng(seed)).

    When the subset size equals both set sizes every subset is a permutation of the full set, so the result is the
    single full-set estimate. Swapping the arguments swaps which set gets which random draw, so KD is exactly
    symmetric only in that full-set case; otherwise the two orders agree up to subsampling noise."""
    a = np.asarray(features_a, np.float64)
    b = np.asarray(features_b, np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"expected two (n, d) feature arrays of equal d, got shapes {a.shape} and {b.shape}")
    size = min(max_subset_size, len(a), len(b))
    rng = np.random.default_rng(seed)
    # KD = mean over subsets of MMD^2_u(subset of a, subset of b) (dgm-eval kernel distance / KID subset averaging)
    estimates = [
        mmd2_unbiased(a[rng.choice(len(a), size, replace=False)], b[rng.choice(len(b), size, replace=False)])
        for _ in range(num_subsets)
    ]
    return float(np.mean(estimates))
