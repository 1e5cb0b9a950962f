"""Inversion attack (held-out): a real photo of the person inverted to initial noise by the model itself
under the photo's own identity condition (deterministic DDIM run backwards: Song et al. 2021, eq. 13 integrated from
t = 0 upwards, as in Mokady et al. 2023's DDIM inversion), then regenerated from that noise by deterministic DDIM. An
attacker who holds one photo asks the unlearned model to redraw it: if the model still knows the person, the path
leads back to them. No seed: inversion and regeneration are deterministic. The first retain-validation identity is
the control (what the same attack does for a person the model was not made to forget), and the original model's
audit job is the control of the attack itself (it must redraw the person there).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..evaluation.generation import to_uint8_images
from ..evaluation.samples import score_samples
from ..experiment import real_latents
from ..faces.analyser import FaceAnalyser, ok_embeddings
from ..models.generator import IdentityGenerator
from ..runlog import logs_duration
from .probes import control_identity
from .trajectory import trajectory_rows


def ddim_timesteps(generator: IdentityGenerator, steps: int) -> list[int]:
    """The ``steps`` DDIM timesteps, ascending, evenly spaced from 0 ("leading" spacing, as DDIMScheduler)."""
    total = generator.training_scheduler().config.num_train_timesteps
    if not 2 <= steps <= total:
        raise ValueError(f"config key 'audit.probes.inversion.steps': {steps} must lie in [2, {total}]")
    return [i * (total // steps) for i in range(steps)]


def _eps(generator: IdentityGenerator, x: torch.Tensor, t: int, cond: torch.Tensor, guidance: float) -> torch.Tensor:
    """Classifier-free guided noise prediction (guidance 1: the conditional prediction alone)."""
    tt = torch.full((len(x),), t, device=generator.device)
    if guidance == 1.0:
        return generator.predict_noise(x, tt, cond)
    eps_u, eps_c = generator.predict_noise(torch.cat([x, x]), torch.cat([tt, tt]),
                                           torch.cat([generator.unconditional(len(x)), cond])).chunk(2)
    return eps_u + guidance * (eps_c - eps_u)


def _ddim_move(x: torch.Tensor, eps: torch.Tensor, alpha_from: float, alpha_to: float) -> torch.Tensor:
    # DDIM (Song et al. 2021, eq. 12 with sigma 0): x_to = sqrt(a_to) x0_hat + sqrt(1 - a_to) eps,
    # x0_hat = (x_from - sqrt(1 - a_from) eps) / sqrt(a_from); the same map in either direction. Unclipped: on the
    # mini model clipping x0_hat to the pixel range quadruples the round trip's error (0.007 -> 0.03 MSE at 50 steps)
    x0 = (x - (1 - alpha_from) ** 0.5 * eps) / alpha_from ** 0.5
    return alpha_to ** 0.5 * x0 + (1 - alpha_to) ** 0.5 * eps


@torch.no_grad()
def ddim_invert(generator: IdentityGenerator, x0: torch.Tensor, cond: torch.Tensor, steps: int) -> torch.Tensor:
    """Noise x_T from which deterministic DDIM under ``cond`` redraws ``x0``: each step up the schedule reuses the
    noise predicted at the current point (the usual first-order inversion)."""
    alphas = generator.training_scheduler().alphas_cumprod.double()
    x, alpha = x0.to(generator.device).double(), 1.0  # x0: "timestep -1", alpha_bar 1
    for t in ddim_timesteps(generator, steps):
        eps = _eps(generator, x.float(), t, cond, 1.0).double()
        x, alpha = _ddim_move(x, eps, alpha, float(alphas[t])), float(alphas[t])
    return x.float()


@torch.no_grad()
def ddim_regenerate(generator: IdentityGenerator, x_t: torch.Tensor, cond: torch.Tensor, steps: int,
                    guidance: float) -> torch.Tensor:
    """Deterministic DDIM sampling from ``x_t`` (at the top of the ``steps``-step schedule) down to a clean latent."""
    alphas = generator.training_scheduler().alphas_cumprod.double()
    grid = ddim_timesteps(generator, steps)
    x = x_t.to(generator.device).double()
    for i in reversed(range(len(grid))):
        eps = _eps(generator, x.float(), grid[i], cond, guidance).double()
        x = _ddim_move(x, eps, float(alphas[grid[i]]), float(alphas[grid[i - 1]]) if i else 1.0)
    return x.float()


def inversion_samples(generator: IdentityGenerator, analyser: FaceAnalyser, centroids: pd.DataFrame,
                      manifest: pd.DataFrame, faces: pd.DataFrame, identity: int, images: list[str], cfg: dict
                      ) -> pd.DataFrame:
    """Scored regenerations: each image inverted and regenerated under its own embedding."""
    x0 = real_latents(generator, manifest, faces, images)
    cond = generator.conditions(torch.as_tensor(np.stack(ok_embeddings(faces).loc[images].to_numpy())
                                                .astype(np.float32)))
    redrawn = ddim_regenerate(generator, ddim_invert(generator, x0, cond, cfg["steps"]), cond, cfg["steps"],
                              cfg["guidance"])
    table = pd.DataFrame({"sample_id": [f"inversion_{image}" for image in images], "setting": "regenerated",
                          "condition": images, "target_identity": identity})
    return score_samples(table, to_uint8_images(generator.decode(redrawn).cpu()), analyser, centroids,
                         anchor_identity=None)


@logs_duration("inversion attack")
def inversion_rows(generator: IdentityGenerator, analyser: FaceAnalyser, centroids: pd.DataFrame,
                   manifest: pd.DataFrame, faces: pd.DataFrame, labels: pd.DataFrame, selection: dict, cfg: dict,
                   tau: float) -> list[dict]:
    """ISM and FA of the regenerations of the first ``cfg['images']`` forget-validation photos (probe ``inversion``)
    and of as many photos of the first retain-validation identity (``inversion_control``)."""
    control, control_images = control_identity(selection, faces, labels)
    rows = []
    for probe, identity, images in (
            ("inversion", selection["forget_identity"], sorted(selection["forget_val_images"])[:cfg["images"]]),
            ("inversion_control", control, control_images[:cfg["images"]])):
        scored = inversion_samples(generator, analyser, centroids, manifest, faces, identity, images, cfg)
        rows += trajectory_rows(scored, probe, tau)
    return rows
