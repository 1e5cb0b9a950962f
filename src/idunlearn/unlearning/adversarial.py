"""Embedding search for an identity condition under which a model still denoises a person's real images: the core
of the audit's embedding attack (audit/attack.py) and of the robust PIU's inner attack (unlearning/piu_robust.py).

UnlearnDiffAtk's objective (Zhang et al. 2024: minimise the unlearned model's denoising loss on images of the erased
concept) moved from prompt tokens to the identity embedding: a unit condition e, parametrised as z / ||z||, minimises
||eps - eps_theta(x_t, t, c(e))||^2 over real images x0 at timesteps in [t_low, t_high], optionally plus
``recognizer_weight`` (1 - cos(R(x0_hat), centre)) on the one-step estimate x0_hat (PIU appendix eq. 46) through a
differentiable recognizer R, and optionally kept inside the cosine ball cos(e, centre) >= ``min_cosine``.

Settings (``cfg``): steps, lr, batch, t_low, t_high, min_cosine (None: no ball), recognizer_weight. Only the
condition is optimised (gradients reach no model parameter), so a search may run inside a training loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch.nn.functional import mse_loss, normalize

from ..models.generator import IdentityGenerator
from .conditions import predicted_x0
from .wid import recognizer_input

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (x0, t, noise)


def project_to_ball(z: torch.Tensor, centre: torch.Tensor, min_cosine: float) -> torch.Tensor:
    """The unit vector nearest to z / ||z|| with cosine >= min_cosine to the unit ``centre`` (on the great circle
    through both)."""
    e = normalize(z, dim=0)
    cos = float(e @ centre)
    if cos >= min_cosine:
        return e
    ortho = e - cos * centre
    ortho = ortho / ortho.norm() if ortho.norm() > 1e-12 else torch.zeros_like(e)
    return min_cosine * centre + float(np.sqrt(1 - min_cosine ** 2)) * ortho


def attack_loss(generator: IdentityGenerator, sched, embedding: torch.Tensor, x0: torch.Tensor, t: torch.Tensor,
                noise: torch.Tensor, centre: torch.Tensor, recognizer, recognizer_weight: float) -> torch.Tensor:
    """Denoising loss of the condition ``embedding`` on (x0, t, noise) under the training scheduler ``sched``, plus
    the optional recognizer pull."""
    x_t = sched.add_noise(x0, noise, t)
    cond = generator.conditions(embedding.expand(len(x0), -1))
    eps = generator.predict_noise(x_t, t, cond)
    loss = mse_loss(eps.float(), noise.float())  # UnlearnDiffAtk's objective: the model's denoising loss
    if recognizer is not None and recognizer_weight > 0:
        s_hat = normalize(recognizer(recognizer_input(generator, predicted_x0(sched, x_t, t, eps))), dim=1)
        loss = loss + recognizer_weight * (1 - s_hat @ centre).mean()
    return loss


def image_batch(latents: torch.Tensor, cfg: dict, gen: torch.Generator) -> Batch:
    """``cfg['batch']`` real images drawn with replacement, timesteps in [t_low, t_high] and fresh noise."""
    n = cfg["batch"]
    rows = torch.randint(len(latents), (n,), generator=gen)
    t = torch.randint(cfg["t_low"], cfg["t_high"] + 1, (n,), generator=gen)
    return latents[rows], t, torch.randn((n, *latents.shape[1:]), generator=gen)


def centroid_and_random_starts(centre: torch.Tensor, cfg: dict, gen: torch.Generator
                               ) -> tuple[list[Callable[[], torch.Tensor]], set[int]]:
    """The audit attack's starts (the unit ``centre``, then ``cfg['restarts'] - 1`` random unit vectors drawn from
    ``gen`` in turn, between the batches) and its kept steps (``cfg['checkpoints']`` evenly spaced, the last at
    ``cfg['steps']``): ``search_conditions``'s ``starts`` and ``kept_steps``."""

    def random_start() -> torch.Tensor:
        return normalize(torch.randn(len(centre), generator=gen), dim=0)

    kept = {-(-cfg["steps"] * k // cfg["checkpoints"]) for k in range(1, cfg["checkpoints"] + 1)}  # ceil: last = steps
    return [centre.clone, *[random_start] * (cfg["restarts"] - 1)], kept


def search_conditions(generator: IdentityGenerator, latents: torch.Tensor, centre: torch.Tensor,
                      starts: Iterable[Callable[[], torch.Tensor]], cfg: dict, gen: torch.Generator,
                      recognizer=None, kept_steps: Iterable[int] = ()) -> list[dict]:
    """Run ``cfg['steps']`` Adam steps from each start (a callable drawing it when its turn comes, so that starts
    and batches share ``gen`` in a fixed order) on batches of ``latents``. The conditions after each step in
    ``kept_steps`` (the start itself when ``steps`` is 0) are the candidates, each scored on one evaluation batch
    drawn first, the same for all: dicts with restart, step, embedding (unit float32), loss and cosine to the unit
    ``centre``, in search order."""
    sched = generator.training_scheduler()
    evaluation = image_batch(latents, cfg, gen)  # the same for every candidate: the winner is chosen on like terms
    kept, candidates = set(kept_steps), []
    for restart, start_of in enumerate(starts):
        start = start_of()
        if cfg["min_cosine"] is not None:
            start = project_to_ball(start, centre, cfg["min_cosine"])
        z = start.clone().requires_grad_(True)
        optimiser = torch.optim.Adam([z], lr=cfg["lr"])
        for step in range(1, cfg["steps"] + 1):
            loss = attack_loss(generator, sched, normalize(z, dim=0), *image_batch(latents, cfg, gen), centre,
                               recognizer, cfg["recognizer_weight"])
            z.grad, = torch.autograd.grad(loss, [z])  # the condition only: the model's parameters get no gradient
            optimiser.step()
            if cfg["min_cosine"] is not None:
                with torch.no_grad():
                    z.copy_(project_to_ball(z, centre, cfg["min_cosine"]))
            if step in kept:
                candidates.append(_candidate(generator, sched, z, evaluation, centre, recognizer, cfg, restart, step))
        if cfg["steps"] == 0:  # no search: the start itself is the only candidate
            candidates.append(_candidate(generator, sched, z, evaluation, centre, recognizer, cfg, restart, 0))
    return candidates


def _candidate(generator: IdentityGenerator, sched, z: torch.Tensor, evaluation: Batch, centre: torch.Tensor,
               recognizer, cfg: dict, restart: int, step: int) -> dict:
    """The condition z / ||z|| kept as a candidate, with its loss on the evaluation batch."""
    with torch.no_grad():
        e = normalize(z.detach(), dim=0)
        loss = float(attack_loss(generator, sched, e, *evaluation, centre, recognizer, cfg["recognizer_weight"]))
    return {"restart": restart, "step": step, "embedding": e.numpy().astype(np.float32), "loss": loss,
            "cosine": float(e @ centre)}
