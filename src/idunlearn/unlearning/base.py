"""What an unlearning method is: forget and retain objectives over one training step's batch.

A method turns a sampled batch into two scalar losses; an optimiser (optimisers.py) turns the two into a parameter
update. Closed-form methods (no training loop) implement ``edit`` instead.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..models.generator import IdentityGenerator


@dataclass
class UnlearningData:
    """Identity embeddings of one experiment (from the selection stage), and what some methods need besides:
    real images as clean generator latents (row i pairs with embedding row i) and a differentiable recognizer.

    Joint unlearning of N identities in one run: ``forget_train`` holds every forget identity's rows, ``forget_groups``
    says whose each row is and ``anchor_centroids`` holds each identity's own anchor (PIU eq. 6); ``anchor_centroid``
    is then the first identity's. With one identity both are None."""

    forget_train: np.ndarray  # (n_f, D) forget-train image embeddings
    retain_train: np.ndarray  # (n_r, D) embeddings of retain-train identities' images
    anchor_centroid: np.ndarray  # (D,) centroid of the anchor identity
    retain_centroids: np.ndarray | None = None  # (k, D) centroids of the retain-train identities except the anchor(s)
    forget_groups: np.ndarray | None = None  # joint: (n_f,) index g < N of the forget identity of each forget_train row
    anchor_centroids: np.ndarray | None = None  # joint: (N, D) row g the anchor centroid of forget identity g
    # joint: (N,) relative share of the forget batch of each identity (None: equal shares); a sequential step with
    # replay gives its new identity the run's forget batch and the earlier ones the replay batch between them
    group_weights: np.ndarray | None = None
    forget_latents: torch.Tensor | None = None  # (n_f, *latent_shape) the forget-train images
    retain_latents: torch.Tensor | None = None  # (n_r, *latent_shape) the retain-train images
    anchor_latents: torch.Tensor | None = None  # (n_a, *latent_shape) the anchor identity's images
    # (N, 3, 112, 112) float RGB in [0, 255] -> (N, d) raw embeddings, differentiable in its input
    recognizer: nn.Module | None = None

    def anchors(self) -> np.ndarray:
        """(N, D) the anchor centroid of each forget identity (N = 1 without groups)."""
        return self.anchor_centroid[None] if self.forget_groups is None else self.anchor_centroids

    def groups(self) -> np.ndarray:
        """(n_f,) the forget identity (index into ``anchors()``) of each forget_train row."""
        return np.zeros(len(self.forget_train), int) if self.forget_groups is None else self.forget_groups

    def require(self, field: str, method: str) -> torch.Tensor | np.ndarray | nn.Module:
        value = getattr(self, field)
        if value is None:
            raise ValueError(f"method {method!r} needs UnlearningData.{field}; build the data with "
                             f"idunlearn.experiment.unlearning_data for this method (its `needs`)")
        return value


@dataclass
class Objectives:
    """One step's objectives; every optimiser minimises both (a method that ascends a loss returns its negative)."""

    forget: torch.Tensor
    retain: torch.Tensor | None  # None: the method has no retain term
    # the retain loss recomputed on this step's retain batch at the current parameters (EUPMU's same-batch
    # measurement after the update); None where the method cannot recompute it
    retain_again: Callable[[], torch.Tensor] | None = None
    # the forget objective of the frozen teacher (the run's starting model) on this step's forget batch, without
    # gradient: the scale of the epsilon-constrained optimiser's batch-relative bound; None where a method has none
    forget_reference: torch.Tensor | None = None


class UnlearningMethod(abc.ABC):
    name: str
    joint = False  # True: the method unlearns several identities in one run (UnlearningData.forget_groups)

    def __init__(self, params: dict):
        self.params = params

    @abc.abstractmethod
    def objectives(self, generator: IdentityGenerator, teacher: nn.Module, data: UnlearningData,
                   rng: np.random.Generator, gen: torch.Generator) -> Objectives:
        """Sample one step's batch and return its forget and retain losses (differentiable in the student)."""

    def start(self, seed: int) -> None:
        """Called by the run loop before its first step with the run's seed: a method with random state of its
        own (piu_robust's inner attack) seeds it here, apart from the batch streams."""

    def state_dict(self) -> dict:
        """The method's own state that a resumed run needs besides the weights and batch streams (none here)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned (called after ``start`` on resume)."""


class ClosedFormMethod(abc.ABC):
    """A method that edits the weights in one solve, without a training loop (UCE)."""

    name: str
    joint = False  # as UnlearningMethod.joint

    def __init__(self, params: dict):
        self.params = params

    @abc.abstractmethod
    def edit(self, generator: IdentityGenerator, data: UnlearningData, trainable: dict[str, nn.Parameter],
             rng: np.random.Generator) -> dict:
        """Edit ``trainable`` (the run's regime) in place; return the loss-log row of the edit."""
