"""Optimisers turn (forget objective, retain objective) into a parameter update on the trainable parameters."""

from __future__ import annotations

import torch

from .base import Objectives


class WeightedSum:
    """L_total = L_forget + lambda * L_preserve (PIU eq. 4), one backward pass, AdamW base step."""

    name = "weighted_sum"

    def __init__(self, params: list[torch.nn.Parameter], cfg: dict):
        self.params = params
        self.lam = cfg["lambda"]
        self.adamw = torch.optim.AdamW(params, lr=cfg["lr"], betas=tuple(cfg["betas"]), eps=cfg["adam_eps"],
                                       weight_decay=cfg["weight_decay"])

    def step(self, objectives: Objectives) -> dict:
        total = objectives.forget if objectives.retain is None else objectives.forget + self.lam * objectives.retain
        if not torch.isfinite(total):
            raise FloatingPointError(f"non-finite loss (forget {objectives.forget.item()}, retain "
                                     f"{objectives.retain.item() if objectives.retain is not None else 'none'})")
        self.adamw.zero_grad(set_to_none=True)
        total.backward()
        self.adamw.step()
        return {"forget_loss": objectives.forget.item(),
                "retain_loss": objectives.retain.item() if objectives.retain is not None else float("nan"),
                "total_loss": total.item(), "backward_passes": 1}

    def state_dict(self) -> dict:
        return {"adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.adamw.load_state_dict(state["adamw"])


OPTIMISERS = {WeightedSum.name: WeightedSum}


def build_optimiser(params: list[torch.nn.Parameter], cfg: dict):
    try:
        cls = OPTIMISERS[cfg["optimiser"]]
    except KeyError:
        raise ValueError(f"optimiser {cfg['optimiser']!r} is unknown: use one of {', '.join(OPTIMISERS)}") from None
    return cls(params, cfg)
