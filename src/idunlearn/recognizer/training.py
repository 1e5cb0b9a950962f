"""Training of the original classifier and of the retrain reference (the same recipe on the retain set only),
plus the small shared helpers: seeded batches, augmentation, logits and accuracy."""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from .models import RecognizerNet, build_model, derive_seed

_INIT, _BATCHES = 21, 22


def batches(n: int, batch_size: int, rng: np.random.Generator, shuffle: bool = True) -> list[np.ndarray]:
    order = rng.permutation(n) if shuffle else np.arange(n)
    return [order[i: i + batch_size] for i in range(0, n, batch_size)]


def augment(x: torch.Tensor, rng: np.random.Generator, shift: int = 0, flip: bool = False) -> torch.Tensor:
    """Random translation by up to ``shift`` pixels (zero padding) and random horizontal flips, per image."""
    if flip:
        mask = torch.from_numpy(rng.random(len(x)) < 0.5).view(-1, 1, 1, 1)
        x = torch.where(mask, x.flip(-1), x)
    if shift > 0:
        h, w = x.shape[-2:]
        padded = nn.functional.pad(x, (shift, shift, shift, shift), value=-1.0)  # -1 is black after normalisation
        offsets = torch.from_numpy(rng.integers(0, 2 * shift + 1, size=(len(x), 2)))
        rows = (offsets[:, 0, None] + torch.arange(h)[None, :])[:, :, None]  # (B, H, 1)
        cols = (offsets[:, 1, None] + torch.arange(w)[None, :])[:, None, :]  # (B, 1, W)
        x = padded.permute(0, 2, 3, 1)[torch.arange(len(x))[:, None, None], rows, cols].permute(0, 3, 1, 2)
    return x


@torch.no_grad()
def logits(model: nn.Module, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    model.eval()
    return torch.cat([model(x[i: i + batch_size]) for i in range(0, len(x), batch_size)]) if len(x) else \
        torch.zeros((0, model.head.out_features))


@torch.no_grad()
def features(model: RecognizerNet, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    model.eval()
    return torch.cat([model.features(x[i: i + batch_size]) for i in range(0, len(x), batch_size)])


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy in [0, 1]; NaN for an empty set."""
    if len(y) == 0:
        return float("nan")
    return float((logits(model, x).argmax(1) == y).double().mean())


def train_classifier(model: nn.Module, x: torch.Tensor, y: torch.Tensor, settings: dict, seed: int,
                     desc: str = "train") -> list[float]:
    """Adam on cross-entropy for ``settings['epochs']`` epochs of shuffled, augmented mini-batches (seeded), with a
    constant or cosine learning rate; returns the mean loss per epoch."""
    rng = np.random.default_rng([seed, _BATCHES])
    opt = torch.optim.Adam(model.parameters(), lr=settings["lr"], weight_decay=settings["weight_decay"])
    aug = settings.get("augment", {})
    steps = settings["epochs"] * -(-len(x) // settings["batch_size"])
    schedule = settings.get("schedule", "constant")
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"unknown learning-rate schedule {schedule!r}: use 'constant' or 'cosine' "
                         "(config key 'recognizer.<dataset>.training.schedule')")
    # cosine: lr_t = lr * (1 + cos(pi t / T)) / 2 over the T optimisation steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: 0.5 * (1.0 + math.cos(math.pi * min(t, steps) / steps)) if schedule == "cosine" else 1.0)
    history = []
    model.train()
    for _ in tqdm(range(settings["epochs"]), desc=desc, mininterval=5, leave=False):
        total = 0.0
        for idx in batches(len(x), settings["batch_size"], rng):
            xb = augment(x[idx], rng, aug.get("shift", 0), aug.get("flip", False))
            loss = nn.functional.cross_entropy(model(xb), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        history.append(total / max(len(x), 1))
    model.eval()
    return history


def train_from_scratch(x: torch.Tensor, y: torch.Tensor, n_classes: int, image_size: int, model_cfg: dict,
                       settings: dict, seed: int, desc: str = "train") -> tuple[RecognizerNet, dict]:
    """A new classifier trained on (x, y): the original model on D, the retrain reference on D_r, or a shadow model.
    Returns the model and {'seconds', 'final_loss'}."""
    start = time.perf_counter()
    model = build_model(n_classes, image_size, model_cfg, derive_seed(seed, _INIT))
    history = train_classifier(model, x, y, settings, seed, desc)
    return model, {"seconds": time.perf_counter() - start, "final_loss": history[-1] if history else float("nan")}
