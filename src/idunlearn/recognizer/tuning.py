"""The recognizer track's tuning protocol: every unlearning method, GSUO included, gets a declared grid of
at most ``MAX_GRID`` settings over its own knobs, the same epoch budget per task, and is tuned on forget requests
disjoint from the evaluation ones (random-subset: other seeds; class-wise: identities drawn, seeded, from those that
are not forget identities); one selection rule, fixed in the config before any run, picks one setting per method,
and that setting is then run on the evaluation requests beside the configured ('paper') setting.

Selection rule (``recognizer.tuning.rule``), on the means over the tuning requests:
1. admissible: every utility metric (random-subset Acc(D_r), Acc(D_t); class-wise Acc(D_r), Acc(D_rt)) is at least
   ``utility_floor`` x the original model's on the same requests;
2. among the admissible settings, the best forget quality (random-subset: the lowest |Diff|; class-wise: the lowest
   (Acc(D_f) + Acc(D_ft)) / 2); settings within ``tie_tolerance`` of the best tie;
3. ties: fewer passes (epochs summed over the setting's epoch knobs), then the higher worst utility ratio, then the
   earlier grid position;
4. no admissible setting: the setting with the highest worst utility ratio, marked as such.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd

from ..config import ConfigError
from .data import ImageData, random_forget_set
from .methods import applies
from .metrics import METHOD_LABELS, markdown
from .runs import Experiment, build_problem, check_shadows, evaluate, method_row, method_settings

MAX_GRID = 12
NOT_TUNED = ("original", "retrain")  # the references: nothing to tune
UTILITY = {"random_subset": ("acc_retain", "acc_test"), "classwise": ("acc_retain", "acc_retain_test")}
QUALITY = {"random_subset": "|Diff| = |Acc(D_f) - Acc(D_t)|", "classwise": "(Acc(D_f) + Acc(D_ft)) / 2"}
_SUBSET_PASSES = ("max_epochs",)  # SCRUB's max-passes happen inside its `epochs`; counting them twice would be wrong
_TUNING_IDENTITIES = 83


def passes(settings: dict) -> int:
    """Passes over the data a setting makes: the sum of its ``epochs`` / ``*_epochs`` knobs (the epoch budget)."""
    return int(sum(v for k, v in settings.items()
                   if (k == "epochs" or k.endswith("_epochs")) and k not in _SUBSET_PASSES))


def _same_kind(value, reference) -> bool:
    """A grid value fits a setting: numbers for numbers (an integer setting takes integers only), else the same
    type."""
    if isinstance(reference, bool) or isinstance(value, bool):
        return type(value) is type(reference)
    if isinstance(reference, int):
        return isinstance(value, int)
    if isinstance(reference, float):
        return isinstance(value, (int, float))
    return type(value) is type(reference)


def grid_settings(base: dict, grid: dict, where: str, budget: int) -> list[dict]:
    """Every setting of ``grid`` (knob -> values; Cartesian product in the config's order) on top of ``base``.
    Errors name ``where`` (the config key) when a knob is unknown, the grid is larger than ``MAX_GRID`` or a setting
    exceeds the epoch ``budget``."""
    if not grid:
        raise ConfigError(f"config key '{where}': empty grid; give every tuned method at least one knob")
    unknown = sorted(set(grid) - set(base))
    if unknown:
        raise ConfigError(f"config key '{where}': unknown knob(s) {unknown}; known: {sorted(base)}")
    for knob, values in grid.items():
        wrong = [v for v in values if not _same_kind(v, base[knob])]
        if wrong:
            raise ConfigError(f"config key '{where}.{knob}': {wrong} not of the kind of the setting's value "
                              f"{base[knob]!r} (YAML reads 1e-05 as text; write 1.0e-05)")
    size = int(np.prod([len(v) for v in grid.values()]))
    if size > MAX_GRID:
        raise ConfigError(f"config key '{where}': {size} settings, the protocol allows at most {MAX_GRID}")
    out = [{**base, **dict(zip(grid, values))} for values in itertools.product(*grid.values())]
    over = [s for s in out if passes(s) > budget]
    if over:
        raise ConfigError(f"config key '{where}': {len(over)} setting(s) make more than the epoch budget of {budget} "
                          f"passes (e.g. {passes(over[0])}); lower them or raise recognizer.tuning.<task>.epoch_budget")
    return out


def tuned_methods(rcfg: dict, task: str) -> list[str]:
    """The methods of ``recognizer.methods.run`` that are tuned for ``task`` (all but the references)."""
    return [m for m in rcfg["methods"]["run"] if m not in NOT_TUNED and applies(m, task)]


def method_grid(rcfg: dict, task: str, method: str, base: dict) -> list[dict]:
    grids = rcfg["tuning"]["grids"][task]
    if method not in grids:
        raise ConfigError(f"config key 'recognizer.tuning.grids.{task}.{method}' is missing: every method of "
                          "recognizer.methods.run is tuned (the protocol treats GSUO and the baselines alike)")
    return grid_settings(base, grids[method], f"recognizer.tuning.grids.{task}.{method}",
                         rcfg["tuning"][task]["epoch_budget"])


def check_seeds(rcfg: dict) -> None:
    """Random-subset tuning seeds must differ from the evaluation seeds (their forget draws are independent)."""
    shared = set(rcfg["tuning"]["random_subset"]["seeds"]) & set(rcfg["tasks"]["random_subset"]["seeds"])
    if shared:
        raise ConfigError(f"config key 'recognizer.tuning.random_subset.seeds': {sorted(shared)} also evaluation "
                          "seed(s) (recognizer.tasks.random_subset.seeds); tuning requests must be disjoint")


def check(rcfg: dict, datasets_by_task: dict) -> None:
    """Config errors of the protocol before any run: shared seeds, missing or oversized grids, unknown knobs, settings
    over the epoch budget (``datasets_by_task``: task -> the datasets it runs on)."""
    check_seeds(rcfg)
    for task, datasets in datasets_by_task.items():
        for dataset in datasets:
            for method in tuned_methods(rcfg, task):
                method_grid(rcfg, task, method, method_settings(rcfg, task, dataset, method))


def job_config(rcfg: dict, task: str, dataset: str, method: str | None = None) -> dict:
    """The part of the recognizer config a tuning job reads: the requests job (``method`` None) also needs the
    evaluation seeds (disjointness, overlap); a method's job only its own settings, overrides and grid, so that
    changing another method does not rerun it."""
    ds = rcfg[dataset]
    random_subset = {"forget_fraction": rcfg["tasks"]["random_subset"]["forget_fraction"]}
    sub = {dataset: {"model": ds["model"], "training": ds["training"], "method_overrides": {task: {}}},
           "tasks": {"random_subset": random_subset}, "methods": {task: {}},
           "tuning": {task: rcfg["tuning"][task], "grids": {task: {}}}}
    if method is None:
        random_subset["seeds"] = rcfg["tasks"]["random_subset"]["seeds"]
        return sub
    sub["methods"][task][method] = rcfg["methods"][task][method]
    override = ds.get("method_overrides", {}).get(task, {}).get(method)
    if override is not None:
        sub[dataset]["method_overrides"][task][method] = override
    sub["tuning"]["grids"][task][method] = rcfg["tuning"]["grids"][task].get(method, {})
    return sub


def tuning_identities(classes, forget_identities, n: int, seed: int) -> list[int]:
    """Class-wise tuning identities: ``n`` identities drawn (seeded by the config seed) from the classifier's classes
    that are not forget identities of the evaluation, in ascending order."""
    candidates = sorted({int(c) for c in classes} - {int(i) for i in forget_identities})
    if n > len(candidates):
        raise ConfigError(f"config key 'recognizer.tuning.classwise.n_identities': {n} exceeds the {len(candidates)} "
                          "identities that are not forget identities")
    rng = np.random.default_rng([int(seed), _TUNING_IDENTITIES])
    return sorted(int(i) for i in rng.choice(candidates, n, replace=False))


def requests(rcfg: dict, task: str, dataset: str, data: ImageData, forget_identities, config_seed: int) -> list:
    """The tuning requests of ``task`` on ``dataset``: random-subset experiments for ``tuning.random_subset.seeds``,
    class-wise experiments for the drawn tuning identities x ``tuning.classwise.seeds``."""
    t = rcfg["tuning"][task]
    if task == "random_subset":
        check_seeds(rcfg)
        return [Experiment(task, dataset, s) for s in t["seeds"]]
    identities = tuning_identities(data.classes, forget_identities, t["n_identities"], config_seed)
    return [Experiment(task, dataset, s, i) for i in identities for s in t["seeds"]]


def request_table(data: ImageData, original, original_meta: dict, shadows: dict, reqs: list, rcfg: dict,
                  config_seed: int) -> pd.DataFrame:
    """One row per tuning request: what it is, how many of its forget images are also forgotten in an evaluation
    request (random-subset; class-wise requests share none, their identities are not forget identities), and the
    original model's metrics on it (``original_*``: the reference of the utility floor)."""
    check_shadows(shadows, data)
    rows = []
    for exp in reqs:
        problem, sets, x_all, y_all, seed = build_problem(data, original_meta, exp, rcfg, config_seed)
        if exp.task == "random_subset":
            fraction = rcfg["tasks"]["random_subset"]["forget_fraction"]
            evaluated = set()
            for s in rcfg["tasks"]["random_subset"]["seeds"]:
                evaluated |= set(random_forget_set(data, fraction, config_seed, s).tolist())
            overlap = len(evaluated & set(sets["forget"].tolist()))
        else:
            overlap = 0
        metrics = evaluate(original, x_all, y_all, sets, shadows, exp.task, seed)
        rows.append({"task": exp.task, "dataset": exp.dataset, "experiment": exp.name, "seed": exp.seed,
                     "forget_identity": -1 if exp.forget_identity is None else exp.forget_identity,
                     "n_retain": len(sets["retain"]), "n_forget": len(sets["forget"]),
                     "forget_shared_with_evaluation": overlap, **{f"original_{k}": v for k, v in metrics.items()}})
    return pd.DataFrame(rows)


def tune_method(data: ImageData, original, original_meta: dict, shadows: dict, request_rows: pd.DataFrame,
                method: str, rcfg: dict, config_seed: int) -> pd.DataFrame:
    """Every setting of the method's grid on every tuning request: one row per (setting, request)."""
    check_shadows(shadows, data)
    out = []
    for req in request_rows.itertuples(index=False):
        exp = Experiment.parse(req.task, req.dataset, req.experiment)
        grid = method_grid(rcfg, exp.task, method, method_settings(rcfg, exp.task, exp.dataset, method))
        problem, sets, x_all, y_all, seed = build_problem(data, original_meta, exp, rcfg, config_seed)
        for index, settings in enumerate(grid):
            row = method_row(method, settings, original, problem, sets, x_all, y_all, shadows, exp, seed)
            out.append({**row, "setting_index": index, "passes": passes(settings)})
    return pd.DataFrame(out)


def setting_means(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, dataset, method, setting): the means over the tuning requests of every metric."""
    keys = ["task", "dataset", "method", "setting_index"]
    metric_cols = ["acc_retain", "acc_retain_test", "acc_forget", "acc_forget_test", "acc_test", "diff", "f_acc",
                   "mia_auc", "mia_auc_loss", "time_s"]
    means = rows.groupby(keys, sort=True)[metric_cols].mean().reset_index()
    first = rows.groupby(keys, sort=True)[["settings", "passes"]].first().reset_index()
    counts = rows.groupby(keys, sort=True).size().rename("n_requests").reset_index()
    return means.merge(first, on=keys).merge(counts, on=keys)


def forget_quality(frame: pd.DataFrame, task: str) -> pd.Series:
    """Lower is better: |Diff| (random-subset) or the mean of Acc(D_f) and Acc(D_ft) (class-wise)."""
    if task == "random_subset":
        return frame["diff"]
    return (frame["acc_forget"] + frame["acc_forget_test"]) / 2


def select(grid: pd.DataFrame, original: dict, task: str, rule: dict) -> tuple[int, str, pd.DataFrame]:
    """The chosen ``setting_index`` of one method's ``grid`` (``setting_means`` rows), the reason in words, and the
    grid with the rule's columns (utility ratio, admissible, forget quality)."""
    g = grid.sort_values("setting_index").reset_index(drop=True).copy()
    ratios = pd.concat([g[m] / original[m] for m in UTILITY[task]], axis=1)
    g["utility_ratio"] = ratios.min(axis=1)
    g["admissible"] = g["utility_ratio"] >= rule["utility_floor"]
    g["forget_quality"] = forget_quality(g, task)
    pool = g[g["admissible"]]
    if pool.empty:
        best = g.sort_values(["utility_ratio", "setting_index"], ascending=[False, True]).iloc[0]
        return int(best["setting_index"]), (f"no setting kept {rule['utility_floor']:.2f} x the original's "
                                            f"{' and '.join(UTILITY[task])}; chosen: the highest worst utility ratio "
                                            f"({best['utility_ratio']:.3f})"), g
    best_quality = pool["forget_quality"].min()
    tied = pool[pool["forget_quality"] <= best_quality + rule["tie_tolerance"]]
    best = tied.sort_values(["passes", "utility_ratio", "setting_index"], ascending=[True, False, True]).iloc[0]
    reason = (f"best forget quality {QUALITY[task]} = {best['forget_quality']:.4f} of {len(pool)}/{len(g)} "
              f"admissible settings")
    if len(tied) > 1:
        reason += f"; {len(tied)} tied, fewest passes ({int(best['passes'])}) then highest utility ratio"
    return int(best["setting_index"]), reason, g


def rule_text(rcfg: dict) -> str:
    r, t = rcfg["tuning"]["rule"], rcfg["tuning"]
    return (f"Per method a grid of at most {MAX_GRID} settings; epoch budget (passes summed over a setting's epoch "
            f"knobs) random-subset {t['random_subset']['epoch_budget']}, class-wise {t['classwise']['epoch_budget']}. "
            f"Admissible: mean Acc(D_r) and Acc(D_t) (class-wise: Acc(D_r) and Acc(D_rt)) over the tuning requests >= "
            f"{r['utility_floor']} x the original model's on the same requests. Chosen: the admissible setting with "
            f"the best forget quality (random-subset {QUALITY['random_subset']}, class-wise {QUALITY['classwise']}, "
            f"lower is better; within {r['tie_tolerance']} is a tie); ties: fewer passes, then the higher worst "
            "utility ratio, then the earlier grid position. No admissible setting: the highest worst utility ratio.")


def choose_all(rows: pd.DataFrame, requests: pd.DataFrame, rule: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(grid table with every setting's means and the rule's columns, choice table with one row per task x dataset x
    method) from the tuning rows and the requests (which carry the original model's metrics per request)."""
    grids, choices = [], []
    for (task, dataset, method), group in setting_means(rows).groupby(["task", "dataset", "method"], sort=True):
        reqs = requests[(requests["task"] == task) & (requests["dataset"] == dataset)]
        original = {m: float(reqs[f"original_{m}"].mean()) for m in UTILITY[task]}
        index, reason, g = select(group, original, task, rule)
        g["chosen"] = g["setting_index"] == index
        grids.append(g)
        chosen = g[g["chosen"]].iloc[0]
        choices.append({"task": task, "dataset": dataset, "method": method, "grid_size": len(g),
                        "setting_index": index, "passes": int(chosen["passes"]),
                        "admissible": bool(chosen["admissible"]), "utility_ratio": chosen["utility_ratio"],
                        "forget_quality": chosen["forget_quality"], "reason": reason,
                        "settings": chosen["settings"]})
    return pd.concat(grids, ignore_index=True), pd.DataFrame(choices)


def chosen_settings(choice: pd.DataFrame) -> dict:
    """task -> dataset -> method -> the chosen settings (the input of the tuned evaluation runs)."""
    out: dict = {}
    for row in choice.itertuples(index=False):
        out.setdefault(row.task, {}).setdefault(row.dataset, {})[row.method] = json.loads(row.settings)
    return out


def varied_knobs(settings: list[dict]) -> list[str]:
    """The knobs whose value differs between the settings of one grid, in the settings' key order."""
    return [k for k in settings[0] if len({json.dumps(s.get(k)) for s in settings}) > 1]


def choice_markdown(grid: pd.DataFrame, choice: pd.DataFrame, reqs: pd.DataFrame, rcfg: dict) -> str:
    """choice.md: the rule, the requests, the choice per method with its reason, then every method's grid."""
    def label(m):
        return METHOD_LABELS.get(m, m)

    shown = choice.drop(columns=["settings"]).assign(method=choice["method"].map(label),
                                                     utility_ratio=choice["utility_ratio"].round(4),
                                                     forget_quality=choice["forget_quality"].round(4))
    parts = ["# Recognizer tuning: grid, rule and choice\n",
             f"Rule (declared in the config before the runs, `recognizer.tuning`): {rule_text(rcfg)}\n",
             "Tuning requests (disjoint from the evaluation ones; `requests.csv`): "
             + "; ".join(f"{t} {d}: {', '.join(g['experiment'])}"
                         for (t, d), g in reqs.groupby(["task", "dataset"], sort=True)) + ".\n",
             "## Choice per method\n", markdown(shown),
             "## Grids (means over the tuning requests; every metric in `grid.csv`, per request in `runs.csv`)\n"]
    for (task, dataset, method), g in grid.groupby(["task", "dataset", "method"], sort=True):
        settings = [json.loads(s) for s in g["settings"]]
        knobs = varied_knobs(settings)
        table = pd.DataFrame([{**{k: s[k] for k in knobs}, "passes": int(p), "utility_ratio": round(u, 4),
                               "forget_quality": round(q, 4), "admissible": a, "chosen": c}
                              for s, p, u, q, a, c in zip(settings, g["passes"], g["utility_ratio"],
                                                          g["forget_quality"], g["admissible"], g["chosen"])])
        parts += [f"### {task} {dataset} {label(method)}\n", markdown(table)]
    return "\n".join(parts)
