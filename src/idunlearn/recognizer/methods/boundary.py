"""Boundary Shrink and Boundary Expanding (Chen et al. 2023), class-wise only, as GSUO Appendix C describes them:
destroy the decision boundary of the forgotten class with adversarial neighbours of its samples (B-Shrink), or
assign its samples to an extra shadow class with a widened last layer that is then removed (B-Expand).

B-Shrink: x' = x + epsilon * sign(grad_x CE(f_o(x), y)) (FGSM neighbour search), y_nbi = argmax_{k != y} f_o(x')_k
(the nearest incorrect label); fine-tune on (x, y_nbi) over D_f (Chen et al. Section 3.2). B-Expand: a head with C + 1
outputs (the first C copied, the shadow neuron freshly initialised), cross-entropy of D_f against the shadow class
C, then the shadow neuron is pruned (Chen et al. Section 3.3). An epoch is one pass over D_f.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from ..models import derive_seed
from .common import Problem, adam, ce, epoch_batches, fresh_copy, frozen_copy, step

_SHRINK, _EXPAND, _SHADOW = 76, 77, 78


def _classwise_only(problem: Problem, name: str) -> None:
    if problem.task != "classwise":
        raise ValueError(f"{name} moves the decision boundary of a forgotten class; it is defined for class-wise "
                         "forgetting only (config key 'recognizer.methods.run')")


def nearest_incorrect_labels(model, x: torch.Tensor, y: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Chen et al. Section 3.2: the label the original model gives the FGSM neighbour x + epsilon sign(grad_x CE),
    the true label excluded."""
    frozen = frozen_copy(model)
    x_adv = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(nn.functional.cross_entropy(frozen(x_adv), y), x_adv)
    with torch.no_grad():
        logits = frozen(x + epsilon * grad.sign())
        logits[torch.arange(len(y)), y] = float("-inf")
        return logits.argmax(1)


def _fit(model, x, y, settings: dict, rng: np.random.Generator) -> None:
    opt = adam(model.parameters(), settings["lr"])
    model.train()
    for _ in range(settings["epochs"]):
        for idx in epoch_batches(len(y), settings["batch_size"], rng):
            step(opt, ce(model, x[idx], y[idx]))


def boundary_shrink(original, problem: Problem, settings: dict, seed: int):
    _classwise_only(problem, "Boundary Shrink")
    model = fresh_copy(original)
    labels = nearest_incorrect_labels(original, problem.x_forget, problem.y_forget, settings["epsilon"])
    _fit(model, problem.x_forget, labels, settings, np.random.default_rng([seed, _SHRINK]))
    return model.eval(), {"b_shrink_labels": int(len(labels.unique()))}


def boundary_expand(original, problem: Problem, settings: dict, seed: int):
    _classwise_only(problem, "Boundary Expanding")
    model = fresh_copy(original)
    head = model.head
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, _SHADOW))
        widened = nn.Linear(head.in_features, head.out_features + 1)
    with torch.no_grad():
        widened.weight[:-1].copy_(head.weight)
        widened.bias[:-1].copy_(head.bias)
    model.head = widened
    shadow = torch.full_like(problem.y_forget, head.out_features)
    _fit(model, problem.x_forget, shadow, settings, np.random.default_rng([seed, _EXPAND]))
    pruned = copy.deepcopy(head)
    with torch.no_grad():
        pruned.weight.copy_(widened.weight[:-1])
        pruned.bias.copy_(widened.bias[:-1])
    model.head = pruned
    return model.eval(), {}
