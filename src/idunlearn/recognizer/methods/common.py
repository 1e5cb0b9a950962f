"""What every unlearning method of the recognizer track receives, and the small helpers they share."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch
from torch import nn

from ..models import RecognizerNet


@dataclass
class Problem:
    """One unlearning request: the retain set D_r and forget set D_f as tensors, and what the methods may know.

    ``task`` is ``random_subset`` or ``classwise``; ``forget_classes`` holds the forgotten class indices of a
    class-wise request. ``original_test_accuracy`` is the original model's reported test accuracy (GSUO's
    ``error_rate`` boundary rule sizes the Boundary set with it). ``retrain`` holds what Retrain needs to train from
    scratch (image size, model config, training recipe)."""

    task: str
    x_retain: torch.Tensor
    y_retain: torch.Tensor
    x_forget: torch.Tensor
    y_forget: torch.Tensor
    n_classes: int
    forget_classes: list[int] = field(default_factory=list)
    original_test_accuracy: float = float("nan")
    retrain: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.task not in ("random_subset", "classwise"):
            raise ValueError(f"unknown task {self.task!r}: use 'random_subset' or 'classwise'")
        if len(self.y_forget) == 0:
            raise ValueError("the forget set is empty")


def fresh_copy(model: RecognizerNet) -> RecognizerNet:
    student = copy.deepcopy(model)
    for p in student.parameters():
        p.requires_grad_(True)
    return student


def frozen_copy(model: RecognizerNet) -> RecognizerNet:
    teacher = copy.deepcopy(model).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def cycle(n: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Endless shuffled mini-batches of range(n), reshuffled after every pass."""
    while True:
        order = rng.permutation(n)
        for i in range(0, n, batch_size):
            yield order[i: i + batch_size]


def epoch_batches(n: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    order = rng.permutation(n)
    return [order[i: i + batch_size] for i in range(0, n, batch_size)]


def random_other_labels(y: torch.Tensor, n_classes: int, rng: np.random.Generator) -> torch.Tensor:
    """Random Labels (Graves et al. 2021): a label drawn uniformly among the C - 1 classes other than the true one."""
    shift = torch.from_numpy(rng.integers(1, n_classes, size=len(y)))
    return (y + shift) % n_classes


def adam(params, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=lr)


def step(opt: torch.optim.Optimizer, loss: torch.Tensor) -> float:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def ce(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)
