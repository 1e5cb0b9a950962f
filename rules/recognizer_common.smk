# Getters of the recognizer track (rules/recognizer.smk), kept apart from its rules.

import re

from idunlearn.recognizer.runs import experiment_config, experiments as recognizer_experiments


def recognizer_results(*parts):
    return results("recognizer", *parts)


def recognizer_experiment_outputs(wildcards=None):
    """metrics.parquet of every configured experiment; class-wise ones wait for the select_experiments checkpoint."""
    rcfg = config["recognizer"]
    identities = forget_identities() if rcfg["tasks"]["classwise"]["datasets"] else []
    return [recognizer_results("runs", e.task, e.dataset, e.name, "metrics.parquet")
            for e in recognizer_experiments(rcfg, identities)]


def recognizer_datasets():
    tasks = config["recognizer"]["tasks"]
    return sorted(set(tasks["random_subset"]["datasets"]) | set(tasks["classwise"]["datasets"]))


def recognizer_selection(wildcards):
    """A class-wise experiment depends on its forget identity's selection file (the generator track's identity)."""
    if wildcards.task != "classwise":
        return []
    identity = re.match(r"id(\d+)-", wildcards.experiment)[1]
    return os.path.join(checkpoints.select_experiments.get().output.identities, f"{identity}.json")
