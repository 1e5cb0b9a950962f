"""U-LiRA and GSUO's SVM/loss attack (recognizer track): the balanced draw, the likelihood-ratio accuracy, the attack
on synthetic observations whose answer is known, the SVM's success rate moving the way it must, the config checks,
and one tiny U-LiRA job end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from idunlearn.config import ConfigError, validate_config
from idunlearn.recognizer import ulira
from idunlearn.recognizer.data import random_forget_set
from idunlearn.recognizer.mia import (attack_auc, balanced_pair, lira_scores, llr_accuracy, shadow_memberships,
                                      svm_loss_attack)

from test_recognizer import _tiny_world

torch.set_num_threads(1)


def test_balanced_pair_has_equal_counts_and_is_seeded():
    pos, neg = balanced_pair(28, 121, seed=5)
    assert len(pos) == len(neg) == 28 and np.array_equal(pos, np.arange(28))
    assert len(set(neg)) == 28 and neg.max() < 121 and np.all(np.diff(neg) > 0)
    assert np.array_equal(neg, balanced_pair(28, 121, seed=5)[1])
    assert not np.array_equal(neg, balanced_pair(28, 121, seed=6)[1])
    assert [len(s) for s in balanced_pair(9, 4, seed=0)] == [4, 4]


def test_llr_score_and_accuracy_by_hand():
    # forgotten {1, 3} (mean 2), unseen {-1, 1} (mean 0), pooled sd 1; phi = 0.5:
    # log N(0.5; 2, 1) - log N(0.5; 0, 1) = (-(1.5)^2 + 0.5^2) / 2 = -1
    forgotten = np.array([[True], [True], [False], [False]])
    score = lira_scores(np.array([0.5]), forgotten, np.array([[1.0], [3.0], [-1.0], [1.0]]))
    assert score[0] == pytest.approx(-1.0)
    # members: 2 of 3 above 0; non-members: 1 of 3 at or below 0 -> (2/3 + 1/3) / 2
    assert llr_accuracy(np.array([1.0, 2.0, -1.0]), np.array([0.0, 3.0, 4.0])) == pytest.approx(0.5)
    assert llr_accuracy(np.array([1.0]), np.array([-1.0])) == 1.0 and math.isnan(llr_accuracy(np.array([]), [1.0]))


def _attack(shift: float, seed: int = 0):
    """A pool of 40 forget images and 40 unseen ones, 8 shadows (each image forgotten in 4, unseen in 4); the
    forgotten state's phi sits ``shift`` above the unseen one, and the target behaves like a shadow."""
    rng = np.random.default_rng(seed)
    n, k = 80, 8
    forgotten = shadow_memberships(n, k, seed)
    base = rng.normal(0, 3, n)  # per-image difficulty
    shadow_phi = base + shift * forgotten + rng.normal(0, 0.3, (k, n))
    target_phi = base + shift * (np.arange(n) < 40) + rng.normal(0, 0.3, n)
    scores = lira_scores(target_phi, forgotten, shadow_phi)
    return attack_auc(scores[:40], scores[40:]), llr_accuracy(scores[:40], scores[40:])


def test_ulira_separates_separated_states_and_not_identical_ones():
    auc, acc = _attack(shift=3.0)
    assert auc > 0.99 and acc > 0.95
    aucs = [_attack(shift=0.0, seed=s)[0] for s in range(5)]
    assert abs(np.mean(aucs) - 0.5) < 0.1


def test_svm_asr_moves_with_how_member_like_the_forget_losses_are():
    rng = np.random.default_rng(0)
    retain, test = rng.exponential(0.05, 300), rng.exponential(2.0, 300)
    member_like = svm_loss_attack(retain, rng.exponential(0.05, 100), test, seed=1)
    unseen_like = svm_loss_attack(retain, rng.exponential(2.0, 100), test, seed=1)
    assert member_like > 0.8 and abs(unseen_like - 0.5) < 0.1
    beyond_unseen = svm_loss_attack(retain, rng.exponential(50.0, 100), test, seed=1)  # GA-like blown-up losses
    assert beyond_unseen < unseen_like
    assert math.isnan(svm_loss_attack(retain, np.array([]), test, seed=1))


def test_config_requires_at_least_four_shadows_and_known_experiments():
    for n in (2, 3, 5):
        with pytest.raises(ConfigError, match="recognizer.ulira.n_shadows"):
            validate_config({"recognizer": {"ulira": {"n_shadows": n}}})
    rcfg = validate_config({"recognizer": {"ulira": {"enabled": True, "datasets": ["orl"]}}})["recognizer"]
    assert [e.name for e in ulira.experiments(rcfg)] == ["seed0", "seed1", "seed2"]
    assert ulira.experiments(validate_config({})["recognizer"]) == []
    bad = validate_config({"recognizer": {"ulira": {"enabled": True, "seeds": [7]}}})["recognizer"]
    with pytest.raises(ConfigError, match="recognizer.ulira.seeds"):
        ulira.experiments(bad)
    bad = validate_config({"recognizer": {"methods": {"run": ["retrain"]}, "ulira": {"methods": ["ga"]}}})
    with pytest.raises(ConfigError, match="recognizer.ulira.methods"):
        ulira.methods(bad["recognizer"])


def test_tiny_ulira_job_scores_each_method_on_a_balanced_pool():
    from idunlearn.recognizer.runs import Experiment
    from idunlearn.recognizer.training import accuracy, train_from_scratch

    data = _tiny_world()
    overrides = {"orl": {"model": {"channels": [4], "feature_dim": 8},
                         "training": {"epochs": 2, "batch_size": 8, "lr": 0.01}},
                 "tasks": {"random_subset": {"forget_fraction": 0.2}},
                 "methods": {"run": ["original", "retrain", "ft"]}, "ulira": {"enabled": True}}
    rcfg = validate_config({"recognizer": overrides})["recognizer"]
    job = ulira.job_config(rcfg, "orl")
    model, _ = train_from_scratch(*data.tensors(data.train_idx), 3, 8, rcfg["orl"]["model"], rcfg["orl"]["training"],
                                  seed=0)
    meta = {"acc_test": accuracy(model, *data.tensors(data.test_idx))}
    membership, bases = ulira.train_bases(data, rcfg["orl"], 4, 42)
    assert (membership.sum(0) == 2).all() and len(bases) == 4
    rows = ulira.attack_experiment(data, model, meta, membership, bases, Experiment("random_subset", "orl", 0), job,
                                   42).set_index("method")
    assert rows.index.tolist() == ["original", "retrain", "ft"]
    n_forget = len(random_forget_set(data, 0.2, 42, 0))
    assert (rows["n_positive"] == min(n_forget, len(data.test_idx))).all()
    assert (rows["n_negative"] == rows["n_positive"]).all()
    assert rows.loc["original", "not_scored"] and np.isnan(rows.loc["original", "ulira_auc"])
    for method in ("retrain", "ft"):
        assert 0 <= rows.loc[method, "ulira_auc"] <= 1 and 0 <= rows.loc[method, "ulira_acc"] <= 1
    again = ulira.attack_experiment(data, model, meta, membership, bases, Experiment("random_subset", "orl", 0), job,
                                    42)
    assert np.allclose(again["ulira_auc"], rows["ulira_auc"].to_numpy(), equal_nan=True)


def test_tables_join_ulira_rows_and_show_its_metrics_only_when_run():
    import pandas as pd

    from idunlearn.recognizer.metrics import random_subset_table
    from idunlearn.recognizer.stages import with_ulira

    keys = {"task": "random_subset", "dataset": "orl", "experiment": ["seed0", "seed0", "seed1"],
            "method": ["retrain", "gsuo", "gsuo"], "setting": "paper"}
    rows = pd.DataFrame({**keys, "acc_test": 0.9, "mia_auc": 0.5, "svm_asr": [0.5, 0.6, 0.7], "time_s": 1.0,
                         "speedup": 1.0})
    assert "MIA AUC (U-LiRA)" not in random_subset_table(with_ulira(rows, []))["metric"].tolist()
    attack = pd.DataFrame({**{k: v[:2] if isinstance(v, list) else v for k, v in keys.items()},
                           "ulira_auc": [0.5, 0.75], "ulira_acc": [0.5, 0.625]})
    joined = with_ulira(rows, [attack])
    assert joined["ulira_auc"].tolist()[:2] == [0.5, 0.75] and np.isnan(joined["ulira_auc"][2])
    table = random_subset_table(joined).set_index("metric")
    assert table.loc["MIA AUC (U-LiRA)", "GSUO"] == "0.750"
    assert table.loc["MIA ASR (SVM, loss)", "GSUO"].startswith("0.650")  # mean over both seeds
