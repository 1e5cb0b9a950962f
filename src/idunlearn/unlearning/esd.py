"""ESD-style unlearning (Gandikota et al. 2023): PIU's objective with the unconditional reference."""

from __future__ import annotations

import numpy as np
import torch

from ..models.generator import IdentityGenerator
from .piu import PIU


class ESD(PIU):
    """The forget target eps*(c_ref) - eta [eps*(c_f) - eps*(c_ref)] of PIU eq. 1 with c_ref the unconditional
    condition (ESD's target; PIU Section 3.2 replaces it with the anchor), and no preservation term. The baseline
    run (config/study.yaml) trains the cross-attention layers only, as ESD-x.

    params: as PIU, with ``preserve`` false.
    """

    name = "esd"

    def __init__(self, params: dict):
        if params.get("preserve", True):
            raise ValueError("method 'esd' has no preservation term: set preserve: false in its unlearning.runs entry")
        super().__init__(params)

    def reference_conditions(self, generator: IdentityGenerator, anchors: np.ndarray) -> torch.Tensor:
        """The unconditional condition (the empty prompt, as classifier-free guidance uses), once per row."""
        return generator.unconditional(len(anchors))
