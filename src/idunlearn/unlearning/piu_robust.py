"""Robust PIU: PIU trained against its own embedding attack (AdvUnlearn's min-max idea moved from prompt
tokens to the identity condition)."""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn
from torch.nn.functional import normalize

from ..models.generator import IdentityGenerator
from .adversarial import search_conditions
from .base import Objectives, UnlearningData
from .conditions import noisy_latents
from .piu import PIU, Batch

log = logging.getLogger(__name__)

ADVERSARIAL_STREAM = 15  # the inner attack's seed stream beside the run's seed


def adversarial_seed(run_seed: int) -> int:
    """The inner attack's seed, hashed from the run's seed alone (numpy SeedSequence): never the run's seed itself,
    so neither the batch streams' seed nor an evaluation or audit seed (the config seed plus small offsets)."""
    return int(np.random.SeedSequence([run_seed, ADVERSARIAL_STREAM]).generate_state(1)[0])


def drifted_to_retain(conditions: torch.Tensor, forget_centre: torch.Tensor, retain_centroids: torch.Tensor,
                      margin: float) -> torch.Tensor:
    """Which unit ``conditions`` (n, D) sit nearer a retain identity than the forget identity: cosine to the nearest
    unit retain centroid (k, D) above the cosine to the unit forget centre by more than ``margin``. (n,) bool."""
    return (conditions @ retain_centroids.T).max(dim=1).values - conditions @ forget_centre > margin


class PIURobust(PIU):
    """PIU (eqs. 1-4) with adversarial forget conditions: after every ``attack_every`` updates, the embedding attack
    (adversarial.search_conditions: the audit's search) runs ``attack_steps`` Adam steps against the current student
    on the forget-train images, from the last round's ``adversarial_conditions`` conditions (the forget-train centre
    before the first round) and ``attack_restarts`` fresh random starts; the ``adversarial_conditions`` ending with
    the lowest denoising loss are kept. Until the next round every step adds them to its batch: those nearer the
    forget identity to the forget batch, with PIU's anchor-guided target (eq. 1, the frozen teacher at those
    conditions), those that drifted towards a retain identity (``drifted_to_retain``: retain-train centroids,
    anchor included) to the retain batch with the preservation target (eq. 3), so that robustness is not bought
    with collateral. The sampled PIU batch is the same as PIU's; the search, its starts and the added rows' noise
    draw from a stream of their own (``adversarial_seed``). ``attack_every`` null: exactly PIU.

    params: PIU's, and attack_every, attack_steps, attack_restarts, adversarial_conditions, attack_lr, attack_batch,
    attack_t_low, attack_t_high, attack_min_cosine (ball around the forget-train centre; null: none),
    attack_recognizer_weight, retain_drift_margin.
    """

    name = "piu_robust"
    joint = False  # its inner attack searches around one forget identity's centre

    def __init__(self, params: dict):
        if params["attack_t_low"] > params["attack_t_high"]:
            raise ValueError(f"config keys 'attack_t_low' ({params['attack_t_low']}) and 'attack_t_high' "
                             f"({params['attack_t_high']}): the low end of the attack's timesteps must not exceed the "
                             "high end")
        super().__init__(params)
        # real forget-train images for the search; the recognizer for its pull
        self.needs = ("latents", "recognizer") if params["attack_recognizer_weight"] > 0 else ("latents",)
        self.search = {"steps": params["attack_steps"], "lr": params["attack_lr"], "batch": params["attack_batch"],
                       "t_low": params["attack_t_low"], "t_high": params["attack_t_high"],
                       "min_cosine": params["attack_min_cosine"],
                       "recognizer_weight": params["attack_recognizer_weight"]}
        self.step, self.adversarial, self.retain_side, self.gen = 0, None, None, None

    def start(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(adversarial_seed(seed))

    def state_dict(self) -> dict:
        return {"step": self.step, "adversarial": self.adversarial, "retain_side": self.retain_side,
                "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.adversarial, self.retain_side = state["step"], state["adversarial"], state["retain_side"]
        self.gen.set_state(state["gen"])

    def objectives(self, generator: IdentityGenerator, teacher: nn.Module, data: UnlearningData,
                   rng: np.random.Generator, gen: torch.Generator) -> Objectives:
        if self.gen is None:
            raise RuntimeError("method 'piu_robust': call start(seed) before the first step (the run loop does)")
        self.step += 1
        every = self.params["attack_every"]
        if every is not None and self.step > 1 and (self.step - 1) % every == 0:
            self._attack(generator, data)
        return super().objectives(generator, teacher, data, rng, gen)

    def extra_batch(self, generator: IdentityGenerator, side: str) -> Batch | None:
        if self.adversarial is None:
            return None
        rows = self.adversarial[self.retain_side == (side == "retain")]
        if not len(rows):
            return None
        return rows, *noisy_latents(generator.training_scheduler(), generator.latent_shape, len(rows), self.gen,
                                    generator.device)

    def _attack(self, generator: IdentityGenerator, data: UnlearningData) -> None:
        """One round of the inner attack against the current student; keeps its best conditions and their side."""
        p = self.params
        centre = normalize(torch.as_tensor(data.forget_train.mean(axis=0), dtype=torch.float32), dim=0)
        recognizer = data.require("recognizer", self.name) if p["attack_recognizer_weight"] > 0 else None
        warm = [centre] if self.adversarial is None else list(self.adversarial)

        def fresh() -> torch.Tensor:
            return normalize(torch.randn(len(centre), generator=self.gen), dim=0)

        starts = [*(e.clone for e in warm), *[fresh] * p["attack_restarts"]]
        found = search_conditions(generator, data.require("forget_latents", self.name), centre, starts, self.search,
                                  self.gen, recognizer, kept_steps=(p["attack_steps"],))
        best = sorted(found, key=lambda c: c["loss"])[:p["adversarial_conditions"]]
        self.adversarial = torch.from_numpy(np.stack([c["embedding"] for c in best]))
        retain = np.vstack([data.anchor_centroid, data.require("retain_centroids", self.name)])
        retain = normalize(torch.as_tensor(retain, dtype=torch.float32), dim=1)
        self.retain_side = drifted_to_retain(self.adversarial, centre, retain, p["retain_drift_margin"])
        log.info("step %d: inner attack kept %d conditions (loss %s, cosine to the forget centre %s), %d on the "
                 "retain side", self.step, len(best), [round(c["loss"], 4) for c in best],
                 [round(c["cosine"], 3) for c in best], int(self.retain_side.sum()))
