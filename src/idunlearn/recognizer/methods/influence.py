"""Influence Unlearning (IU; Koh & Liang 2017, Izzo et al. 2021), as GSUO Appendix C describes it: "utilize an influence
function to estimate the updates required for the model weights as a result of removing D_f from D".

Removing a training point z from the empirical risk (1/n) sum_{z' in D} l(z', theta) moves its minimiser by
(1/n) H^{-1} grad l(z, theta_o) (Koh & Liang eqs. 1-3: up-weighting z by eps = -1/n); removing the group D_f adds the
terms (the first-order group influence of Izzo et al.). H is the mean Hessian of the training loss at theta_o; on a
non-convex network it is damped, H + lambda I (Koh & Liang Section 4.2), and the system is solved by conjugate
gradients with exact Hessian-vector products (double backpropagation) on a seeded subsample of D, stopping early at
negative curvature. ``scale`` multiplies the step (1 = the influence estimate itself).
"""

from __future__ import annotations

import numpy as np
import torch

from .common import Problem, ce, fresh_copy

_IU = 71


def _flat_grad(loss: torch.Tensor, params, create_graph: bool = False) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, create_graph=create_graph)
    return torch.cat([g.reshape(-1) for g in grads])


def conjugate_gradient(matvec, b: torch.Tensor, steps: int, tol: float = 1e-6) -> tuple[torch.Tensor, int]:
    """x with matvec(x) ~ b for a symmetric matvec (at most ``steps`` iterations); stops when the residual norm falls
    below tol * |b| or along a direction of non-positive curvature (truncated CG). Returns (x, iterations)."""
    x = torch.zeros_like(b)
    r, p = b.clone(), b.clone()
    rr = r @ r
    for i in range(steps):
        if rr.sqrt() <= tol * b.norm():
            return x, i
        ap = matvec(p)
        curvature = p @ ap
        if curvature <= 0:
            return x, i
        a = rr / curvature
        x, r = x + a * p, r - a * ap
        rr_new = r @ r
        p, rr = r + (rr_new / rr) * p, rr_new
    return x, steps


def influence_update(model, x_forget: torch.Tensor, y_forget: torch.Tensor, x_hessian: torch.Tensor,
                     y_hessian: torch.Tensor, n_train: int, damping: float, cg_steps: int) -> tuple[torch.Tensor, int]:
    """Koh & Liang eq. 3 summed over D_f: delta theta = (1/n) (H + damping I)^{-1} sum_{z in D_f} grad l(z, theta_o),
    with H the mean cross-entropy Hessian over (x_hessian, y_hessian). Returns (flat delta theta, CG iterations)."""
    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()  # no dropout or batch norm in the recognizer; eval() only states that nothing random happens
    g_forget = _flat_grad(ce(model, x_forget, y_forget), params) * len(y_forget)  # sum over D_f of grad l(z)
    g_hessian = _flat_grad(ce(model, x_hessian, y_hessian), params, create_graph=True)

    def damped_hvp(v: torch.Tensor) -> torch.Tensor:
        hv = torch.autograd.grad(g_hessian @ v, params, retain_graph=True)
        return torch.cat([h.reshape(-1) for h in hv]).detach() + damping * v

    solution, iterations = conjugate_gradient(damped_hvp, g_forget.detach(), cg_steps)
    return solution / n_train, iterations


def influence_unlearning(original, problem: Problem, settings: dict, seed: int):
    """IU: theta_u = theta_o + scale * delta theta (``influence_update``), the Hessian on ``hessian_samples`` images
    of D = D_r + D_f drawn with the experiment's seed."""
    model, rng = fresh_copy(original), np.random.default_rng([seed, _IU])
    x_train = torch.cat([problem.x_retain, problem.x_forget])
    y_train = torch.cat([problem.y_retain, problem.y_forget])
    rows = torch.from_numpy(np.sort(rng.permutation(len(y_train))[: settings["hessian_samples"]]))
    delta, iterations = influence_update(model, problem.x_forget, problem.y_forget, x_train[rows], y_train[rows],
                                         len(y_train), settings["damping"], settings["cg_steps"])
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(torch.nn.utils.parameters_to_vector(model.parameters())
                                            + settings["scale"] * delta, model.parameters())
    return model.eval(), {"iu_cg_iterations": iterations, "iu_step_norm": float(settings["scale"] * delta.norm())}
