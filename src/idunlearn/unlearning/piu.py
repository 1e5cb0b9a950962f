"""PIU: proximity-guided identity unlearning (PIU paper, Section 3.2)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn.functional import mse_loss

from ..models.generator import IdentityGenerator
from .base import Objectives, UnlearningData, UnlearningMethod
from ..conditions import draw_rows
from .conditions import forget_conditions, noisy_latents

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (unit conditions, noisy latents x_t, timesteps t)


def negative_guidance_target(eps_ref: torch.Tensor, eps_forget: torch.Tensor, eta: float) -> torch.Tensor:
    """eps_hat = eps*(c_ref) - eta [eps*(c_f) - eps*(c_ref)] (PIU eq. 1; ESD's target with c_ref = unconditional)."""
    return eps_ref - eta * (eps_forget - eps_ref)


class PIU(UnlearningMethod):
    """Forget loss eq. 2 toward the anchor-guided target eq. 1; preservation loss eq. 3 on retain identities. Joint
    unlearning: the forget batch is shared among the forget identities, each condition steered to its own anchor.

    params: eta, forget_batch, retain_batch, dirichlet_k, dirichlet_alpha.
    """

    name = "piu"

    joint = True

    def reference_conditions(self, generator: IdentityGenerator, anchors: np.ndarray) -> torch.Tensor:
        """The conditions the forget conditions are steered to: their anchor centroids' (PIU Section 3.3),
        ``anchors`` (n, D) row for row."""
        return generator.conditions(torch.as_tensor(anchors, dtype=torch.float32))

    def extra_batch(self, generator: IdentityGenerator, side: str) -> Batch | None:
        """Unit conditions (n, D) with their noisy latents and timesteps, added to the sampled ``forget`` or
        ``retain`` batch (``side``); None: nothing added (PIU; piu_robust adds its adversarial conditions)."""
        return None

    def _joined(self, generator: IdentityGenerator, side: str, embeddings: np.ndarray, x_t: torch.Tensor,
                t: torch.Tensor) -> Batch:
        sampled, extra = (torch.from_numpy(embeddings), x_t, t), self.extra_batch(generator, side)
        return sampled if extra is None else tuple(torch.cat(pair) for pair in zip(sampled, extra))

    def objectives(self, generator: IdentityGenerator, teacher: nn.Module, data: UnlearningData,
                   rng: np.random.Generator, gen: torch.Generator) -> Objectives:
        p, sched, device = self.params, generator.training_scheduler(), generator.device
        n_f, n_r = p["forget_batch"], p["retain_batch"]
        forget_emb, anchors = forget_conditions(data, n_f, rng, p["dirichlet_k"], p["dirichlet_alpha"])
        forget_emb, x_t, t = self._joined(generator, "forget", forget_emb,
                                          *noisy_latents(sched, generator.latent_shape, n_f, gen, device))
        # added conditions (piu_robust, one forget identity) are steered to the anchor too
        anchors = np.concatenate([anchors, np.repeat(anchors[:1], len(forget_emb) - n_f, axis=0)])
        with torch.no_grad():  # the text encoder is frozen: conditions carry no gradient
            c_f = generator.conditions(forget_emb)
            c_ref = self.reference_conditions(generator, anchors)
            # frozen teacher: reference and forget predictions in one batched call
            eps_ref, eps_f = generator.predict_noise(torch.cat([x_t, x_t]), torch.cat([t, t]),
                                                     torch.cat([c_ref, c_f]), unet=teacher).chunk(2)
        target = negative_guidance_target(eps_ref, eps_f, p["eta"])
        forget = mse_loss(generator.predict_noise(x_t, t, c_f).float(), target.float())  # PIU eq. 2
        reference = mse_loss(eps_f.float(), target.float())  # PIU eq. 2 at the frozen teacher, same batch
        if not p.get("preserve", True):
            return Objectives(forget, None, forget_reference=reference)
        retain_emb = draw_rows(data.retain_train, n_r, rng)
        retain_emb, x_r, t_r = self._joined(generator, "retain", retain_emb,  # own latents and timesteps
                                            *noisy_latents(sched, generator.latent_shape, n_r, gen, device))
        with torch.no_grad():
            c_r = generator.conditions(retain_emb)
            eps_keep = generator.predict_noise(x_r, t_r, c_r, unet=teacher)
        # the re-measurement (EUPMU) runs under the autocast state of this measurement
        autocast = torch.autocast(device.type, dtype=torch.get_autocast_dtype(device.type),
                                  enabled=torch.is_autocast_enabled(device.type))

        def retain_loss() -> torch.Tensor:  # PIU eq. 3 on this step's retain batch at the current parameters
            with autocast:
                return mse_loss(generator.predict_noise(x_r, t_r, c_r).float(), eps_keep.float())

        return Objectives(forget, retain_loss(), retain_again=retain_loss, forget_reference=reference)
