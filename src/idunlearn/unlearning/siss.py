"""SISS (Alberti et al.) in its No-IS form, adapted to identity-conditioned generators (PIU appendix C.1)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn.functional import mse_loss

from ..models.generator import IdentityGenerator
from .base import Objectives, UnlearningData, UnlearningMethod
from .conditions import draw_examples, noised


class SISS(UnlearningMethod):
    """Denoising losses on real images: the retain-train images under their own conditions (retain term) and the
    forget-train images under theirs (forget term, ascended). Objectives.forget is therefore the negated forget
    denoising loss; the ``siss_scaled`` optimiser turns the pair into g_retain - beta ||g_retain|| / ||g_forget||
    g_forget (PIU appendix eqs. 26-28). The paper runs the full UNet, AdamW lr 5e-6, weight decay 0.

    params: forget_batch, retain_batch.
    """

    name = "siss"
    needs = ("latents",)
    joint = True  # each forget image under its own condition: several identities' images mix without anchors

    def objectives(self, generator: IdentityGenerator, teacher: nn.Module, data: UnlearningData,
                   rng: np.random.Generator, gen: torch.Generator) -> Objectives:
        p, sched, device = self.params, generator.training_scheduler(), generator.device
        x_f, emb_f = draw_examples(data.require("forget_latents", self.name), data.forget_train, p["forget_batch"], rng)
        x_r, emb_r = draw_examples(data.require("retain_latents", self.name), data.retain_train, p["retain_batch"], rng)
        with torch.no_grad():  # the text encoder is frozen: conditions carry no gradient
            c_f, c_r = generator.conditions(torch.from_numpy(np.concatenate([emb_f, emb_r]))).split([len(emb_f),
                                                                                                     len(emb_r)])
        xt_f, t_f, eps_f = noised(sched, x_f, gen, device)
        xt_r, t_r, eps_r = noised(sched, x_r, gen, device)

        def retain_loss() -> torch.Tensor:  # L_retain = E ||eps - eps_theta(z_t, t, c_r)||^2 (PIU appendix eq. 25)
            return mse_loss(generator.predict_noise(xt_r, t_r, c_r).float(), eps_r.float())

        # L_forget = E ||eps - eps_theta(z_t, t, c_f)||^2 (PIU appendix eq. 25), ascended: its negative is minimised
        forget = -mse_loss(generator.predict_noise(xt_f, t_f, c_f).float(), eps_f.float())
        return Objectives(forget, retain_loss(), retain_again=retain_loss)
