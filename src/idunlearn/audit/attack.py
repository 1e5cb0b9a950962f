"""Embedding attack (forgetting audit, part 4): a white-box search for an identity condition from which the model
draws the forgotten person again.

UnlearnDiffAtk's objective (Zhang et al. 2024: minimise the unlearned model's denoising loss on images of the erased
concept) moved from prompt tokens to the identity embedding: a unit condition e, parametrised as z / ||z||, minimises
||eps - eps_theta(x_t, t, c(e))||^2 over the forget-train images x0 at timesteps in [t_low, t_high] (where identity
forms), optionally plus ``recognizer_weight`` (1 - cos(R(x0_hat), centroid)) on the one-step estimate x0_hat (PIU
appendix eq. 46) through a differentiable recognizer R, and optionally kept inside the cosine ball cos(e, centroid)
>= ``min_cosine``. Each restart (the centroid, then random starts) runs ``steps`` Adam steps and keeps
``checkpoints`` conditions evenly spaced along its path (the last one at its end; never the start). The candidate
with the lowest loss on a fixed evaluation batch wins (``select: loss``), or, for an attacker who may use a recognizer
(``select: recognizer``), the candidate whose condition draws the person best in a few samples of their own seeds: a
search that passes through the person and then drifts past keeps what it found. Fresh samples from the winner are
then verified: the attack success rate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch.nn.functional import mse_loss, normalize

from ..evaluation.samples import generate_samples, score_samples
from ..experiment import real_latents
from ..faces.analyser import FaceAnalyser
from ..identities import centroid_matrix
from ..models.generator import IdentityGenerator
from ..unlearning.conditions import predicted_x0
from ..unlearning.wid import recognizer_input
from .probes import AUDIT_SEED_OFFSET, control_identity
from .run import mean_row, share_row
from .verification import verified

ATTACK_SEED_OFFSET = 400_000  # samples drawn from an attack's condition: apart from every other sample's seeds


def _project_to_ball(z: torch.Tensor, centre: torch.Tensor, min_cosine: float) -> torch.Tensor:
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


def attack_condition(generator: IdentityGenerator, latents: torch.Tensor, centroid: np.ndarray, cfg: dict, seed: int,
                     recognizer=None) -> dict:
    """Search a condition for the identity of ``latents`` (its real images) whose centroid is ``centroid``.

    cfg: restarts (the first starts at the centroid), steps, checkpoints, lr, batch, t_low, t_high, min_cosine (None:
    no ball), recognizer_weight. Returns the candidate with the lowest evaluation loss: embedding (unit, float32), its
    cosine to the centroid, its loss on the evaluation batch, the restart and step it came from; ``candidates`` holds
    every checkpoint of every restart, ``restart_losses`` each restart's final loss."""
    generator.requires_grad_(False)
    centre = normalize(torch.as_tensor(np.asarray(centroid), dtype=torch.float32), dim=0)
    gen = torch.Generator().manual_seed(seed)
    sched, n = generator.training_scheduler(), cfg["batch"]

    def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = torch.randint(len(latents), (n,), generator=gen)
        t = torch.randint(cfg["t_low"], cfg["t_high"] + 1, (n,), generator=gen)
        return latents[rows], t, torch.randn((n, *latents.shape[1:]), generator=gen)

    evaluation = batch()  # the same for every candidate: the winner is chosen on like terms
    kept = {-(-cfg["steps"] * k // cfg["checkpoints"]) for k in range(1, cfg["checkpoints"] + 1)}  # ceil: last = steps
    candidates = []
    for restart in range(cfg["restarts"]):
        start = centre.clone() if restart == 0 else normalize(torch.randn(len(centre), generator=gen), dim=0)
        if cfg["min_cosine"] is not None:
            start = _project_to_ball(start, centre, cfg["min_cosine"])
        z = start.clone().requires_grad_(True)
        optimiser = torch.optim.Adam([z], lr=cfg["lr"])
        for step in range(1, cfg["steps"] + 1):
            loss = attack_loss(generator, sched, normalize(z, dim=0), *batch(), centre, recognizer,
                               cfg["recognizer_weight"])
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            if cfg["min_cosine"] is not None:
                with torch.no_grad():
                    z.copy_(_project_to_ball(z, centre, cfg["min_cosine"]))
            if step in kept:
                candidates.append(_candidate(generator, sched, z, evaluation, centre, recognizer, cfg, restart, step))
        if cfg["steps"] == 0:  # no search: the start itself is the only candidate
            candidates.append(_candidate(generator, sched, z, evaluation, centre, recognizer, cfg, restart, 0))
    best = min(candidates, key=lambda r: r["loss"])
    finals = [c["loss"] for c in candidates if c["step"] == cfg["steps"]]
    return {**best, "restart_losses": finals, "candidates": candidates}


def _candidate(generator: IdentityGenerator, sched, z: torch.Tensor, evaluation: tuple, centre: torch.Tensor,
               recognizer, cfg: dict, restart: int, step: int) -> dict:
    """The condition z / ||z|| kept as a candidate, with its loss on the evaluation batch."""
    with torch.no_grad():
        e = normalize(z.detach(), dim=0)
        loss = float(attack_loss(generator, sched, e, *evaluation, centre, recognizer, cfg["recognizer_weight"]))
    return {"restart": restart, "step": step, "embedding": e.numpy().astype(np.float32), "loss": loss,
            "cosine": float(e @ centre)}


def attack_rows(generator: IdentityGenerator, analyser: FaceAnalyser, centroids: pd.DataFrame, manifest: pd.DataFrame,
                faces: pd.DataFrame, labels: pd.DataFrame, selection: dict, cfg: dict, sampler_cfg: dict, tau: float,
                seed: int, recognizer=None, second=None) -> list[dict]:
    """The attack on the forget identity (probe ``attack``) and, as the control, on the first retain-validation
    identity (``attack_control``), each from its own real images (forget-train images; the control identity's
    images): the winner's samples verified as the attacked identity (fa), their ISM, the winner's cosine to the
    centroid and its loss; with ``second`` (an ``audit.second_recognizer.SecondRecognizer``) also the winner's samples
    under the independent recognizer (fa_second, ism_second)."""
    cents = dict(zip(centroids["identity"], centroid_matrix(centroids)))
    control, control_images = control_identity(selection, faces, labels)
    rows = []
    for index, (probe, identity, images) in enumerate((
            ("attack", selection["forget_identity"], sorted(selection["forget_train_images"])),
            ("attack_control", control, control_images[:len(selection["forget_train_images"])]))):
        found = attack_condition(generator, real_latents(generator, manifest, faces, images), cents[identity], cfg,
                                 seed + index, recognizer)
        base = seed + AUDIT_SEED_OFFSET + ATTACK_SEED_OFFSET + 1000 * index

        def scored_from(embedding: np.ndarray, n: int, first_seed: int) -> tuple[pd.DataFrame, np.ndarray]:
            table = pd.DataFrame({"sample_id": [f"{probe}_{i:02d}" for i in range(n)], "target_identity": identity,
                                  "seed": first_seed + np.arange(n)})
            drawn = generate_samples(generator, np.repeat(embedding[None], n, axis=0), table["seed"],
                                     sampler_cfg["steps"], sampler_cfg["guidance"], sampler_cfg["batch_size"])
            return score_samples(table, drawn, analyser, centroids, anchor_identity=None), drawn

        if cfg["select"] == "recognizer":  # the attacker checks each candidate condition with its recognizer
            found = max(found["candidates"], key=lambda r: scored_from(
                r["embedding"], cfg["select_samples"], base + 500)[0]["own_cosine"].mean())
        scored, drawn = scored_from(found["embedding"], cfg["samples"], base)  # fresh seeds: no selection bias
        rows += [share_row(probe, "best", "fa", verified(scored, tau)), mean_row(probe, "best", "ism",
                 scored["own_cosine"])]
        if second is not None:
            rows += second.rows(probe, "best", scored["target_identity"], drawn)
        rows += [{"probe": probe, "setting": "best", "metric": metric, "value": found[metric], "ci_low": float("nan"),
                  "ci_high": float("nan"), "n": 1} for metric in ("cosine", "loss")]
    return rows
