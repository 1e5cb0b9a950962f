"""Held out means held out: which audit attacks a method never trained against, and the held-out attacks' seeds.

Trained against. A method that runs an attack inside its training (piu_robust's embedding search, piu_meta's
simulated relearning attacker) declares it in the schema (``x-trains-against`` of ``unlearning.defaults``): the kind
of attack (its step function: ``embedding_search`` is unlearning/adversarial.py's search, ``relearning`` is
unlearning/finetune.py's step), the data it trains on and the run settings holding its learning rate (a number or a
[low, high] range). An audit attack is "trained against" for a run when the run's method declares an attack of the
same kind on the same data whose learning rate range contains the audit attack's (``trained_against``), read from the
run's settings as configured (a tuned run: every value its tuning grid may choose). Step counts, budgets, restarts and
seeds do not make an attack held out: a longer search or fine-tuning passes through the steps the method trained
against, and another seed draws from the same distribution; the seed streams are recorded beside the decision.

Seeds. The held-out attacks (the strong embedding attack, inversion, the relearning variants and the worst-case
relearning protocol) draw no random number that a training run could have drawn: their seeds are hashed (numpy
SeedSequence) from the config seed, a stream number of their own and the attack's name and index, so that they are
never the run's seed, never a method's own stream (piu_robust's ``adversarial_seed`` hashes the run's seed with stream
15) and never an evaluation or audit seed (the config seed plus offsets below a million).
"""

from __future__ import annotations

import functools
import json
import math
import os
import zlib

import numpy as np
import pandas as pd

from ..config import load_schema, run_config, tuned_base

HELDOUT_STREAM = 370  # the held-out attacks' seed stream beside the seed (piu_meta's attacker has 37, piu_robust's 15)
# appended to, never reordered: an attack's index is part of its seeds
HELDOUT_ATTACKS = ("attack_heldout", "inversion", "relearning_heldout", "relearning_worstcase")
HELDOUT_RELEARNING = "relearning_heldout"  # rows' probe: relearning_heldout:<variant> (relearning_heldout.py)
WORSTCASE = "relearning_worstcase"  # rows' probe: relearning_worstcase:<regime>@<lr> (relearning_worstcase.py)
FORGET_TRAIN = "forget_train"  # the data of an attack on the forget identity's forget-train photos
TRAINED_COLUMNS = ["run", "probe", "attack", "lr", "data", "seeds", "trained_by", "trained_lr_low", "trained_lr_high",
                   "trained_data", "trained_seeds", "trained_against"]


def heldout_seed(seed: int, attack: str, key: int | str = 0) -> int:
    """The seed of stream ``key`` (an index, or a name such as a relearning variant's, hashed with CRC-32 so that
    adding a variant leaves the others' seeds alone) of held-out attack ``attack`` (one of ``HELDOUT_ATTACKS``) under
    the config seed ``seed``: a 32-bit value from SeedSequence([seed, 370, attack, key])."""
    if attack not in HELDOUT_ATTACKS:
        raise ValueError(f"held-out attack {attack!r} is unknown; known: {', '.join(HELDOUT_ATTACKS)}")
    key = zlib.crc32(key.encode()) if isinstance(key, str) else key
    return int(np.random.SeedSequence([seed, HELDOUT_STREAM, HELDOUT_ATTACKS.index(attack), key])
               .generate_state(1)[0])


def worstcase_probe(regime: str, lr: float) -> str:
    """The rows' probe name of one (regime, learning rate) cell of the worst-case relearning protocol."""
    return f"{WORSTCASE}:{regime}@{lr:g}"


def worstcase_cell(probe: str) -> tuple[str, float]:
    """(regime, learning rate) of a ``worstcase_probe`` name."""
    regime, lr = probe[len(WORSTCASE) + 1:].split("@")
    return regime, float(lr)


@functools.lru_cache(maxsize=1)
def _trains_against() -> dict:
    return load_schema()["properties"]["unlearning"]["properties"]["defaults"]["x-trains-against"]


def declared_training_attacks(method: str) -> dict[str, dict]:
    """Kind -> declaration ({lr, switch, data, seeds}: setting names, or a list of them for ``switch``, and
    descriptions) of every attack ``method`` trains
    against, as the schema's ``x-trains-against`` declares it (``extends`` followed); {} for a method without an
    entry."""
    entry = _trains_against().get(method, {})
    inherited = declared_training_attacks(entry["extends"]) if "extends" in entry else {}
    return {**inherited, **entry.get("attacks", {})}


def _values(value) -> list:
    """The numbers of a setting's value: a number, a [low, high] range, or (a tuning grid's values) a list of them."""
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _values(item)]
    return [] if value is None else [value]


def training_attacks(config: dict, run: str) -> list[dict]:
    """The attacks unlearning run ``run`` trains against, read from its settings in ``config`` (validated):
    [{attack, lr_low, lr_high, data, setting, seeds}] (an inner attack switched off by one of its ``switch``
    settings is left out). A tuned run (``<run>.tuned``) may train at any value its tuning grid offers: the range
    covers them all. An external model (not in unlearning.runs) trains against nothing, except a rebuilt generator
    (``rebuild_training_attacks``)."""
    if run not in config["unlearning"]["runs"]:
        return rebuild_training_attacks(config, run)
    settings = run_config(config, run)
    grid = config["tuning"]["methods"].get(tuned_base(run), {}).get("grid", {}) if tuned_base(run) else {}
    attacks = []
    for kind, declared in declared_training_attacks(settings["method"]).items():
        switches = declared["switch"] if isinstance(declared["switch"], list) else [declared["switch"]]
        if not all(any(_values(settings[name]) + _values(grid.get(name))) for name in switches):
            continue
        rates = _values(settings[declared["lr"]]) + _values(grid.get(declared["lr"]))
        attacks.append({"attack": kind, "lr_low": float(min(rates)), "lr_high": float(max(rates)),
                        "data": declared["data"], "setting": declared["lr"], "seeds": declared["seeds"]})
    return attacks


def rebuild_training_attacks(config: dict, model: str) -> list[dict]:
    """The attacks an external model that is a rebuild's output (its generator folder <results_dir>/rebuild/<run>/
    b<budget>) trains against: the embedding search (unlearning/adversarial.py, on the forget-train photos) whose
    finds its student is taught to draw as the anchor. The search ran on the original model, not the student, but
    with the audit attack's step function, data and learning rate: an attack of that kind is not held out for it."""
    from ..rebuild import rebuild_settings

    entry = next((e for e in config["evaluation"]["external"] if e["name"] == model), {})
    folder = os.path.abspath(entry.get("generator", ""))
    root = os.path.join(os.path.abspath(config["results_dir"]), "rebuild")
    made = os.path.join(folder, "config.json")
    if os.path.dirname(os.path.dirname(folder)) == root:  # a rebuild job's output, built or not
        search = rebuild_settings(config["rebuild"], os.path.basename(os.path.dirname(folder)))["search"]
    elif os.path.isfile(made) and "rebuild" in json.loads(open(made).read()):  # a shipped rebuilt generator
        search = json.loads(open(made).read())["rebuild"]["settings"]["search"]
    else:
        return []
    return [{"attack": "embedding_search", "lr_low": float(search["lr"]), "lr_high": float(search["lr"]),
             "data": FORGET_TRAIN, "setting": "rebuild search.lr", "seeds": "the rebuild's seed"}]


def audit_attacks(probes: dict) -> dict[str, dict]:
    """Probe -> {attack, lr, data, seeds} of every enabled audit probe that is an attack a method could train against
    (``probes``: the config's audit.probes): the embedding attacks, the relearning probe and its held-out variants
    (on the forget identity; benign fine-tuning trains on other people's photos) and every worst-case cell."""
    out = {}
    if "attack" in probes:
        out["attack"] = {"attack": "embedding_search", "lr": probes["attack"]["lr"], "data": FORGET_TRAIN,
                         "seeds": "the config seed"}
        if "attack_heldout" in probes:
            out["attack_heldout"] = {**out["attack"], "seeds": "held-out stream"}
    if "relearning" in probes:
        base = probes["relearning"]["lr"]
        out["relearning"] = {"attack": "relearning", "lr": base, "data": FORGET_TRAIN, "seeds": "the config seed"}
        for name, variant in probes.get(HELDOUT_RELEARNING, {}).get("variants", {}).items():
            out[f"{HELDOUT_RELEARNING}:{name}"] = {
                "attack": "relearning", "lr": base * variant.get("lr_scale", 1.0),
                "data": FORGET_TRAIN if variant.get("data", "forget") == "forget" else "benign",
                "seeds": "held-out stream"}
    if WORSTCASE in probes:
        for lr in probes[WORSTCASE]["lrs"]:
            for regime in probes[WORSTCASE]["regimes"]:
                out[worstcase_probe(regime, lr)] = {"attack": "relearning", "lr": lr, "data": FORGET_TRAIN,
                                                    "seeds": "held-out stream"}
    return out


def _inside(lr: float, low: float, high: float) -> bool:
    """lr in [low, high], up to float rounding (0.1 x 1e-3 is 1e-4 here)."""
    return (lr >= low or math.isclose(lr, low, rel_tol=1e-9)) and (lr <= high or math.isclose(lr, high, rel_tol=1e-9))


def trained_against(training: dict[str, list[dict]], probes: dict) -> pd.DataFrame:
    """One row per (run, audit attack) (``training``: run -> ``training_attacks``; ``probes``: audit.probes):
    the attack's kind, learning rate, data and seeds, the run's matching training attack (the one of the same kind,
    if any: its setting, range, data and seeds) and whether the attack is trained against: same kind, same data,
    learning rate inside the range (``TRAINED_COLUMNS``)."""
    records = []
    for run, attacks in sorted(training.items()):
        for probe, spec in sorted(audit_attacks(probes).items()):
            same = [a for a in attacks if a["attack"] == spec["attack"]]
            hit = [a for a in same if a["data"] == spec["data"] and _inside(spec["lr"], a["lr_low"], a["lr_high"])]
            shown = (hit or same or [None])[0]
            records.append({"run": run, "probe": probe, **spec, "trained_by": shown and shown["setting"],
                            "trained_lr_low": shown["lr_low"] if shown else np.nan,
                            "trained_lr_high": shown["lr_high"] if shown else np.nan,
                            "trained_data": shown and shown["data"], "trained_seeds": shown and shown["seeds"],
                            "trained_against": bool(hit)})
    return pd.DataFrame.from_records(records, columns=TRAINED_COLUMNS)


def mark_trained_against(table: pd.DataFrame, marks: pd.DataFrame) -> pd.DataFrame:
    """The audit ``table`` with a ``trained_against`` column: true on the rows of a (run, probe) that ``marks``
    (``trained_against``) calls trained against, false elsewhere (every other probe, the original model, external
    models)."""
    hit = set(map(tuple, marks.loc[marks["trained_against"], ["run", "probe"]].to_numpy()))
    return table.assign(trained_against=[(run, probe) in hit for run, probe in zip(table["run"], table["probe"])])
