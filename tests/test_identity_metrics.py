import numpy as np
import pytest

from idunlearn.evaluation.identity import accuracy, identity_similarity, ism, nearest_centroid, srk


def test_ism_by_hand_with_an_undetected_sample():
    emb = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 0.0]])
    cents = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 0.0]])
    detected = np.array([True, True, False])
    # cosines: 1.0, 0.8, undetected -> 0; ISM = 1.8 / 3 (PIU eq. 7, no-face samples count 0)
    np.testing.assert_allclose(identity_similarity(emb, cents, detected), [1.0, 0.8, 0.0])
    assert ism(emb, cents, detected) == pytest.approx(0.6)


def test_nearest_centroid_accuracy_and_srk_by_hand():
    ids = np.array([7, 8, 9])
    cents = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    emb = np.array([[0.9, 0.1], [0.1, 0.9], [-0.5, -0.4], [0.2, 0.1]])
    pred = nearest_centroid(emb, ids, cents, np.array([True, True, True, False]))
    assert pred.tolist() == [7, 8, 9, -1]
    assert accuracy(pred, [7, 8, 8, 7]) == 0.5  # the undetected sample is wrong
    # SRK = Acc_R / (Acc_U + 0.01) (PIU eq. 10)
    assert srk(0.8, 0.0) == pytest.approx(80.0)
    assert srk(0.5, 0.49) == pytest.approx(1.0)
