"""PIU: proximity-guided identity unlearning (PIU paper, Section 3.2)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn.functional import mse_loss

from ..models.generator import IdentityGenerator
from .base import Objectives, UnlearningData, UnlearningMethod
from ..conditions import dirichlet_mixtures, draw_rows
from .conditions import noisy_latents


def negative_guidance_target(eps_ref: torch.Tensor, eps_forget: torch.Tensor, eta: float) -> torch.Tensor:
    """eps_hat = eps*(c_ref) - eta [eps*(c_f) - eps*(c_ref)] (PIU eq. 1; ESD's target with c_ref = unconditional)."""
    return eps_ref - eta * (eps_forget - eps_ref)


class PIU(UnlearningMethod):
    """Forget loss eq. 2 toward the anchor-guided target eq. 1; preservation loss eq. 3 on retain identities.

    params: eta, forget_batch, retain_batch, dirichlet_k, dirichlet_alpha.
    """

    name = "piu"

    def reference_conditions(self, generator: IdentityGenerator, data: UnlearningData, n: int) -> torch.Tensor:
        """The condition the forget identity is steered to: the anchor centroid's (PIU Section 3.3)."""
        anchor = torch.as_tensor(np.repeat(data.anchor_centroid[None], n, axis=0), dtype=torch.float32)
        return generator.conditions(anchor)

    def objectives(self, generator: IdentityGenerator, teacher: nn.Module, data: UnlearningData,
                   rng: np.random.Generator, gen: torch.Generator) -> Objectives:
        p, sched, device = self.params, generator.training_scheduler(), generator.device
        n_f, n_r = p["forget_batch"], p["retain_batch"]
        forget_emb = dirichlet_mixtures(data.forget_train, n_f, rng, p["dirichlet_k"], p["dirichlet_alpha"])
        with torch.no_grad():  # the text encoder is frozen: conditions carry no gradient
            c_f = generator.conditions(torch.from_numpy(forget_emb))
            c_ref = self.reference_conditions(generator, data, n_f)
        x_t, t = noisy_latents(sched, generator.latent_shape, n_f, gen, device)
        with torch.no_grad():  # frozen teacher: reference and forget predictions in one batched call
            eps_ref, eps_f = generator.predict_noise(torch.cat([x_t, x_t]), torch.cat([t, t]),
                                                     torch.cat([c_ref, c_f]), unet=teacher).chunk(2)
        target = negative_guidance_target(eps_ref, eps_f, p["eta"])
        forget = mse_loss(generator.predict_noise(x_t, t, c_f).float(), target.float())  # PIU eq. 2
        if not p.get("preserve", True):
            return Objectives(forget, None)
        with torch.no_grad():
            c_r = generator.conditions(torch.from_numpy(draw_rows(data.retain_train, n_r, rng)))
        x_r, t_r = noisy_latents(sched, generator.latent_shape, n_r, gen, device)  # own latents and timesteps
        with torch.no_grad():
            eps_keep = generator.predict_noise(x_r, t_r, c_r, unet=teacher)
        # the re-measurement (EUPMU) runs under the autocast state of this measurement
        autocast = torch.autocast(device.type, dtype=torch.get_autocast_dtype(device.type),
                                  enabled=torch.is_autocast_enabled(device.type))

        def retain_loss() -> torch.Tensor:  # PIU eq. 3 on this step's retain batch at the current parameters
            with autocast:
                return mse_loss(generator.predict_noise(x_r, t_r, c_r).float(), eps_keep.float())

        return Objectives(forget, retain_loss(), retain_again=retain_loss)
