# Config access and getters shared by every stage.

import os

import pandas as pd

from idunlearn.config import validate_config

# Validates the config against the package's JSON schema and fills in defaults; errors name the bad key.
validate_config(config)

DATA = config["data_dir"]
RESULTS = config["results_dir"]
ASSETS = os.path.join(DATA, "assets")


def results(*parts):
    return os.path.join(RESULTS, *parts)


def logs(name):
    return os.path.join(RESULTS, "logs", f"{name}.log")


def face_models_dir():
    return os.path.join(DATA, "models", "faces", config["faces"]["backend"])


def image_dir():
    return os.path.join(DATA, "images", config["dataset"]["source"])


def forget_identities(wildcards=None):
    """Forget identity ids chosen by the select_experiments checkpoint (known only after it ran)."""
    table = checkpoints.select_experiments.get().output.table
    return [int(i) for i in pd.read_parquet(table)["forget_identity"]]


def selection_file(wildcards):
    """The per-identity selection file; asking for it waits for the select_experiments checkpoint."""
    folder = checkpoints.select_experiments.get().output.identities
    return os.path.join(folder, f"{wildcards.identity}.json")


def get_final_outputs(wildcards):
    return [
        results("identities", "summary.csv"),
        results("identities", "nn_histogram.png"),
        results("selection", "selections.csv"),
    ] + expand(results("selection", "sheets", "{identity}.png"), identity=forget_identities())
