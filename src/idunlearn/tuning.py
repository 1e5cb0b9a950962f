"""Tuning protocol of the generator track: every method gets the same chance before it is compared.

Declared before any run (config ``tuning``): the tuning identities (an own seeded draw of forget identities disjoint
from the study's forget identities, with their own retain-validation identities, so that nothing the study evaluates
is seen while tuning), per method a grid of at most ``max_settings`` settings over its knobs, one budget of unlearning
steps x batch for every training method, and one selection rule. The chosen setting of each method then runs in the
study as ``<run>.tuned`` beside the paper-setting run ``<run>``.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd

from .config import ConfigError, job_settings, run_config, settings_read, tuned_base
from .evaluation.statistics import pooled_srk, sample_counts
from .selection import Selection, experiment_selections, forget_identity_order, retain_identity_split
from .unlearning import METHODS
from .unlearning.base import ClosedFormMethod

# stream tags of the tuning draws (independent of the selection stage's streams by their own seed and tags)
_TUNING_FORGET, _TUNING_RETAIN_VAL = 11, 12


def grid_points(grid: dict, key: str, max_settings: int) -> list[dict]:
    """The Cartesian product of ``grid`` (knob -> values) in declared order, knobs varying fastest last."""
    knobs = list(grid)
    points = [dict(zip(knobs, values)) for values in itertools.product(*(grid[k] for k in knobs))]
    if len(points) > max_settings:
        raise ConfigError(f"config key '{key}': {len(points)} settings, more than tuning.max_settings = "
                          f"{max_settings}; drop values or knobs")
    return points


def is_training(method: str) -> bool:
    """Whether a method trains (and so gets the tuning budget of steps x batch); UCE is a closed-form edit."""
    return not issubclass(METHODS[method], ClosedFormMethod)


def _setting_name(base: str, point: dict) -> str:
    return ".".join([base, "tune", *(f"{k}_{v}" for k, v in point.items())])


def tuning_settings(config: dict) -> dict[str, dict]:
    """Every tuning setting by name ``<run>.tune.<knob>_<value>...``: ``base`` (the paper-setting run), ``point``
    (the grid values) and ``run`` (the settings its job reads, ``config.job_settings``: the base run's, the budget
    for training methods, the point). Errors name the config key, also for a knob the base run's method and
    optimiser do not read (its grid points would be one job under several names)."""
    tuning, out = config["tuning"], {}
    budget = tuning["budget"]
    known = set(config["unlearning"]["defaults"])
    for base, spec in tuning["methods"].items():
        key = f"tuning.methods.{base}"  # a declared run: checked by config.validate_config
        unknown = sorted(set(spec["grid"]) - known)
        if unknown:
            raise ConfigError(f"config key '{key}.grid': unknown setting(s) {unknown}; known: {sorted(known)}")
        settings = run_config(config, base)
        unread = sorted(set(spec["grid"]) - settings_read(settings["method"], settings["optimiser"]))
        if unread:
            raise ConfigError(f"config key '{key}.grid': method {settings['method']!r} with optimiser "
                              f"{settings['optimiser']!r} does not read {unread}; tune settings it reads")
        training = is_training(settings["method"])
        if training:
            settings.update(budget)
        for point in grid_points(spec["grid"], f"{key}.grid", tuning["max_settings"]):
            run = {**settings, **point}
            if training and run["steps"] * run["forget_batch"] > budget["steps"] * budget["forget_batch"]:
                raise ConfigError(f"config key '{key}.grid': setting {point} takes {run['steps']} steps x "
                                  f"{run['forget_batch']} forget samples, over the budget tuning.budget "
                                  f"({budget['steps']} x {budget['forget_batch']}) every training method shares")
            out[_setting_name(base, point)] = {"base": base, "point": point, "run": job_settings(run)}
    return out


def tuning_selections(labels: pd.DataFrame, centroids: pd.DataFrame, study_forget, selection_cfg: dict,
                      tuning_cfg: dict, seed: int) -> list[Selection]:
    """The tuning experiments: ``tuning_cfg['n_identities']`` forget identities drawn (seed ``tuning_cfg['seed']``)
    among the eligible forget candidates that are not study forget identities, and ``retain_val_identities``
    retain-validation identities drawn among the remaining retain-train identities, so that neither is evaluated
    by the study. Retain-train of each = the study's retain-train identities minus itself and the tuning
    retain-validation identities; splits and anchors as in the selection stage (eq. 6)."""
    sizes = centroids.set_index("identity")["size"]
    retain_train_all, _ = retain_identity_split(centroids["identity"].to_numpy(), selection_cfg["retain_train_fraction"],
                                                seed)
    study = {int(i) for i in study_forget}
    eligible = [i for i in forget_identity_order(sizes, retain_train_all, selection_cfg["min_forget_images"], seed)
                if i not in study]
    n, n_val, tuning_seed = tuning_cfg["n_identities"], tuning_cfg["retain_val_identities"], tuning_cfg["seed"]
    if n > len(eligible):
        raise ConfigError(f"config key 'tuning.n_identities': {n} tuning identities wanted but only {len(eligible)} "
                          "eligible forget identities are outside the study's; lower it or selection.n_forget")
    forget = np.sort(np.random.default_rng([tuning_seed, _TUNING_FORGET]).choice(np.sort(eligible), n, replace=False))
    rest = np.array(sorted(set(retain_train_all.tolist()) - study - set(forget.tolist())))
    if n_val > len(rest) - 1:
        raise ConfigError(f"config key 'tuning.retain_val_identities': {n_val} wanted but only {len(rest)} "
                          "identities are neither study nor tuning forget identities")
    retain_val = np.sort(np.random.default_rng([tuning_seed, _TUNING_RETAIN_VAL]).choice(rest, n_val, replace=False))
    retain_pool = retain_train_all[~np.isin(retain_train_all, retain_val)]
    return experiment_selections(labels, centroids, forget.tolist(), retain_pool, retain_val, selection_cfg,
                                 tuning_seed)


def pooled_scores(samples: pd.DataFrame) -> dict:
    """Pooled over every sample of every tuning identity: forget and retain ISM (PIU eq. 7: mean cosine to the
    target identity's centroid, undetected samples count 0) and SRK (eqs. 8-10 on pooled counts)."""
    out = {f"ism_{kind}": float(samples.loc[samples["kind"] == kind, "own_cosine"].mean())
           for kind in ("forget", "retain")}
    out["srk"] = float(pooled_srk(sample_counts(samples)))
    return out


def score_settings(before: pd.DataFrame, after: dict[str, pd.DataFrame], settings: dict[str, dict]) -> pd.DataFrame:
    """One row per tuning setting: its pooled scores after unlearning, the original model's on the same tuning
    identities and conditions, and the ratios after / before. ``before`` and ``after[name]``: the per-sample
    tables of every tuning identity, concatenated."""
    reference = pooled_scores(before)
    rows = []
    for name, setting in settings.items():
        scores = pooled_scores(after[name])
        rows.append({"method": setting["base"], "setting": name, "point": json.dumps(setting["point"], sort_keys=True),
                     "steps": setting["run"]["steps"] if is_training(setting["run"]["method"]) else 0,
                     "n_identities": int(after[name]["forget_identity"].nunique()),
                     **scores, **{f"{k}_before": v for k, v in reference.items()},
                     "forget_ratio": scores["ism_forget"] / reference["ism_forget"],
                     "retain_ratio": scores["ism_retain"] / reference["ism_retain"]})
    return pd.DataFrame(rows)


def choose(scores: pd.DataFrame, rule: dict, success: dict) -> tuple[pd.DataFrame, dict]:
    """Apply the declared selection rule per method: among the settings whose pooled retain ISM stays at least
    ``rule['retain_ratio_min']`` x before, the lowest pooled forget ISM (ties: fewer steps, then grid order); when
    none qualifies, the setting with the highest retain ratio, and the reason says so. Returns the grid table with
    ``eligible``, ``forgets`` (forget ISM <= ``success['forget_ratio_max']`` x before with retain ISM >=
    ``success['retain_ratio_min']`` x before) and ``chosen`` columns, and method -> choice record."""
    table = scores.copy()
    table["order"] = range(len(table))
    table["eligible"] = table["retain_ratio"] >= rule["retain_ratio_min"]
    table["forgets"] = ((table["forget_ratio"] <= success["forget_ratio_max"])
                        & (table["retain_ratio"] >= success["retain_ratio_min"]))
    table["chosen"] = False
    choices = {}
    for method, group in table.groupby("method", sort=False):
        eligible = group[group["eligible"]]
        if len(eligible):
            pick = eligible.sort_values(["ism_forget", "steps", "order"]).index[0]
            reason = (f"lowest pooled forget ISM ({table.at[pick, 'ism_forget']:.4f}) among the {len(eligible)} of "
                      f"{len(group)} settings whose retain ISM stays >= {rule['retain_ratio_min']} x before")
        else:
            pick = group.sort_values(["retain_ratio", "order"], ascending=[False, True]).index[0]
            reason = (f"no setting keeps retain ISM >= {rule['retain_ratio_min']} x before; the least damaging "
                      f"(retain ratio {table.at[pick, 'retain_ratio']:.3f}) is used")
        table.at[pick, "chosen"] = True
        choices[method] = {"setting": table.at[pick, "setting"], "point": json.loads(table.at[pick, "point"]),
                           "reason": reason, "qualified": bool(len(eligible)),
                           "any_forgets": bool(group["forgets"].any())}
    return table.drop(columns="order"), choices


def choice_record(choices: dict, settings: dict[str, dict], rule: dict, identities) -> dict:
    """The choice file the study's ``<run>.tuned`` runs read: per method the chosen setting's full settings."""
    return {"rule": rule, "identities": [int(i) for i in identities],
            "methods": {m: {**c, "run": settings[c["setting"]]["run"]} for m, c in choices.items()}}


def tuned_settings(choice: dict, name: str) -> dict:
    """The settings of run ``name`` = ``<base>.tuned``: the tuning's chosen settings for ``base`` (which identities
    the run takes is the rules' business: its own ``n_identities``)."""
    base = tuned_base(name)
    if base not in choice["methods"]:
        raise ConfigError(f"run {name!r}: the tuning choice has no method {base!r}; add it to tuning.methods")
    return choice["methods"][base]["run"]


def _cell(value: float) -> str:
    return f"{value:.4g}"


def tuning_markdown(table: pd.DataFrame, choices: dict, rule: dict, success: dict, identities) -> str:
    """The tuning report: the declared rule, the tuning identities, and per method every setting with the choice."""
    lines = ["# Tuning (generator track)", "",
             f"Tuning forget identities (disjoint from the study's): {', '.join(str(int(i)) for i in identities)}. "
             f"Rule, declared before any run: the lowest pooled forget ISM among settings whose pooled retain ISM "
             f"stays >= {rule['retain_ratio_min']} x before (ties: fewer steps, then grid order). 'forgets': forget "
             f"ISM <= {success['forget_ratio_max']} x before with retain ISM >= {success['retain_ratio_min']} x "
             "before.", ""]
    for method, group in table.groupby("method", sort=False):
        choice = choices[method]
        lines += [f"## {method}", "", f"Chosen: `{choice['setting']}`: {choice['reason']}.", "",
                  "| setting | steps | forget ISM | x before | retain ISM | x before | SRK | eligible | forgets | chosen |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for row in group.itertuples():
            lines.append(f"| {row.point} | {row.steps} | {_cell(row.ism_forget)} | {_cell(row.forget_ratio)} | "
                         f"{_cell(row.ism_retain)} | {_cell(row.retain_ratio)} | {_cell(row.srk)} | "
                         f"{'yes' if row.eligible else 'no'} | {'yes' if row.forgets else 'no'} | "
                         f"{'**yes**' if row.chosen else ''} |")
        lines.append("")
    return "\n".join(lines)
