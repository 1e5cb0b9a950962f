# Getters of the recognizer track (rules/recognizer.smk), kept apart from its rules.

import re

from idunlearn.recognizer import tuning as recognizer_tuning, ulira as recognizer_ulira
from idunlearn.recognizer.runs import experiment_config, experiments as recognizer_experiments


def recognizer_results(*parts):
    return results("recognizer", *parts)


def recognizer_experiment_outputs(wildcards=None):
    """metrics.parquet (configured settings) and, with tuning on, tuned.parquet (the protocol's settings) of every
    configured experiment; class-wise ones wait for the select_experiments checkpoint."""
    rcfg = config["recognizer"]
    identities = forget_identities() if rcfg["tasks"]["classwise"]["datasets"] else []
    files = ["metrics.parquet", "tuned.parquet"] if recognizer_tuning_enabled() else ["metrics.parquet"]
    return [recognizer_results("runs", e.task, e.dataset, e.name, f)
            for e in recognizer_experiments(rcfg, identities) for f in files]


def recognizer_ulira_outputs(wildcards=None):
    """ulira.parquet of every experiment recognizer.ulira attacks (none when it is off)."""
    return [recognizer_results("runs", e.task, e.dataset, e.name, "ulira.parquet")
            for e in recognizer_ulira.experiments(config["recognizer"])]


def recognizer_datasets():
    tasks = config["recognizer"]["tasks"]
    return sorted(set(tasks["random_subset"]["datasets"]) | set(tasks["classwise"]["datasets"]))


def recognizer_selection(wildcards):
    """A class-wise experiment depends on its forget identity's selection file (the generator track's identity)."""
    if wildcards.task != "classwise":
        return []
    identity = re.match(r"id(\d+)-", wildcards.experiment)[1]
    return os.path.join(checkpoints.select_experiments.get().output.identities, f"{identity}.json")


def recognizer_tuning_enabled():
    return config["recognizer"]["tuning"]["enabled"]


def recognizer_task_datasets():
    """task -> the datasets it runs on."""
    return {task: config["recognizer"]["tasks"][task]["datasets"] for task in ("random_subset", "classwise")}


def recognizer_tuning_requests_outputs(wildcards=None):
    return [recognizer_results("tuning", task, dataset, "requests.parquet")
            for task, datasets in recognizer_task_datasets().items() for dataset in datasets]


def recognizer_tuning_outputs(wildcards=None):
    """One grid file per task x dataset x tuned method (the protocol is checked first: seeds, grids, budgets)."""
    rcfg = config["recognizer"]
    recognizer_tuning.check(rcfg, recognizer_task_datasets())
    return [recognizer_results("tuning", task, dataset, f"{method}.parquet")
            for task, datasets in recognizer_task_datasets().items() for dataset in datasets
            for method in recognizer_tuning.tuned_methods(rcfg, task)]


def recognizer_tuning_selection(wildcards):
    """Class-wise tuning identities are drawn outside the forget identities: their requests need the selection."""
    return results("selection", "selections.parquet") if wildcards.task == "classwise" else []
