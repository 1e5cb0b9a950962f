"""RL with EUPMU (EUPMU paper, Table 4): the Random-Labels unlearning loss l_u (cross-entropy of D_f against random
other labels), with the retain loss l_r (cross-entropy on D_r) added under an implicitly updated weight lambda_t
(implicit unilateral gradient surgery, one backward pass per step):
    d_t = grad( l_u(theta_t) + lambda_t * l_r(theta_t) ),  theta_{t+1} = theta_t - alpha * d_t   (Algorithm 1, 3-4)
    delta_t = (l_r(theta_t) - l_r(theta_{t+1})) / alpha + epsilon                                  (eq. 8)
    lambda_{t+1} = min(D, max(0, lambda_t - beta * delta_t))                                       (Algorithm 1, 2)
with l_r measured twice on the same retain batch (EUPMU, not EUPMU-fast).

``optimiser: adamw`` uses the project's optimiser layer (``idunlearn.unlearning.optimisers.EUPMU``, an AdamW base step
along d_t, as in the generator track; weight decay 0 here); ``sgd`` is Algorithm 1's plain gradient step with the
small local helper below. On this small un-normalised CNN the plain step lets RL's large random-label gradients
wreck the model within a few steps, hence the AdamW default.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from .common import Problem, ce, cycle, epoch_batches, fresh_copy, random_other_labels

_EUPMU = 51


class ImplicitRetainWeight:
    """The retain weight lambda of EUPMU, updated without extra backward passes (eq. 8, clipped to [0, D])."""

    def __init__(self, lr: float, beta: float, epsilon: float, max_weight: float, weight: float = 0.0):
        self.lr, self.beta, self.epsilon, self.max_weight, self.weight = lr, beta, epsilon, max_weight, weight

    def update(self, retain_before: float, retain_after: float) -> float:
        # EUPMU eq. 8: delta = (l_r(theta_t) - l_r(theta_{t+1})) / alpha + epsilon; lambda <- clip(lambda - beta delta)
        delta = (retain_before - retain_after) / self.lr + self.epsilon
        self.weight = min(self.max_weight, max(0.0, self.weight - self.beta * delta))
        return self.weight


class _SGDStep:
    """Algorithm 1 with plain SGD: step(l_u, l_r, recompute) -> lambda used for this step."""

    def __init__(self, model, settings: dict):
        self.opt = torch.optim.SGD(model.parameters(), lr=settings["lr"])
        self.weight = ImplicitRetainWeight(settings["lr"], settings["beta"], settings["epsilon"],
                                           settings["max_weight"], settings["initial_weight"])

    def step(self, l_u, l_r, recompute) -> float:
        lam = self.weight.weight
        self.opt.zero_grad(set_to_none=True)
        (l_u + lam * l_r).backward()
        self.opt.step()
        with torch.no_grad():
            self.weight.update(l_r.item(), recompute().item())
        return lam


class _SharedEUPMU:
    """The generator track's EUPMU optimiser (AdamW base step) on the classifier's parameters."""

    def __init__(self, model, settings: dict):
        from ...unlearning.base import Objectives
        from ...unlearning.optimisers import EUPMU

        self.objectives = Objectives
        cfg = {"lr": settings["lr"], "betas": [0.9, 0.999], "adam_eps": 1e-8, "weight_decay": 0.0, "grad_clip": None,
               "eupmu_alpha": settings["lr"], "eupmu_beta": settings["beta"], "eupmu_epsilon": settings["epsilon"],
               "eupmu_max_lambda": settings["max_weight"]}
        self.opt = EUPMU([p for p in model.parameters() if p.requires_grad], cfg)
        self.opt.state["lambda"] = float(settings["initial_weight"])

    def step(self, l_u, l_r, recompute) -> float:
        return self.opt.step(self.objectives(forget=l_u, retain=l_r, retain_again=recompute))["lambda_t"]


def rl_eupmu(original, problem: Problem, settings: dict, seed: int):
    """``epochs`` passes over D_f (relabelled at random once, batches of ``batch_size``); each step pairs a forget
    batch with a retain batch of ``retain_batch_size``; lambda starts at ``initial_weight`` (Algorithm 1: 0)."""
    model, rng = fresh_copy(original), np.random.default_rng([seed, _EUPMU])
    y_random = random_other_labels(problem.y_forget, problem.n_classes, rng)
    retain_batches = cycle(len(problem.y_retain), settings["retain_batch_size"], rng)
    kinds = {"sgd": _SGDStep, "adamw": _SharedEUPMU}
    if settings["optimiser"] not in kinds:
        raise ValueError(f"unknown optimiser {settings['optimiser']!r}: use 'adamw' or 'sgd' "
                         "(config key 'recognizer.methods.<task>.rl_eupmu.optimiser')")
    stepper = kinds[settings["optimiser"]](model, settings)
    weights = []
    model.train()
    for _ in tqdm(range(settings["epochs"]), desc="rl_eupmu", mininterval=5, leave=False):
        for idx in epoch_batches(len(problem.y_forget), settings["batch_size"], rng):
            r_idx = next(retain_batches)
            x_r, y_r = problem.x_retain[r_idx], problem.y_retain[r_idx]
            l_u = ce(model, problem.x_forget[idx], y_random[idx])
            weights.append(stepper.step(l_u, ce(model, x_r, y_r), lambda: ce(model, x_r, y_r)))
    return model.eval(), {"eupmu_mean_weight": float(np.mean(weights)) if weights else 0.0,
                          "eupmu_final_weight": weights[-1] if weights else 0.0}
