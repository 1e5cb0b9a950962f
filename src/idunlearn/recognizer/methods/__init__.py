"""Unlearning methods of the recognizer track, by name: ``original`` (no change), ``retrain`` (the reference, trained
from scratch on D_r), GSUO's baselines ``ft``, ``ga``, ``rl``, ``iu``, ``eu_k``, ``cf_k``, ``l1_sparse``, ``salun``,
``bad_t``, ``scrub`` and the class-wise ``b_shrink``, ``b_expand``, ``unsir`` (GSUO Appendix C), the SalUn-style
``rl_with_retain``, ``rl_eupmu`` and ``gsuo``.

Every method takes (original model, Problem, settings, seed) and returns (unlearned model, extra info); the original
model is never modified.
"""

from __future__ import annotations

from ..models import derive_seed
from ..training import train_from_scratch
from . import bad_teaching, baselines, boundary, eupmu, gsuo, influence, unsir
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
    "rl_with_retain": baselines.random_labels_with_retain,
    "iu": influence.influence_unlearning,
    "eu_k": baselines.exact_unlearning_k,
    "cf_k": baselines.catastrophic_forgetting_k,
    "salun": baselines.salun,
    "bad_t": bad_teaching.bad_teaching,
    "scrub": baselines.scrub,
    "l1_sparse": baselines.l1_sparse,
    "b_shrink": boundary.boundary_shrink,
    "b_expand": boundary.boundary_expand,
    "unsir": unsir.unsir,
    "rl_eupmu": eupmu.rl_eupmu,
    "gsuo": gsuo.unlearn,
}
# Methods defined for one task only (GSUO runs them on class-wise forgetting only): they act on a forgotten class.
CLASSWISE_ONLY = ("b_shrink", "b_expand", "unsir")


def applies(method: str, task: str) -> bool:
    """Whether ``method`` is defined for ``task`` (every method but the class-wise-only ones is defined for both)."""
    return task == "classwise" or method not in CLASSWISE_ONLY


def run_method(name: str, original, problem: Problem, settings: dict, seed: int):
    if name not in METHODS:
        raise ValueError(f"unknown recognizer method {name!r}; known: {', '.join(METHODS)} "
                         "(config key 'recognizer.methods')")
    return METHODS[name](original, problem, settings, seed)


__all__ = ["CLASSWISE_ONLY", "METHODS", "Problem", "applies", "run_method"]
