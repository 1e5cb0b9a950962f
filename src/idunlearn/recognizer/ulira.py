"""U-LiRA (Hayes et al. 2025) as GSUO Appendix C runs it, in its affordable form, on random-subset forgetting.

Per dataset, ``recognizer.ulira.n_shadows`` base shadow models are trained with the original recipe on seeded halves
of the pool (every image of the dataset, each in exactly half of them; ``mia.shadow_memberships`` and
``mia.shadow_models``, the offline LiRA's procedure under its own seed, since that stage keeps no weights). Per
experiment the target pool is GSUO's restricted sampling pool with its 1:1 balance built in: the request's forget set
D_f and as many test images drawn (seeded) from D_t. Shadow k forgets the pool images it trained on (about |D_f| of
them, the request's forget-set size, drawn from its own members) and is unlearned with the method under attack, with
its configured settings, through the same ``run_method`` call as the real request (Retrain: the recipe from scratch
on the shadow's members minus its forget set). Every pool image is thus "forgotten" in half of the shadows and
"unseen" in the other half, never retained. Per image, a Gaussian of the logit-scaled confidence in each state (pooled
variances, as ``mia.lira_scores`` does for few shadows) scores the real unlearned model: log N(phi; forgotten) -
log N(phi; unseen). ``ulira_auc``: AUC of D_f (positives) against the drawn test images (negatives); ``ulira_acc``:
the accuracy of LLR > 0 on the same balanced sides (``mia.llr_accuracy``). Retrain is the reference (about 0.5).
The Original model is not scored (nothing is unlearned: its "forgotten" state would be the trained one, which
today's LiRA already measures).

Cost: n_shadows unlearning runs per method and experiment, plus the target's own run (repeated here, deterministic,
so that the experiment stage keeps no model).
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pandas as pd

from ..config import ConfigError
from .data import ImageData
from .methods import Problem, applies, run_method
from .mia import (attack_auc, balanced_pair, lira_scores, llr_accuracy, logit_confidence, shadow_memberships,
                  shadow_models)
from .models import derive_seed
from .runs import Experiment, build_problem, experiment_config, method_settings
from .training import logits

_BASES, _POOL, _UNLEARN = 61, 62, 63
NOT_SCORED = {"original": "nothing is unlearned: the forgotten state would be the trained state (see mia_auc)"}
log = logging.getLogger(__name__)


def experiments(rcfg: dict) -> list[Experiment]:
    """The random-subset experiments U-LiRA attacks (``recognizer.ulira``; none when disabled); its datasets and
    seeds must be among the task's."""
    u, task = rcfg["ulira"], rcfg["tasks"]["random_subset"]
    if not u["enabled"]:
        return []
    seeds = task["seeds"] if u["seeds"] is None else u["seeds"]
    for key, chosen, known in (("datasets", u["datasets"], task["datasets"]), ("seeds", seeds, task["seeds"])):
        extra = sorted(set(chosen) - set(known))
        if extra:
            raise ConfigError(f"config key 'recognizer.ulira.{key}': {extra} not in recognizer.tasks.random_subset."
                              f"{key} {list(known)}: U-LiRA attacks the experiments the track runs")
    return [Experiment("random_subset", d, s) for d in u["datasets"] for s in seeds]


def methods(rcfg: dict) -> list[str]:
    """``recognizer.ulira.methods`` (null: every method of recognizer.methods.run) defined for random-subset."""
    chosen = rcfg["ulira"]["methods"] or rcfg["methods"]["run"]
    unknown = sorted(set(chosen) - set(rcfg["methods"]["run"]))
    if unknown:
        raise ConfigError(f"config key 'recognizer.ulira.methods': {unknown} not in recognizer.methods.run")
    return [m for m in rcfg["methods"]["run"] if m in chosen and applies(m, "random_subset")]


def job_config(rcfg: dict, dataset: str) -> dict:
    """What one U-LiRA job reads: the experiment's config, the attack's settings and the pooled-variance choice."""
    return {**experiment_config(rcfg, "random_subset", dataset),
            "mia": {"fixed_variance": rcfg["mia"]["fixed_variance"]},
            "ulira": {"n_shadows": rcfg["ulira"]["n_shadows"], "methods": methods(rcfg)}}


def bases_seed(config_seed: int) -> int:
    return derive_seed(config_seed, _BASES)


def train_bases(data: ImageData, settings: dict, n_shadows: int, config_seed: int) -> tuple[np.ndarray, list]:
    """The base shadow models: membership (K, N) and the K models."""
    seed = bases_seed(config_seed)
    membership = shadow_memberships(len(data.labels), n_shadows, seed)
    return membership, list(shadow_models(data, settings["model"], settings["training"], membership, seed))


def shadow_problem(data: ImageData, base, members: np.ndarray, forget: np.ndarray, template: Problem) -> Problem:
    """Shadow k's request: retain = its members minus ``forget`` (row indices), with the real request's task and
    Retrain recipe; the accuracy GSUO's boundary rule reads is the base's on the images it never saw."""
    retain = np.setdiff1d(np.flatnonzero(members), forget)
    x_r, y_r = data.tensors(retain)
    x_f, y_f = data.tensors(forget)
    x_u, y_u = data.tensors(np.flatnonzero(~members))
    unseen_accuracy = float((logits(base, x_u).argmax(1) == y_u).double().mean())
    return Problem(template.task, x_r, y_r, x_f, y_f, data.n_classes, [], unseen_accuracy, template.retrain)


def attack_experiment(data: ImageData, original, original_meta: dict, membership: np.ndarray, bases: list,
                      exp: Experiment, rcfg: dict, config_seed: int) -> pd.DataFrame:
    """One row per method of ``rcfg['ulira']['methods']``: ``ulira_auc``, ``ulira_acc`` and what they rest on."""
    if exp.task != "random_subset":
        raise ValueError(f"U-LiRA runs on random-subset forgetting, not {exp.task}")
    if membership.shape != (len(bases), len(data.labels)):
        raise ValueError("the U-LiRA base shadows do not match the image table; rerun recognizer_ulira_shadows")
    problem, sets, x_all, y_all, seed = build_problem(data, original_meta, exp, rcfg, config_seed)
    pos, neg = balanced_pair(len(sets["forget"]), len(sets["test"]), derive_seed(seed, _POOL))
    pool = np.r_[sets["forget"][pos], sets["test"][neg]]
    forgotten = membership[:, pool]  # shadow k forgets the pool images it trained on, the others it never saw
    x_pool, y_pool = x_all[pool], y_all[pool]
    problems = [shadow_problem(data, base, membership[k], pool[forgotten[k]], problem) for k, base in enumerate(bases)]
    rows = []
    for method in rcfg["ulira"]["methods"]:
        settings = method_settings(rcfg, exp.task, exp.dataset, method)
        row = {"task": exp.task, "dataset": exp.dataset, "experiment": exp.name, "seed": exp.seed, "method": method,
               "setting": "paper", "n_shadows": len(bases), "n_positive": len(pos), "n_negative": len(neg),
               "shadow_forget_min": int(forgotten.sum(1).min()), "shadow_forget_max": int(forgotten.sum(1).max()),
               "ulira_auc": float("nan"),
               "ulira_acc": float("nan"), "ulira_time_s": 0.0, "not_scored": NOT_SCORED.get(method, ""),
               "settings": json.dumps(settings, sort_keys=True)}
        if method not in NOT_SCORED:
            cpu_start = time.process_time()
            shadow_phi = np.stack([
                logit_confidence(logits(run_method(method, base, shadow, settings,
                                                   derive_seed(seed, _UNLEARN, k))[0], x_pool), y_pool)
                for k, (base, shadow) in enumerate(zip(bases, problems))])
            row["ulira_time_s"] = time.process_time() - cpu_start
            target, _ = run_method(method, original, problem, settings, seed)  # the experiment's own call
            # U-LiRA score (Hayes et al. 2025; GSUO App. C): log N(phi; forgotten) - log N(phi; unseen) per image
            scores = lira_scores(logit_confidence(logits(target, x_pool), y_pool), forgotten, shadow_phi,
                                 rcfg["mia"]["fixed_variance"])
            row["ulira_auc"] = attack_auc(scores[: len(pos)], scores[len(pos):])
            row["ulira_acc"] = llr_accuracy(scores[: len(pos)], scores[len(pos):])
            log.info("U-LiRA %s %s %s: AUC %.4f, accuracy %.4f (%.1f CPU s)", exp.dataset, exp.name, method,
                     row["ulira_auc"], row["ulira_acc"], row["ulira_time_s"])
        rows.append(row)
    return pd.DataFrame(rows)
