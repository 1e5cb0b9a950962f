"""What an unlearning method is: forget and retain objectives over one training step's batch.

A method turns a sampled batch into two scalar losses; an optimiser (optimisers.py) turns the two into a parameter
update. Closed-form methods (no training loop) implement ``edit`` instead.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..models.generator import IdentityGenerator


@dataclass
class UnlearningData:
    """Identity embeddings of one experiment (from the selection stage)."""

    forget_train: np.ndarray  # (n_f, D) forget-train image embeddings
    retain_train: np.ndarray  # (n_r, D) embeddings of retain-train identities' images
    anchor_centroid: np.ndarray  # (D,) centroid of the anchor identity


@dataclass
class Objectives:
    forget: torch.Tensor
    retain: torch.Tensor | None  # None: the method has no retain term


class UnlearningMethod(abc.ABC):
    name: str

    def __init__(self, params: dict):
        self.params = params

    @abc.abstractmethod
    def objectives(self, generator: IdentityGenerator, teacher: nn.Module, data: UnlearningData,
                   rng: np.random.Generator, gen: torch.Generator) -> Objectives:
        """Sample one step's batch and return its forget and retain losses (differentiable in the student)."""
