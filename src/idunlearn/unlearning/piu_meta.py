"""Relearning-resistant PIU: piu_robust trained against a simulated relearning attacker by
first-order meta-learning.

The idea of simulating the attacker's fine-tuning inside unlearning and taking the unlearning loss after it comes from
Meta-Unlearning (ICCV 2025) and ResAlign (NeurIPS 2025), both for prompt-based erasure; neither paper's text is in
/work/shared/papers, so what follows is our formulation for identity unlearning, not a transcription of theirs. The
first-order gradient (d theta' / d theta taken as the identity) is FOMAML's (Finn et al. 2017, first-order MAML).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from ..models.generator import IdentityGenerator
from ..models.layers import trainable_parameter_names
from .base import Objectives, UnlearningData
from .finetune import attacker_optimiser, finetune_step
from .piu import PIU
from .piu_robust import PIURobust

log = logging.getLogger(__name__)

META_STREAM = 37  # the simulated attacker's seed stream beside the run's seed (piu_robust's is 15)


def meta_seed(run_seed: int) -> int:
    """The simulated attacker's seed, hashed from the run's seed alone (numpy SeedSequence), as piu_robust's
    ``adversarial_seed`` but on a stream of its own: neither the batch streams', the inner attack's nor an evaluation
    or audit seed."""
    return int(np.random.SeedSequence([run_seed, META_STREAM]).generate_state(1)[0])


class AtParameters(nn.Module):
    """``unet`` run with the parameters named in ``tensors`` replaced by those tensors (torch.func.functional_call):
    the module's own parameters are neither read for those names nor changed."""

    def __init__(self, unet: nn.Module, tensors: dict[str, torch.Tensor]):
        super().__init__()
        self.unet, self.tensors = unet, tensors

    @property
    def config(self):  # IdentityGenerator.latent_shape reads the UNet's config
        return self.unet.config

    def forward(self, *args, **kwargs):
        return functional_call(self.unet, self.tensors, args, kwargs)


def at_parameters(generator: IdentityGenerator, tensors: dict[str, torch.Tensor]) -> IdentityGenerator:
    """A generator sharing ``generator``'s encoder and UNet modules whose UNet runs at ``tensors`` (``AtParameters``)."""
    return IdentityGenerator(generator.encoder, AtParameters(generator.unet, tensors), generator.scheduler_config,
                             generator.vae, generator.vae_scale)


def first_order(generator: IdentityGenerator, relearned: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The relearned values theta' (detached) carrying the gradient path of the trainable parameters theta:
    theta' + (theta - stop_grad(theta)) is theta' in value and has d / d theta = identity, so a loss taken at it
    hands d loss / d theta' to theta (first-order meta-gradient, FOMAML)."""
    own = dict(generator.unet.named_parameters())
    return {name: value + (own[name] - own[name].detach()) if own[name].requires_grad else value
            for name, value in relearned.items()}


class PIUMeta(PIURobust):
    """piu_robust (PIU eqs. 1-4 with its embedding adversary) plus a meta term: on meta steps (the first step, then
    every ``meta_every``-th) a simulated attacker fine-tunes a copy of the current parameters theta on the
    forget-train images (unlearning/finetune.py: the audit's relearning step, each image conditioned on its own
    embedding) for k steps at learning rate lr, k uniform in ``meta_inner_steps`` and lr log-uniform in
    ``meta_inner_lr``, drawn per round; the PIU objectives (forget eq. 2 toward the eq. 1 target with the adversarial
    conditions, preservation eq. 3) are then taken at the relearned theta' on a fresh batch and added with weight
    ``meta_weight``, their gradient at theta' applied to theta (``first_order``). The attacker changes the
    ``meta_regime`` parameters (the audit's relearning regime by default), the run its own regime.
    The attacker's draws (k, lr, its batches) and the meta term's batch come from a stream of their own
    (``meta_seed``); the sampled PIU batch and the inner embedding attack are piu_robust's. ``meta_weight`` 0 turns
    the meta term off: the run is then piu_robust bit for bit. ``meta_inner_steps`` [0, 0] keeps it on with an
    attacker that takes no step: the second PIU batch is then taken at theta itself, which separates what the extra
    batch does from what the meta-gradient does (the ablation ``piu_meta_at_theta`` in config/robust.yaml).

    params: piu_robust's, and meta_inner_steps, meta_inner_lr, meta_every, meta_weight, meta_batch, meta_regime.
    """

    name = "piu_meta"

    def __init__(self, params: dict):
        for key in ("meta_inner_steps", "meta_inner_lr"):
            low, high = params[key]
            if not 0 <= low <= high:
                raise ValueError(f"config key {key!r} ({[low, high]}): a range [low, high] with 0 <= low <= high")
        if params["meta_inner_lr"][0] <= 0:
            raise ValueError(f"config key 'meta_inner_lr' ({params['meta_inner_lr']}): learning rates must be > 0")
        super().__init__(params)
        self.meta_rng, self.meta_gen = None, None

    @property
    def meta_on(self) -> bool:
        return self.params["meta_weight"] > 0

    def start(self, seed: int) -> None:
        super().start(seed)
        self.meta_rng = np.random.default_rng(meta_seed(seed))
        self.meta_gen = torch.Generator().manual_seed(meta_seed(seed))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "meta_rng": self.meta_rng.bit_generator.state,
                "meta_gen": self.meta_gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.meta_rng.bit_generator.state = state["meta_rng"]
        self.meta_gen.set_state(state["meta_gen"])

    def objectives(self, generator: IdentityGenerator, teacher: nn.Module, data: UnlearningData,
                   rng: np.random.Generator, gen: torch.Generator) -> Objectives:
        # piu_robust's step at theta: PIU eqs. 2 and 3 with the adversarial conditions (counts the step, runs the
        # inner attack's round when due)
        plain = super().objectives(generator, teacher, data, rng, gen)
        if not self.meta_on or (self.step - 1) % self.params["meta_every"]:
            return plain
        (k_low, k_high), (lr_low, lr_high) = self.params["meta_inner_steps"], self.params["meta_inner_lr"]
        steps = int(self.meta_rng.integers(k_low, k_high + 1))
        lr = float(np.exp(self.meta_rng.uniform(np.log(lr_low), np.log(lr_high))))
        relearned = self.relearned(generator, data, steps, lr)
        # the same step's PIU objectives (eqs. 1-3, adversarial rows included) at theta', on the attacker's stream;
        # PIU.objectives, not piu_robust's: no second step count or attack round
        meta = PIU.objectives(self, at_parameters(generator, first_order(generator, relearned)), teacher, data,
                              self.meta_rng, self.meta_gen)
        w = self.params["meta_weight"]
        log.debug("step %d: attacker %d steps at lr %.2e; meta forget %.4f, retain %s", self.step, steps, lr,
                  meta.forget.item(), None if meta.retain is None else round(meta.retain.item(), 5))
        # meta-objective (first-order, after Meta-Unlearning / ResAlign): L(theta) + w L(theta'), each side of PIU
        # eq. 4 apart so that any optimiser combines them; forget: eq. 2 at theta plus w x eq. 2 at theta'
        forget = plain.forget + w * meta.forget
        retain = None if plain.retain is None else plain.retain + w * meta.retain  # eq. 3 likewise
        # the frozen teacher's eq. 2 on both batches, the same sum (the epsilon-constrained batch scale). No
        # retain_again: theta' moves with theta, so the same-batch re-measurement (optimiser eupmu) has no meaning
        return Objectives(forget, retain, forget_reference=plain.forget_reference + w * meta.forget_reference)

    def relearned(self, generator: IdentityGenerator, data: UnlearningData, steps: int,
                  lr: float) -> dict[str, torch.Tensor]:
        """The simulated attacker's parameters theta' (detached) after ``steps`` fine-tuning steps at ``lr`` from the
        current ones on the forget-train images, drawn from the attacker's stream: the ``meta_regime`` parameters
        relearned, the run's other trainable parameters as they are. The model itself is left untouched."""
        attacked = trainable_parameter_names(generator.unet, self.params["meta_regime"],
                                             self.params["surgical_blocks"])
        trainable = [name for name, p in generator.unet.named_parameters() if p.requires_grad]
        own = dict(generator.unet.named_parameters())
        # every trainable parameter gets a copy, so that the attacker's backward passes never reach the run's ones
        tensors = {name: own[name].detach().clone().requires_grad_(name in attacked)
                   for name in dict.fromkeys([*attacked, *trainable])}
        optimiser = attacker_optimiser([tensors[name] for name in attacked], lr)
        attacker = at_parameters(generator, tensors)
        latents = data.require("forget_latents", self.name)
        for _ in range(steps):
            finetune_step(attacker, optimiser, latents, data.forget_train, self.params["meta_batch"], self.meta_rng,
                          self.meta_gen)
        return {name: tensor.detach() for name, tensor in tensors.items()}
