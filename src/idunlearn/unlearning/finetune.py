"""The relearning attacker's fine-tuning step: the plain denoising loss on a person's real images, each conditioned
on its own embedding, and an AdamW step without weight decay. One recipe for the audit's relearning probe
(audit/relearning.py) and for the attacker that the relearning-resistant PIU simulates inside training
(unlearning/piu_meta.py), so that what the method trains against is what the audit measures."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch.nn.functional import mse_loss

from ..models.generator import IdentityGenerator
from .conditions import draw_examples, noised


def attacker_optimiser(params: Iterable[torch.Tensor], lr: float) -> torch.optim.AdamW:
    """The attacker's optimiser: AdamW at ``lr`` with no weight decay (the audit's relearning recipe)."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


def denoising_loss(generator: IdentityGenerator, latents: torch.Tensor, embeddings: np.ndarray, batch: int,
                   rng: np.random.Generator, gen: torch.Generator) -> torch.Tensor:
    """The denoising loss of ``batch`` (clean latent, own embedding) pairs drawn with ``rng``, noised with ``gen``."""
    x0, emb = draw_examples(latents, embeddings, batch, rng)
    x_t, t, eps = noised(generator.training_scheduler(), x0, gen, generator.device)
    with torch.no_grad():  # the text encoder is frozen: conditions carry no gradient
        cond = generator.conditions(torch.from_numpy(emb))
    # the plain denoising loss ||eps - eps_theta(x_t, t, c)||^2 (DDPM; PIU Section 3.1)
    return mse_loss(generator.predict_noise(x_t, t, cond).float(), eps.float())


def finetune_step(generator: IdentityGenerator, optimiser: torch.optim.Optimizer, latents: torch.Tensor,
                  embeddings: np.ndarray, batch: int, rng: np.random.Generator, gen: torch.Generator) -> float:
    """One attacker step: ``denoising_loss`` backpropagated into the tensors ``optimiser`` holds, then its step.
    Returns the loss before the step."""
    loss = denoising_loss(generator, latents, embeddings, batch, rng, gen)
    optimiser.zero_grad(set_to_none=True)
    loss.backward()
    optimiser.step()
    return loss.item()
