"""UNSIR (Tarun et al. 2024), class-wise only, as GSUO Appendix C describes it: "learn an error-maximizing noise matrix
for the class to be unlearned and use it to impair the forget class and repair the original model".

1. Noise: N = argmin_N -L(f(N), y_f) + lambda ||N||^2 per forget class (Tarun et al. eq. 1: maximise the model's loss
   on the forget label, the squared norm averaged over the noise images), ``noise_steps`` Adam steps at ``noise_lr``.
2. Impair: ``impair_epochs`` passes of cross-entropy over the noise (labelled with its forget class) together with
   ``retain_per_class`` retain images of every retained class, at the high ``impair_lr``.
3. Repair: ``repair_epochs`` passes over the same retain images at ``repair_lr``.
The forget images themselves are never used (the method only needs the forget class).
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from ..models import derive_seed
from .common import Problem, adam, ce, epoch_batches, fresh_copy, frozen_copy, step

_NOISE, _IMPAIR = 74, 75


def noise_objective(noise_logits: torch.Tensor, labels: torch.Tensor, noise: torch.Tensor,
                    weight: float) -> torch.Tensor:
    """Tarun et al. eq. 1: -CE(f(N), y_f) + weight * mean over noise images of ||N_i||^2."""
    return -torch.nn.functional.cross_entropy(noise_logits, labels) + weight * noise.pow(2).flatten(1).sum(1).mean()


def error_maximizing_noise(model, forget_classes, shape, settings: dict,
                           seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``noise_copies`` noise images per forget class, optimised against the frozen ``model``; (noise, labels)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.tensor([c for c in forget_classes for _ in range(settings["noise_copies"])], dtype=torch.int64)
    noise = torch.randn((len(labels), *shape), generator=generator).requires_grad_(True)
    frozen = frozen_copy(model)
    opt = adam([noise], settings["noise_lr"])
    for _ in range(settings["noise_steps"]):
        step(opt, noise_objective(frozen(noise), labels, noise, settings["noise_weight"]))
    return noise.detach(), labels


def retain_subset(y_retain: torch.Tensor, per_class: int, rng: np.random.Generator) -> np.ndarray:
    """Up to ``per_class`` seeded rows of every class present in the retain set, sorted."""
    y = y_retain.numpy()
    return np.sort(np.concatenate([rng.permutation(np.flatnonzero(y == c))[:per_class] for c in np.unique(y)]))


def _passes(model, x, y, epochs: int, lr: float, batch_size: int, rng: np.random.Generator, desc: str) -> None:
    opt = adam(model.parameters(), lr)
    model.train()
    for _ in tqdm(range(epochs), desc=desc, mininterval=5, leave=False):
        for idx in epoch_batches(len(y), batch_size, rng):
            step(opt, ce(model, x[idx], y[idx]))


def unsir(original, problem: Problem, settings: dict, seed: int):
    if problem.task != "classwise":
        raise ValueError("UNSIR learns noise for a forgotten class; it is defined for class-wise forgetting only "
                         "(config key 'recognizer.methods.run')")
    model = fresh_copy(original)
    noise, noise_labels = error_maximizing_noise(original, problem.forget_classes, tuple(problem.x_forget.shape[1:]),
                                                 settings, derive_seed(seed, _NOISE))
    rng = np.random.default_rng([seed, _IMPAIR])
    rows = torch.from_numpy(retain_subset(problem.y_retain, settings["retain_per_class"], rng))
    x_r, y_r = problem.x_retain[rows], problem.y_retain[rows]
    _passes(model, torch.cat([x_r, noise]), torch.cat([y_r, noise_labels]), settings["impair_epochs"],
            settings["impair_lr"], settings["batch_size"], rng, "unsir impair")
    _passes(model, x_r, y_r, settings["repair_epochs"], settings["repair_lr"], settings["batch_size"], rng,
            "unsir repair")
    return model.eval(), {"unsir_noise_images": len(noise_labels)}
