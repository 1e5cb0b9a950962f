"""One recognizer experiment: a forget set (a random ~10% of the training set for one seed, or one forget identity),
every configured method run on it from the same original model, and one metrics row per method.

Experiments are named ``seed<S>`` (random-subset) and ``id<I>-seed<S>`` (class-wise, I the forget identity of the
generator track's selection). Running all methods of one experiment in one job keeps Retrain and the methods under the
same machine load, so that the speedups compare like with like.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..config import ConfigError
from .data import ImageData, class_index, random_forget_set
from .methods import METHODS, Problem, applies, run_method
from .metrics import abs_diff, acc_index, add_speedup
from .mia import attack_auc, lira_scores, logit_confidence, svm_loss_attack
from .models import derive_seed
from .training import logits

TASKS = ("random_subset", "classwise")
DATASETS = ("orl", "fashion_mnist")
_TASK_TAG = {"random_subset": 81, "classwise": 82}
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Experiment:
    task: str
    dataset: str
    seed: int
    forget_identity: int | None = None

    @property
    def name(self) -> str:
        return f"seed{self.seed}" if self.forget_identity is None else f"id{self.forget_identity}-seed{self.seed}"

    @classmethod
    def parse(cls, task: str, dataset: str, name: str) -> "Experiment":
        m = re.fullmatch(r"(?:id(\d+)-)?seed(\d+)", name)
        if task not in TASKS or dataset not in DATASETS or m is None or (task == "classwise") != (m[1] is not None):
            raise ValueError(f"not a recognizer experiment: {task}/{dataset}/{name}")
        return cls(task, dataset, int(m[2]), None if m[1] is None else int(m[1]))


def experiments(rcfg: dict, forget_identities) -> list[Experiment]:
    """Every experiment the config asks for; class-wise ones for each forget identity (class-wise forgetting of
    Fashion-MNIST classes is not part of this track)."""
    out = []
    for dataset in rcfg["tasks"]["random_subset"]["datasets"]:
        out += [Experiment("random_subset", dataset, s) for s in rcfg["tasks"]["random_subset"]["seeds"]]
    for dataset in rcfg["tasks"]["classwise"]["datasets"]:
        if dataset != "orl":
            raise ConfigError("config key 'recognizer.tasks.classwise.datasets': class-wise forgetting is defined for "
                              f"the forget identities of the face data (orl), not {dataset!r}")
        out += [Experiment("classwise", dataset, s, int(i)) for i in forget_identities
                for s in rcfg["tasks"]["classwise"]["seeds"]]
    return out


def method_settings(rcfg: dict, task: str, dataset: str, method: str) -> dict:
    """``recognizer.methods.<task>.<method>`` updated by ``recognizer.<dataset>.method_overrides.<task>.<method>``."""
    if method not in METHODS:
        raise ConfigError(f"config key 'recognizer.methods.run': unknown method {method!r}; "
                          f"known: {', '.join(METHODS)}")
    base = dict(rcfg["methods"][task].get(method, {}))
    over = rcfg[dataset].get("method_overrides", {}).get(task, {}).get(method, {})
    unknown = set(over) - set(base)
    if unknown:
        raise ConfigError(f"config key 'recognizer.{dataset}.method_overrides.{task}.{method}': unknown setting(s) "
                          f"{sorted(unknown)}; known: {sorted(base)}")
    return {**base, **over}


def experiment_config(rcfg: dict, task: str, dataset: str) -> dict:
    """The part of the recognizer config one experiment reads (so that adding a seed or changing another dataset
    does not invalidate the experiments already run)."""
    return {dataset: {k: rcfg[dataset][k] for k in ("model", "training", "method_overrides")},
            "tasks": {task: {k: v for k, v in rcfg["tasks"][task].items() if k not in ("seeds", "datasets")}},
            "methods": {"run": rcfg["methods"]["run"], task: rcfg["methods"][task]}}


def index_sets(data: ImageData, exp: Experiment, rcfg: dict, config_seed: int) -> dict[str, np.ndarray]:
    """Row indices of D_r, D_f, D_t and, for class-wise forgetting, D_rt and D_ft."""
    train, test = data.train_idx, data.test_idx
    if exp.task == "random_subset":
        forget = random_forget_set(data, rcfg["tasks"]["random_subset"]["forget_fraction"], config_seed, exp.seed)
        return {"retain": np.setdiff1d(train, forget), "forget": forget, "test": test}
    c = class_index(data, exp.forget_identity)
    return {"retain": train[data.labels[train] != c], "forget": train[data.labels[train] == c], "test": test,
            "retain_test": test[data.labels[test] != c], "forget_test": test[data.labels[test] == c]}


def build_problem(data: ImageData, original_meta: dict, exp: Experiment, rcfg: dict, config_seed: int):
    """The unlearning request of ``exp``: (Problem, index sets, all images, all labels, the experiment's seed)."""
    sets = index_sets(data, exp, rcfg, config_seed)
    x_all, y_all = data.tensors(np.arange(len(data.labels)))
    forget_classes = [class_index(data, exp.forget_identity)] if exp.task == "classwise" else []
    ds_cfg = rcfg[exp.dataset]
    problem = Problem(exp.task, x_all[sets["retain"]], y_all[sets["retain"]], x_all[sets["forget"]],
                      y_all[sets["forget"]], data.n_classes, forget_classes,
                      original_test_accuracy=float(original_meta["acc_test"]),
                      retrain={"image_size": data.images.shape[-1], "model": ds_cfg["model"],
                               "training": ds_cfg["training"]})
    identity_tag = 0 if exp.forget_identity is None else exp.forget_identity + 1
    seed = derive_seed(config_seed, _TASK_TAG[exp.task], exp.seed, identity_tag)
    return problem, sets, x_all, y_all, seed


def method_row(method: str, settings: dict, original, problem: Problem, sets: dict, x_all, y_all, shadows: dict,
               exp: Experiment, seed: int) -> dict:
    """Run one method with ``settings`` on the request and evaluate it. ``time_s`` is the CPU time of the process
    during the unlearning itself (evaluation excluded; with one thread per job this is the compute, unaffected by
    other jobs sharing the machine), ``wall_s`` its wall-clock time."""
    start, cpu_start = time.perf_counter(), time.process_time()
    model, info = run_method(method, original, problem, settings, seed)
    cpu_seconds, seconds = time.process_time() - cpu_start, time.perf_counter() - start
    row = {"task": exp.task, "dataset": exp.dataset, "experiment": exp.name, "seed": exp.seed,
           "forget_identity": exp.forget_identity if exp.forget_identity is not None else -1,
           "method": method, "n_retain": len(sets["retain"]), "n_forget": len(sets["forget"]),
           "n_test": len(sets["test"]), **evaluate(model, x_all, y_all, sets, shadows, exp.task, seed),
           "time_s": cpu_seconds, "wall_s": seconds, "settings": json.dumps(settings, sort_keys=True),
           "info": json.dumps(info, sort_keys=True)}
    log.info("%s %s %s %s: %s", exp.task, exp.dataset, exp.name, method,
             ", ".join(f"{k} {row[k]:.4f}" for k in ("acc_retain", "acc_forget", "acc_test", "mia_auc", "time_s")))
    return row


def check_shadows(shadows: dict, data: ImageData) -> None:
    if not np.array_equal(shadows["ids"], data.ids):
        raise ValueError("the shadow models were trained on a different image table; rerun recognizer_shadows")


def run_experiment(data: ImageData, original, original_meta: dict, shadows: dict, exp: Experiment, rcfg: dict,
                   config_seed: int, tuned: dict | None = None) -> pd.DataFrame:
    """Every method of ``recognizer.methods.run`` defined for the task on one forget set; one row per method, with
    ``setting`` 'paper' (the configured settings) and the speedup against this experiment's Retrain, in CPU time.
    ``tuned`` (method -> settings) runs those methods with the tuning protocol's settings instead, ``setting`` 'tuned',
    without Retrain and without speedup (the caller takes Retrain's time from the paper-setting run)."""
    problem, sets, x_all, y_all, seed = build_problem(data, original_meta, exp, rcfg, config_seed)
    check_shadows(shadows, data)
    methods = [m for m in rcfg["methods"]["run"] if applies(m, exp.task) and (tuned is None or m in tuned)]
    rows = []
    for method in methods:
        settings = method_settings(rcfg, exp.task, exp.dataset, method) if tuned is None else tuned[method]
        rows.append({**method_row(method, settings, original, problem, sets, x_all, y_all, shadows, exp, seed),
                     "setting": "paper" if tuned is None else "tuned"})
    frame = pd.DataFrame(rows)
    return add_speedup(frame) if tuned is None else frame


def evaluate(model, x_all: torch.Tensor, y_all: torch.Tensor, sets: dict, shadows: dict, task: str,
             seed: int) -> dict:
    """Accuracies on each set, |Diff| and F_acc (random-subset), the two membership-inference AUCs (forget set
    against the unseen test images) and the SVM/loss attack success rate (its draws seeded by ``seed``)."""
    z = logits(model, x_all)
    correct = (z.argmax(1) == y_all).numpy()
    acc = {name: float(correct[idx].mean()) if len(idx) else float("nan") for name, idx in sets.items()}
    out = {"acc_retain": acc["retain"], "acc_forget": acc["forget"], "acc_test": acc["test"],
           "acc_retain_test": acc.get("retain_test", float("nan")),
           "acc_forget_test": acc.get("forget_test", float("nan"))}
    if task == "random_subset":
        out["diff"], out["f_acc"] = abs_diff(acc["forget"], acc["test"]), acc_index(acc["forget"], acc["test"])
    else:
        out["diff"] = out["f_acc"] = float("nan")
    phi = logit_confidence(z, y_all)
    rows = np.r_[sets["forget"], sets["test"]]
    scores = lira_scores(phi[rows], shadows["membership"][:, rows], shadows["phi"][:, rows])
    n_f = len(sets["forget"])
    out["mia_auc"] = attack_auc(scores[:n_f], scores[n_f:])
    log_p = torch.log_softmax(z.double(), 1)[torch.arange(len(y_all)), y_all].numpy()  # loss attack: -CE as score
    out["mia_auc_loss"] = attack_auc(log_p[sets["forget"]], log_p[sets["test"]])
    out["svm_asr"] = svm_loss_attack(-log_p[sets["retain"]], -log_p[sets["forget"]], -log_p[sets["test"]], seed)
    return out
