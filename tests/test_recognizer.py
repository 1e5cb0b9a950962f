"""Recognizer track: GSUO's target distributions and losses, the baselines' building blocks, the attack and the
metrics against hand-computed values; the data readers on hand-made files; one tiny experiment end to end."""

from __future__ import annotations

import gzip
import io
import json
import math
import tarfile

import numpy as np
import pandas as pd
import pytest
import torch

from idunlearn.config import ConfigError, validate_config
from idunlearn.recognizer.data import (
    TEST,
    TRAIN,
    ImageData,
    ar_members,
    class_index,
    deb_files,
    fashion_mnist_subset,
    random_forget_set,
    read_idx,
    split_per_class,
)
from idunlearn.recognizer.methods import applies, gsuo
from idunlearn.recognizer.methods.baselines import distill_kl, saliency_mask
from idunlearn.recognizer.methods.common import Problem, random_other_labels
from idunlearn.recognizer.methods.eupmu import ImplicitRetainWeight
from idunlearn.recognizer.metrics import abs_diff, acc_index, add_speedup, markdown, random_subset_table, speedup
from idunlearn.recognizer.mia import attack_auc, lira_scores, logit_confidence, shadow_memberships
from idunlearn.recognizer.models import RecognizerNet
from idunlearn.recognizer.runs import Experiment, experiment_config, experiments, method_settings, run_experiment

torch.set_num_threads(1)


# ----------------------------------------------------------------------------------------------------- GSUO (4.1)
def test_normal_target_is_eq1_by_hand():
    p = torch.tensor([[0.7, 0.2, 0.1]])
    # 0.5 * p + 0.5 / 3
    assert torch.allclose(gsuo.normal_target(p, 0.5), torch.tensor([[0.516667, 0.266667, 0.216667]]), atol=1e-6)
    assert torch.allclose(gsuo.normal_target(p, 1.0), p) and torch.allclose(gsuo.normal_target(p, 0.0), torch.full((1, 3), 1 / 3))
    with pytest.raises(ValueError, match="alpha"):
        gsuo.normal_target(p, 1.5)


def test_boundary_target_is_nearest_other_prototype_eq2():
    protos = torch.tensor([[0.0, 0.1], [1.0, 0.0], [0.0, 2.0]])
    feats = torch.tensor([[0.0, 0.0], [0.9, 0.0]])
    labels = torch.tensor([0, 1])
    # sample 0: own class 0 is nearest but excluded -> class 1 (d^2 = 1) beats class 2 (d^2 = 4)
    # sample 1: class 0 at d^2 = 0.81 + 0.01 = 0.82, class 2 at 0.81 + 4 -> class 0
    assert gsuo.nearest_other_prototype(feats, labels, protos).tolist() == [1, 0]
    # a class without retain images (NaN prototype) is never chosen
    protos_nan = protos.clone()
    protos_nan[1] = float("nan")
    assert gsuo.nearest_other_prototype(feats[:1], labels[:1], protos_nan).tolist() == [2]
    head = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    # prototype (1, 0) -> logits (1, 0, 1) -> (e, 1, e) / (2e + 1)
    e = math.e
    expected = torch.tensor([e, 1.0, e]) / (2 * e + 1)
    assert torch.allclose(gsuo.prototype_distributions(head, protos)[1], expected, atol=1e-6)


def test_class_prototypes_are_class_means():
    feats = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]])
    protos = gsuo.class_prototypes(feats, torch.tensor([0, 0, 2]), 3)
    assert torch.allclose(protos[0], torch.tensor([2.0, 1.0])) and torch.allclose(protos[2], torch.tensor([5.0, 5.0]))
    assert torch.isnan(protos[1]).all()


def test_kl_alignment_by_hand():
    target = torch.tensor([[0.5, 0.5]])
    logits = torch.log(torch.tensor([[0.25, 0.75]]))
    # 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75)
    assert gsuo.kl_alignment(target, logits).item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), abs=1e-6)
    # a zero target entry contributes nothing; identical distributions give 0
    assert gsuo.kl_alignment(torch.tensor([[1.0, 0.0]]), torch.log(torch.tensor([[0.8, 0.2]]))).item() == \
        pytest.approx(-math.log(0.8), abs=1e-6)
    assert gsuo.kl_alignment(torch.tensor([[0.3, 0.7]]), torch.log(torch.tensor([[0.3, 0.7]]))).item() == pytest.approx(0, abs=1e-6)


def test_boundary_mask_rules():
    conf = torch.tensor([0.9, 0.2, 0.99, 0.5])
    assert gsuo.boundary_mask(conf, "error_rate", 0.0, 0.5).tolist() == [False, True, False, True]
    assert gsuo.boundary_mask(conf, "error_rate", 0.0, 0.1).tolist() == [False] * 4  # round(0.4) = 0
    assert gsuo.boundary_mask(conf, "threshold", 0.95, 0.0).tolist() == [True, True, False, True]
    with pytest.raises(ValueError, match="boundary_rule"):
        gsuo.boundary_mask(conf, "margin", 0.5, 0.1)


# ----------------------------------------------------------------------------------------------------- GSUO (4.2)
def test_dispersion_loss_eq3_by_hand():
    feats = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [7.0, 7.0]])
    labels = torch.tensor([4, 4, 4, 0])
    # pairs: cos 0 -> 1; cos 1/sqrt2 -> 1 - 0.70711 twice; mean over the 6 ordered pairs = (1 + 2 * 0.29289) / 3
    mean_distance = (1 + 2 * (1 - 1 / math.sqrt(2))) / 3
    assert gsuo.dispersion_loss(feats, labels, [4]).item() == pytest.approx(-math.log(mean_distance), abs=1e-5)
    # two forget classes: the mean of their terms (orthogonal pair: -log 1 = 0; the 3-sample class above)
    two = gsuo.dispersion_loss(torch.cat([feats[:3], torch.tensor([[1.0, 0.0], [0.0, 3.0]])]),
                               torch.tensor([4, 4, 4, 0, 0]), [4, 0])
    assert two.item() == pytest.approx(-math.log(mean_distance) / 2, abs=1e-5)
    # features of one direction are not dispersed at all: a large loss (the clamp keeps it finite)
    same = gsuo.dispersion_loss(torch.tensor([[1.0, 1.0], [2.0, 2.0]]), torch.tensor([0, 0]), [0]).item()
    assert 10 < same < 30
    with pytest.raises(ValueError):
        gsuo.dispersion_loss(feats, labels, [0])  # a single sample: nothing to disperse


def test_alignment_loss_eq4_by_hand():
    feats = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    # normalised mean (0.5, 0.5) against the retain centre (1, 0): 1 - cos 45 degrees
    loss = gsuo.alignment_loss(feats, torch.tensor([3, 3]), [3], torch.tensor([1.0, 0.0]))
    assert loss.item() == pytest.approx(1 - 1 / math.sqrt(2), abs=1e-6)
    assert gsuo.alignment_loss(feats, torch.tensor([3, 3]), [3], torch.tensor([2.0, 2.0])).item() == pytest.approx(0, abs=1e-6)


def test_suppression_loss_counts_only_forget_samples_still_correct():
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([0, 0])  # the first is still correct, the second is already forgotten
    expected = math.log(1 + math.exp(-2.0)) / 2  # CE of the first sample, divided by the batch size
    assert gsuo.suppression_loss(logits, y).item() == pytest.approx(expected, abs=1e-6)


# ------------------------------------------------------------------------------------------------- other methods
def test_random_other_labels_never_keep_the_label():
    y = torch.tensor([0, 1, 2] * 200)
    z = random_other_labels(y, 3, np.random.default_rng(0))
    assert (z != y).all() and set(z[y == 0].tolist()) == {1, 2}


def test_eupmu_weight_update_eq8_by_hand():
    w = ImplicitRetainWeight(lr=0.1, beta=0.5, epsilon=0.2, max_weight=3.0)
    # retain loss rose by 0.05: delta = -0.05 / 0.1 + 0.2 = -0.3 -> lambda = 0 + 0.5 * 0.3
    assert w.update(1.0, 1.05) == pytest.approx(0.15)
    # fell by 0.1: delta = 1 + 0.2 -> 0.15 - 0.6 < 0 -> clipped at 0
    assert w.update(1.0, 0.9) == 0.0
    # rose by 2: delta = -19.8 -> 9.9, capped at D = 3
    assert w.update(1.0, 3.0) == 3.0


@pytest.mark.parametrize("task", ["random_subset", "classwise"])
def test_rl_eupmu_starts_at_lambda_zero_as_algorithm_1(task):
    from idunlearn.recognizer.methods.eupmu import rl_eupmu

    # EUPMU Algorithm 1's input lambda_0 = 0 is the default; with beta 0 lambda never moves from where it starts
    settings = {**validate_config({})["recognizer"]["methods"][task]["rl_eupmu"], "epochs": 1, "beta": 0.0}
    torch.manual_seed(0)
    x, y = torch.randn(6, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    _, info = rl_eupmu(RecognizerNet(3, 8, (4,), 8), Problem(task, x, y, x, y, 3), settings, seed=0)
    assert info == {"eupmu_mean_weight": 0.0, "eupmu_final_weight": 0.0}


def test_distill_kl_by_hand():
    s, t = torch.log(torch.tensor([[0.25, 0.75]])), torch.log(torch.tensor([[0.5, 0.5]]))
    assert distill_kl(s, t, 1.0).item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), abs=1e-6)


def test_saliency_mask_keeps_the_top_share_of_nonzero_gradients():
    torch.manual_seed(0)
    model = RecognizerNet(3, 8, (4,), 8)
    x, y = torch.randn(6, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    problem = Problem("random_subset", x, y, x, y, 3)
    mask = saliency_mask(model, problem, 0.3, 4)
    kept = sum(float(m.sum()) for m in mask.values())
    total = sum(m.numel() for m in mask.values())
    assert 0 < kept <= math.ceil(0.3 * total)


# ---------------------------------------------------------------------------------------------------- the attack
def test_logit_confidence_by_hand():
    # p_0 = e^2 / (e^2 + 2): log(p / (1 - p)) = 2 - ln 2
    phi = logit_confidence(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]))
    assert phi[0] == pytest.approx(2 - math.log(2), abs=1e-9)


def test_lira_scores_by_hand():
    membership = np.array([[True, False], [True, True], [False, False], [False, True]])
    shadow_phi = np.array([[1.0, 0.0], [3.0, 4.0], [-1.0, 2.0], [1.0, 6.0]])
    # item 0: in {1, 3} (mean 2, std 1), out {-1, 1} (mean 0, std 1); phi = 2 -> 0 - (-2) = 2
    scores = lira_scores(np.array([2.0, 5.0]), membership, shadow_phi, fixed_variance=False)
    assert scores[0] == pytest.approx(2.0)
    # item 1: in {4, 6} (mean 5, std 1), out {0, 2} (mean 1, std 1); phi = 5 -> 0 - (-8) = 8
    assert scores[1] == pytest.approx(8.0)
    # pooled variances are the same here (all residuals are +-1)
    assert np.allclose(lira_scores(np.array([2.0, 5.0]), membership, shadow_phi, fixed_variance=True), [2.0, 8.0])


def test_shadow_memberships_are_balanced_and_seeded():
    m = shadow_memberships(50, 6, seed=3)
    assert m.shape == (6, 50) and (m.sum(0) == 3).all()
    assert np.array_equal(m, shadow_memberships(50, 6, seed=3)) and not np.array_equal(m, shadow_memberships(50, 6, 4))
    with pytest.raises(ValueError, match="n_shadows"):
        shadow_memberships(5, 3, 0)


def test_attack_auc():
    assert attack_auc(np.array([3.0, 4.0]), np.array([1.0, 2.0])) == 1.0
    assert attack_auc(np.array([1.0, 3.0]), np.array([2.0, 4.0])) == 0.25
    assert np.isnan(attack_auc(np.array([]), np.array([1.0])))


# --------------------------------------------------------------------------------------------------------- metrics
def test_diff_facc_and_speedup_by_hand():
    assert abs_diff(0.9, 0.8) == pytest.approx(0.1) and acc_index(0.9, 0.8) == pytest.approx(0.7)
    assert acc_index(0.7, 0.8) == pytest.approx(0.7) and speedup(100.0, 4.0) == 25.0 and np.isnan(speedup(1.0, 0.0))
    rows = pd.DataFrame({"task": "random_subset", "dataset": "orl", "experiment": ["seed0"] * 3,
                         "method": ["original", "retrain", "gsuo"], "time_s": [0.001, 30.0, 3.0]})
    assert add_speedup(rows)["speedup"].tolist()[1:] == [1.0, 10.0] and np.isnan(add_speedup(rows)["speedup"][0])


def test_random_subset_table_reports_mean_and_t_interval_per_setting():
    rows = pd.DataFrame({"task": "random_subset", "dataset": "orl", "experiment": ["seed0", "seed1", "seed2"] * 2,
                         "method": "gsuo", "setting": ["tuned"] * 3 + ["paper"] * 3, "acc_retain": 1.0,
                         "acc_test": [0.5, 0.5, 0.5, 0.9, 0.8, 1.0], "acc_forget": 0.9, "diff": 0.0, "f_acc": 0.9,
                         "mia_auc": 0.5, "mia_auc_loss": 0.5, "time_s": 1.0, "speedup": 2.0})
    table = random_subset_table(rows)
    # mean 0.9; half width t_{0.975, 2} * 0.1 / sqrt(3) = 4.3027 * 0.057735
    assert table.loc[table["metric"] == "Acc(D_t) %", "GSUO"].item() == "90.00 ± 24.84"
    assert table.loc[table["metric"] == "Acc(D_t) %", "GSUO (tuned)"].item() == "50.00 ± 0.00"
    assert markdown(table).splitlines()[0].startswith("| dataset | metric | n | GSUO | GSUO (tuned) |")


# ------------------------------------------------------------------------------------------------------------ data
def test_read_idx_of_a_hand_made_file():
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    raw = b"\x00\x00\x08\x03" + b"".join(int(n).to_bytes(4, "big") for n in images.shape) + images.tobytes()
    assert np.array_equal(read_idx(gzip.compress(raw)), images)
    labels = b"\x00\x00\x08\x01" + (3).to_bytes(4, "big") + bytes([7, 8, 9])
    assert read_idx(labels).tolist() == [7, 8, 9]
    with pytest.raises(ValueError):
        read_idx(labels[:-1])


def _ar(members: dict[str, bytes]) -> bytes:
    out = b"!<arch>\n"
    for name, data in members.items():
        header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        out += header + data + (b"\n" if len(data) % 2 else b"")
    return out


def test_deb_files_reads_the_data_tarball_of_a_hand_made_deb(tmp_path):
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w:xz") as tar:
        for name, data in {"./usr/share/datasets/x/a.gz": b"abc", "./usr/share/doc/x/README": b"no"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    deb = _ar({"debian-binary": b"2.0\n", "control.tar.xz": b"x", "data.tar.xz": tar_bytes.getvalue()})
    assert set(ar_members(deb)) == {"debian-binary", "control.tar.xz", "data.tar.xz"}
    (tmp_path / "p.deb").write_bytes(deb)
    assert deb_files(tmp_path / "p.deb", "usr/share/datasets/x") == {"a.gz": b"abc"}


def test_splits_and_forget_sets():
    labels = np.repeat(np.arange(4), [10, 10, 2, 7])
    ids = np.array([f"img{i:03d}" for i in range(len(labels))])
    split = split_per_class(labels, ids, 0.7, seed=1)
    assert [int((split[labels == c] == TRAIN).sum()) for c in range(4)] == [7, 7, 1, 4]
    assert np.array_equal(split, split_per_class(labels, ids, 0.7, seed=1))
    data = ImageData("t", np.zeros((len(labels), 4, 4), np.uint8), labels, split, ids, np.array([10, 11, 12, 13]))
    forget = random_forget_set(data, 0.1, seed=1, experiment_seed=0)
    assert len(forget) == round(0.1 * len(data.train_idx)) and set(forget) <= set(data.train_idx)
    assert not np.array_equal(forget, random_forget_set(data, 0.1, seed=1, experiment_seed=1))
    assert class_index(data, 12) == 2
    with pytest.raises(ValueError, match="forget identity 5"):
        class_index(data, 5)


def test_fashion_mnist_subset_counts():
    arrays = {"train_images": np.zeros((50, 28, 28), np.uint8), "train_labels": np.arange(50) % 10,
              "test_images": np.ones((20, 28, 28), np.uint8), "test_labels": np.arange(20) % 10}
    data = fashion_mnist_subset(arrays, 30, 5, seed=0)
    assert len(data.train_idx) == 30 and len(data.test_idx) == 5 and (data.split[data.images[:, 0, 0] == 1] == TEST).all()
    with pytest.raises(ValueError, match="n_train"):
        fashion_mnist_subset(arrays, 60, 5, seed=0)


# ------------------------------------------------------------------------------------------------- config and run
def test_config_defaults_and_errors_name_the_key():
    cfg = validate_config({})["recognizer"]
    assert cfg["tasks"]["random_subset"]["forget_fraction"] == 0.1 and len(cfg["tasks"]["random_subset"]["seeds"]) >= 3
    assert cfg["methods"]["run"][-1] == "gsuo" and "rl_eupmu" in cfg["methods"]["run"]
    with pytest.raises(ConfigError, match="recognizer.methods.random_subset.gsuo"):
        validate_config({"recognizer": {"methods": {"random_subset": {"gsuo": {"alpah": 0.5}}}}})
    bad = validate_config({"recognizer": {"orl": {"method_overrides": {"classwise": {"ft": {"epoch": 1}}}}}})["recognizer"]
    with pytest.raises(ConfigError, match="recognizer.orl.method_overrides.classwise.ft"):
        method_settings(bad, "classwise", "orl", "ft")


def test_experiment_names():
    rcfg = validate_config({})["recognizer"]
    names = [(e.task, e.dataset, e.name) for e in experiments(rcfg, [2, 7])]
    assert ("random_subset", "fashion_mnist", "seed2") in names and ("classwise", "orl", "id7-seed0") in names
    assert Experiment.parse("classwise", "orl", "id7-seed0") == Experiment("classwise", "orl", 0, 7)
    with pytest.raises(ValueError):
        Experiment.parse("random_subset", "orl", "id7-seed0")


def _tiny_world():
    rng = np.random.default_rng(0)
    n_classes, per_class, size = 3, 12, 8
    labels = np.repeat(np.arange(n_classes), per_class)
    pattern = rng.integers(0, 255, size=(n_classes, size, size))
    images = np.clip(pattern[labels] + rng.normal(0, 40, (len(labels), size, size)), 0, 255).astype(np.uint8)
    ids = np.array([f"x{i:03d}" for i in range(len(labels))])
    return ImageData("orl", images, labels, split_per_class(labels, ids, 0.75, 0), ids, np.array([5, 6, 7]))


@pytest.mark.parametrize("task,name", [("random_subset", "seed0"), ("classwise", "id6-seed0")])
def test_tiny_experiment_runs_every_method_and_is_deterministic(task, name):
    data = _tiny_world()
    overrides = {"orl": {"model": {"channels": [4], "feature_dim": 8},
                         "training": {"epochs": 3, "batch_size": 8, "lr": 0.01}},
                 "tasks": {"random_subset": {"forget_fraction": 0.2}}}
    rcfg = validate_config({"recognizer": overrides})["recognizer"]
    from idunlearn.recognizer.training import accuracy, train_from_scratch

    x, y = data.tensors(data.train_idx)
    model, _ = train_from_scratch(x, y, 3, 8, rcfg["orl"]["model"], rcfg["orl"]["training"], seed=0)
    meta = {"acc_test": accuracy(model, *data.tensors(data.test_idx))}
    all_x, all_y = data.tensors(np.arange(len(y) + len(data.test_idx)))
    membership = shadow_memberships(len(all_y), 2, 0)
    shadows = {"membership": membership, "phi": np.stack([logit_confidence(model(all_x).detach(), all_y)] * 2),
               "ids": data.ids}
    exp = Experiment.parse(task, "orl", name)
    sub = experiment_config(rcfg, task, "orl")
    first = run_experiment(data, model, meta, shadows, exp, sub, 42)
    second = run_experiment(data, model, meta, shadows, exp, sub, 42)
    assert first["method"].tolist() == [m for m in rcfg["methods"]["run"] if applies(m, task)]
    assert (first["setting"] == "paper").all()
    cols = ["acc_retain", "acc_forget", "acc_test", "diff", "f_acc", "mia_auc", "mia_auc_loss", "info"]
    pd.testing.assert_frame_equal(first[cols], second[cols])
    original = first.set_index("method").loc["original"]
    if task == "classwise":
        assert original["n_forget"] == 9 and np.isnan(original["diff"])
        assert original["acc_forget_test"] == pytest.approx(accuracy(model, *data.tensors(
            data.test_idx[data.labels[data.test_idx] == 1])))
    else:
        assert original["n_forget"] == round(0.2 * 27)
        assert original["diff"] == pytest.approx(abs(original["acc_forget"] - original["acc_test"]))


def test_tiny_tuning_protocol_end_to_end():
    """Tuning requests disjoint from the evaluation, every setting on every request, the rule's choice, and the
    chosen settings rerun on an evaluation experiment as 'tuned' rows."""
    from idunlearn.recognizer import tuning
    from idunlearn.recognizer.training import accuracy, train_from_scratch

    data = _tiny_world()
    overrides = {"orl": {"model": {"channels": [4], "feature_dim": 8},
                         "training": {"epochs": 3, "batch_size": 8, "lr": 0.01}},
                 "tasks": {"random_subset": {"forget_fraction": 0.2, "seeds": [0]}},
                 "methods": {"run": ["original", "retrain", "ft", "unsir"]},
                 "tuning": {"random_subset": {"seeds": [5, 6], "epoch_budget": 2},
                            "classwise": {"n_identities": 1},
                            "grids": {"random_subset": {"ft": {"epochs": [1, 2], "lr": [0.001, 0.01]}},
                                      "classwise": {"ft": {"epochs": [1]}, "unsir": {"noise_steps": [2]}}}}}
    rcfg = validate_config({"recognizer": overrides})["recognizer"]
    x, y = data.tensors(data.train_idx)
    model, _ = train_from_scratch(x, y, 3, 8, rcfg["orl"]["model"], rcfg["orl"]["training"], seed=0)
    meta = {"acc_test": accuracy(model, *data.tensors(data.test_idx))}
    all_x, all_y = data.tensors(np.arange(len(data.labels)))
    shadows = {"membership": shadow_memberships(len(all_y), 2, 0),
               "phi": np.stack([logit_confidence(model(all_x).detach(), all_y)] * 2), "ids": data.ids}
    grids, requests = [], []
    for task in ("random_subset", "classwise"):
        reqs = tuning.requests(tuning.job_config(rcfg, task, "orl"), task, "orl", data, [6], 42)
        table = tuning.request_table(data, model, meta, shadows, reqs, tuning.job_config(rcfg, task, "orl"), 42)
        requests.append(table)
        for method in tuning.tuned_methods(rcfg, task):
            grids.append(tuning.tune_method(data, model, meta, shadows, table, method,
                                            tuning.job_config(rcfg, task, "orl", method), 42))
    requests = pd.concat(requests, ignore_index=True)
    assert requests["experiment"].tolist()[:2] == ["seed5", "seed6"]
    classwise_identity = requests.loc[requests["task"] == "classwise", "forget_identity"].item()
    assert classwise_identity in (5, 7)  # never the evaluation's forget identity 6
    assert requests.loc[requests["task"] == "classwise", "forget_shared_with_evaluation"].item() == 0
    rows = pd.concat(grids, ignore_index=True)
    assert len(rows[(rows["task"] == "random_subset")]) == 4 * 2  # 4 settings x 2 requests
    grid, choice = tuning.choose_all(rows, requests, rcfg["tuning"]["rule"])
    assert set(choice["method"]) == {"ft", "unsir"} and grid.groupby(["task", "method"])["chosen"].sum().eq(1).all()
    chosen = tuning.chosen_settings(choice)
    tuned = run_experiment(data, model, meta, shadows, Experiment.parse("random_subset", "orl", "seed0"),
                           experiment_config(rcfg, "random_subset", "orl"), 42, tuned=chosen["random_subset"]["orl"])
    assert tuned["method"].tolist() == ["ft"] and tuned["setting"].tolist() == ["tuned"]
    assert json.loads(tuned["settings"].item()) == chosen["random_subset"]["orl"]["ft"]


def test_tables_stop_on_experiment_files_of_an_older_version(tmp_path):
    from idunlearn.recognizer.stages import tables

    old = tmp_path / "metrics.parquet"  # an experiment file from before svm_asr existed
    pd.DataFrame({"task": ["random_subset"], "method": ["ga"], "mia_auc": [0.5]}).to_parquet(old)
    with pytest.raises(ValueError, match="lack metric columns.*--forcerun recognizer_experiment"):
        tables([str(old)], [], {})
