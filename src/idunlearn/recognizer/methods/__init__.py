"""Unlearning methods of the recognizer track, by name: ``original`` (no change), ``retrain`` (the reference, trained
from scratch on D_r), ``ft``, ``ga``, ``rl``, ``salun``, ``scrub``, ``l1_sparse``, ``rl_eupmu`` and ``gsuo``.

Every method takes (original model, Problem, settings, seed) and returns (unlearned model, extra info); the original
model is never modified.
"""

from __future__ import annotations

from ..models import derive_seed
from ..training import train_from_scratch
from . import baselines, eupmu, gsuo
from .common import Problem, fresh_copy

_RETRAIN = 61


def _original(original, problem: Problem, settings: dict, seed: int):
    return fresh_copy(original).eval(), {}


def _retrain(original, problem: Problem, settings: dict, seed: int):
    """Retrain: the original model's recipe (architecture, epochs, optimiser) on D_r only, from a fresh
    initialisation."""
    r = problem.retrain
    model, _ = train_from_scratch(problem.x_retain, problem.y_retain, problem.n_classes, r["image_size"], r["model"],
                                  r["training"], derive_seed(seed, _RETRAIN), desc="retrain")
    return model, {}


METHODS = {
    "original": _original,
    "retrain": _retrain,
    "ft": baselines.finetune,
    "ga": baselines.gradient_ascent,
    "rl": baselines.random_labels,
    "salun": baselines.salun,
    "scrub": baselines.scrub,
    "l1_sparse": baselines.l1_sparse,
    "rl_eupmu": eupmu.rl_eupmu,
    "gsuo": gsuo.unlearn,
}


def run_method(name: str, original, problem: Problem, settings: dict, seed: int):
    if name not in METHODS:
        raise ValueError(f"unknown recognizer method {name!r}; known: {', '.join(METHODS)} "
                         "(config key 'recognizer.methods')")
    return METHODS[name](original, problem, settings, seed)


__all__ = ["METHODS", "Problem", "run_method"]
