import numpy as np
import pytest

from idunlearn.evaluation.kernel import kernel_distance, mmd2_unbiased, polynomial_kernel

# d = 2, so k(x, y) = (x.y / 2 + 1)^3
A = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
B = np.array([[1.0, 1.0], [2.0, 0.0]])


def test_polynomial_kernel_by_hand():
    # x.y = 1*1 + 0*1 = 1 -> 1.5^3; x.y = 2 -> 2^3; x.y = 0 -> 1
    np.testing.assert_allclose(polynomial_kernel(A[1:], B), [[3.375, 8.0], [3.375, 1.0]])


def test_mmd2_unbiased_by_hand_3x2_vs_2x2():
    # A-A off-diagonal pairs: all dot products 0 -> k = 1; 6 ordered pairs / (3*2)        = 1
    # B-B off-diagonal pairs: (1,1).(2,0) = 2 -> k = 8; 2 ordered pairs / (2*1)            = 8
    # A-B, all 6 pairs: a0 -> 1, 1; a1 -> 3.375, 8; a2 -> 3.375, 1; sum 17.75 / (3*2)      = 17.75 / 6
    expected = 1.0 + 8.0 - 2.0 * 17.75 / 6.0  # = 37 / 12
    assert mmd2_unbiased(A, B) == pytest.approx(expected)
    assert mmd2_unbiased(B, A) == pytest.approx(expected)


def test_kernel_distance_by_hand_2x2_vs_2x2():
    # A[:2] = (0,0), (1,0): within 2*1 / 2 = 1; B within 8; cross 1 + 1 + 3.375 + 8 = 13.375 over 4 pairs.
    # Every subset of size 2 is a permutation of the full set, so all subsets give the same value.
    expected = 1.0 + 8.0 - 2.0 * 13.375 / 4.0  # = 37 / 16
    assert kernel_distance(A[:2], B, num_subsets=5) == pytest.approx(expected)


def test_full_size_subsets_equal_the_single_full_estimate_and_are_symmetric():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((30, 4)), rng.standard_normal((30, 4)) + 0.3
    full = mmd2_unbiased(a, b)
    assert kernel_distance(a, b, num_subsets=7, max_subset_size=30) == pytest.approx(full)
    assert kernel_distance(a, b, num_subsets=3, max_subset_size=1000) == pytest.approx(full)  # capped at n
    assert kernel_distance(b, a, num_subsets=3) == pytest.approx(full)


def test_subsampled_kd_is_symmetric_up_to_noise_and_reproducible():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((400, 8)), rng.standard_normal((400, 8)) + 0.5
    ab = kernel_distance(a, b, num_subsets=20, max_subset_size=200)
    assert kernel_distance(b, a, num_subsets=20, max_subset_size=200) == pytest.approx(ab, rel=0.1)
    assert kernel_distance(a, b, num_subsets=20, max_subset_size=200) == ab


def test_identical_distributions_near_zero_and_shift_clearly_positive():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((1500, 8)), rng.standard_normal((1500, 8))
    same = kernel_distance(a, b, num_subsets=5, max_subset_size=1000)
    shifted = kernel_distance(a, b + 1.0, num_subsets=5, max_subset_size=1000)
    assert shifted > 1.0
    assert abs(same) < 0.01 * shifted


def test_rejects_mismatched_or_too_small_inputs():
    with pytest.raises(ValueError):
        kernel_distance(np.zeros((5, 3)), np.zeros((5, 4)))
    with pytest.raises(ValueError):
        kernel_distance(np.zeros((1, 3)), np.zeros((5, 3)))
