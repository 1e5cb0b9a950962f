"""Recognizer track: the baselines added for GSUO's list (RL as Appendix C defines it, IU, EU-k / CF-k, Bad-T, UNSIR,
B-Shrink / B-Expand) against hand-computed or independently computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from idunlearn.recognizer.methods import METHODS, applies
from idunlearn.recognizer.methods.bad_teaching import bad_teacher_loss
from idunlearn.recognizer.methods.baselines import (
    catastrophic_forgetting_k,
    exact_unlearning_k,
    random_labels,
    random_labels_with_retain,
    weight_layers,
)
from idunlearn.recognizer.methods.boundary import boundary_expand, nearest_incorrect_labels
from idunlearn.recognizer.methods.common import Problem
from idunlearn.recognizer.methods.influence import conjugate_gradient, influence_update
from idunlearn.recognizer.methods.unsir import error_maximizing_noise, noise_objective, retain_subset, unsir
from idunlearn.recognizer.models import RecognizerNet

torch.set_num_threads(1)


def _tiny_problem(task: str = "random_subset", seed: int = 0) -> tuple[RecognizerNet, Problem]:
    torch.manual_seed(seed)
    model = RecognizerNet(3, 8, (2,), 4)
    x, y = torch.randn(12, 1, 8, 8), torch.tensor([0, 1, 2] * 4)
    if task == "classwise":
        forget = y == 1
        return model, Problem(task, x[~forget], y[~forget], x[forget], y[forget], 3, forget_classes=[1])
    return model, Problem(task, x[3:], y[3:], x[:3], y[:3], 3)


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_rl_uses_the_forget_set_only_and_rl_with_retain_the_retain_set_too():
    model, problem = _tiny_problem()
    problem.x_retain = torch.full_like(problem.x_retain, float("nan"))  # any use of D_r poisons the weights
    settings = {"epochs": 2, "lr": 0.01, "batch_size": 2}
    rl, _ = random_labels(model, problem, settings, seed=0)
    assert all(torch.isfinite(p).all() for p in rl.parameters()) and not _same(rl, model)
    with_retain, _ = random_labels_with_retain(model, problem, settings, seed=0)
    assert not all(torch.isfinite(p).all() for p in with_retain.parameters())


def test_conjugate_gradient_solves_and_stops_at_negative_curvature():
    a = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0], dtype=torch.float64)
    x, _ = conjugate_gradient(lambda v: a @ v, b, steps=10, tol=1e-12)
    assert torch.allclose(x, torch.linalg.solve(a, b), atol=1e-10)
    x_neg, iterations = conjugate_gradient(lambda v: -v, b, steps=10)
    assert iterations == 0 and (x_neg == 0).all()


def test_influence_update_matches_the_explicit_damped_hessian_solve():
    model, problem = _tiny_problem()
    model = model.double()
    x_f, y_f, x_h, y_h = problem.x_forget.double(), problem.y_forget, problem.x_retain.double(), problem.y_retain
    params = list(model.parameters())
    flat = torch.nn.utils.parameters_to_vector(params).detach()

    def loss_at(vector, x, y):
        shapes, out, i = [p.shape for p in params], [], 0
        for shape in shapes:
            n = math.prod(shape)
            out.append(vector[i: i + n].view(shape))
            i += n
        names = [name for name, _ in model.named_parameters()]
        return nn.functional.cross_entropy(torch.func.functional_call(model, dict(zip(names, out)), (x,)), y)

    hessian = torch.autograd.functional.hessian(lambda v: loss_at(v, x_h, y_h), flat)
    g_forget = torch.func.grad(lambda v: loss_at(v, x_f, y_f))(flat) * len(y_f)  # sum over D_f
    # a damping that makes H + damping I positive definite (conjugate gradients needs it; a random net is not convex)
    damping, n = max(0.0, -torch.linalg.eigvalsh(hessian).min().item()) + 0.5, 12
    expected = torch.linalg.solve(hessian + damping * torch.eye(len(flat), dtype=flat.dtype), g_forget) / n
    delta, _ = influence_update(model, x_f, y_f, x_h, y_h, n, damping, cg_steps=500)
    assert torch.allclose(delta, expected, atol=1e-6 * expected.abs().max().item())


def test_bad_teacher_loss_by_hand():
    student = torch.log(torch.tensor([[0.25, 0.75], [0.5, 0.5]]))
    competent = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    incompetent = torch.log(torch.tensor([[0.1, 0.9], [0.2, 0.8]]))
    is_forget = torch.tensor([False, True])
    # retain row: KL([.5,.5] || [.25,.75]); forget row: KL([.2,.8] || [.5,.5]); batch mean
    kl_retain = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    kl_forget = 0.2 * math.log(0.2 / 0.5) + 0.8 * math.log(0.8 / 0.5)
    loss = bad_teacher_loss(student, competent, incompetent, is_forget, 1.0)
    assert loss.item() == pytest.approx((kl_retain + kl_forget) / 2, abs=1e-6)


@pytest.mark.parametrize("method,reinitialised", [(exact_unlearning_k, True), (catastrophic_forgetting_k, False)])
def test_eu_k_and_cf_k_freeze_the_first_layers(method, reinitialised):
    model, problem = _tiny_problem()
    before = [layer.weight.detach().clone() for layer in weight_layers(model)]
    untrained, _ = method(model, problem, {"frozen_layers": 1, "epochs": 0, "lr": 0.01, "batch_size": 4}, seed=0)
    after = [layer.weight for layer in weight_layers(untrained)]
    assert torch.equal(after[0], before[0])
    # with no epoch the later layers are the fresh initialisation (EU-k) or still the original's (CF-k)
    assert all(torch.equal(a, b) != reinitialised for a, b in zip(after[1:], before[1:]))
    trained, _ = method(model, problem, {"frozen_layers": 2, "epochs": 2, "lr": 0.01, "batch_size": 4}, seed=0)
    layers = weight_layers(trained)
    assert torch.equal(layers[1].weight, before[1]) and not torch.equal(layers[2].weight, before[2])
    with pytest.raises(ValueError, match="frozen_layers"):
        method(model, problem, {"frozen_layers": 4, "epochs": 1, "lr": 0.01, "batch_size": 4}, seed=0)


def test_unsir_noise_objective_by_hand_and_noise_raises_the_forget_loss():
    logits, labels = torch.tensor([[0.0, math.log(3.0)]]), torch.tensor([1])
    noise = torch.tensor([[1.0, 2.0]])
    # CE = -log(3/4); norm term 0.1 * (1 + 4)
    assert noise_objective(logits, labels, noise, 0.1).item() == pytest.approx(math.log(0.75) + 0.5, abs=1e-6)
    model, problem = _tiny_problem("classwise")
    settings = {"noise_copies": 4, "noise_steps": 30, "noise_lr": 0.1, "noise_weight": 0.0}
    noise, noise_labels = error_maximizing_noise(model, [1], (1, 8, 8), settings, seed=0)
    start = torch.randn((4, 1, 8, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (nn.functional.cross_entropy(model(noise), noise_labels)
                > nn.functional.cross_entropy(model(start), noise_labels))
    assert (noise_labels == 1).all()


def test_unsir_retain_subset_and_task():
    rows = retain_subset(torch.tensor([0, 0, 0, 2, 2, 3]), 2, np.random.default_rng(0))
    assert len(rows) == 5 and (np.diff(rows) > 0).all()
    model, problem = _tiny_problem("random_subset")
    with pytest.raises(ValueError, match="class-wise"):
        unsir(model, problem, {}, seed=0)


def test_nearest_incorrect_labels_follow_the_fgsm_neighbour_of_a_linear_model():
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    model = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(weight)
    x, y = torch.tensor([[2.0, 1.5], [0.1, 0.3]]), torch.tensor([0, 1])
    # grad_x CE = W^T (softmax(W x) - onehot(y)), computed by hand
    p = torch.softmax(x @ weight.T, dim=1)
    grad = (p - nn.functional.one_hot(y, 3).float()) @ weight
    neighbour = (x + 0.5 * grad.sign()) @ weight.T
    neighbour[torch.arange(2), y] = float("-inf")
    assert torch.equal(nearest_incorrect_labels(model, x, y, 0.5), neighbour.argmax(1))


def test_boundary_expand_keeps_the_head_size_and_is_the_original_without_training():
    model, problem = _tiny_problem("classwise")
    same, _ = boundary_expand(model, problem, {"epochs": 0, "lr": 0.01, "batch_size": 4}, seed=0)
    assert same.head.out_features == 3 and _same(same, model)
    trained, _ = boundary_expand(model, problem, {"epochs": 3, "lr": 0.01, "batch_size": 4}, seed=0)
    assert trained.head.out_features == 3 and not _same(trained, model)


def test_class_wise_only_methods():
    assert {m for m in METHODS if not applies(m, "random_subset")} == {"b_shrink", "b_expand", "unsir"}
    assert all(applies(m, "classwise") for m in METHODS)
