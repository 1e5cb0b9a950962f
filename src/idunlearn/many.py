"""Forgetting many people (config ``many``): N identities forgotten jointly in one run, one at a time in a chain
theta_i = unlearn(theta_(i-1), id_i) with or without protection of what came before, or by merging N separately
unlearned models; over several seeded identity orders, with what each costs the identities kept.

Identities: ``many.orders`` draws of ``needed`` identities. Order 0 is ``many.identities``, or the first ones of the
selection stage's forget order (PIU Section 4's draw, so identity 1 is the study's first forget identity); order k >= 1
is a seeded draw among every eligible forget identity (stream (seed, 21, k)).

Single runs. Every identity of every order has its ordinary single-identity job (the selection stage's experiment):
joint N = 1 and step 1 of every chain are that job, and the merges merge those jobs' changes.

Retain sets. Joint N: the retain-train identities leave out all N forgotten ones, and each identity's anchor (PIU
eq. 6) is drawn among those. Sequential step i: the retain-train identities leave out identities 1..i (never the
later ones), so that step i depends on identities 1..i only and changing identity 5 reruns steps 5-8 alone. With
protection ``replay``, step i also replays identities 1..i-1 (their forget conditions steered to their own anchors, an
anchor forgotten since re-drawn among step i's retain-train identities), and every target, the retain targets
included, is the original model's, not step i-1's: the chain does not drift from what it protects. Retain ISM is
always measured on the retain-validation identities, which are never forget identities.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from .audit.verification import verified  # noqa: E402
from .conditions import dirichlet_mixtures  # noqa: E402
from .config import ConfigError  # noqa: E402
from .evaluation.aggregate import job_seconds, job_seconds_measure  # noqa: E402
from .evaluation.statistics import (CONFIDENCE, N_BOOTSTRAP, holm, mean_ci, mean_difference, pooled_srk,  # noqa: E402
                                    sample_counts)
from .faces.analyser import ok_embeddings  # noqa: E402
from .identities import centroid_lookup  # noqa: E402
from .io import save_figure  # noqa: E402
from .selection import anchor_for_tau, experiment_selections, forget_identity_order, retain_identity_split  # noqa: E402

MODES = ("joint", "sequential")
PROTECTIONS = ("none", "replay", "replay_eupmu")
# the closed-form merges (models.export.merge_regmean) and what each does with the changed parameters that are not
# keys or values: sum their changes, or keep the base's
CLOSED_FORM_MERGES = {"regmean": "sum", "keys_values": "base"}
MERGES = ("sum", *CLOSED_FORM_MERGES)
# a merge's former name -> its name; still read, with a warning
RENAMED_MERGES = {"cross_attention": "regmean"}
_ORDERS = 21  # the order draws' stream, apart from selection.py's (1-4) and the request's (11)
# the targets at the largest N / after the chain: every identity's FA at most this, retain ISM at least
# this share of the original model's on the same samples
FA_TARGET = 0.1
RETAIN_TARGETS = {"joint": 0.95, "sequential": 0.9}


def forget_order(centroids: pd.DataFrame, selection_cfg: dict, seed: int) -> list[int]:
    """Every eligible forget identity in the selection stage's order (``selection.forget_identity_order`` over the
    retain-train side of its identity split)."""
    retain_train, _ = retain_identity_split(centroids["identity"].to_numpy(), selection_cfg["retain_train_fraction"],
                                            seed)
    return forget_identity_order(centroids.set_index("identity")["size"], retain_train,
                                 selection_cfg["min_forget_images"], seed, selection_cfg.get("target_mean_size"))


def needed(cfg: dict) -> int:
    """How many identities an order holds: the largest joint size or the chain's length."""
    return max([*cfg["joint_sizes"], cfg["sequential_length"]])


def chosen_identities(cfg: dict, order: list[int]) -> list[int]:
    """Order 0: ``identities`` (checked: distinct eligible forget identities, enough of them) or the first
    ``needed(cfg)`` of ``order``."""
    n = needed(cfg)
    if cfg["identities"] is None:
        if n > len(order):
            raise ConfigError(f"config key 'many': {n} identities needed (joint_sizes, sequential_length) but only "
                              f"{len(order)} are eligible forget identities; lower them or selection.min_forget_images")
        return order[:n]
    ids = [int(i) for i in cfg["identities"]]
    if len(ids) < n or len(set(ids)) != len(ids):
        raise ConfigError(f"config key 'many.identities': {n} distinct identities needed (joint_sizes, "
                          f"sequential_length), got {ids}")
    unknown = [i for i in ids if i not in order]
    if unknown:
        raise ConfigError(f"config key 'many.identities': {unknown} are not eligible forget identities (retain-train "
                          f"side, at least selection.min_forget_images images); eligible: {sorted(order)}")
    return ids[:n]


def identity_orders(cfg: dict, order: list[int], seed: int) -> list[list[int]]:
    """The ``cfg['orders']`` identity orders: ``chosen_identities`` first, then seeded draws of ``needed(cfg)``
    identities among the eligible ``order`` (each draw from its own stream, so adding an order keeps the others)."""
    first = chosen_identities(cfg, order)
    draws = [[int(i) for i in np.random.default_rng([seed, _ORDERS, k]).choice(order, size=len(first), replace=False)]
             for k in range(1, cfg["orders"])]
    return [first, *draws]


def merge_names(names: list[str]) -> list[str]:
    """``many.merges`` with each former name (``RENAMED_MERGES``) read as its current name, with a warning saying so."""
    for old in dict.fromkeys(n for n in names if n in RENAMED_MERGES):
        warnings.warn(f"config key 'many.merges': {old!r} is the former name of the {RENAMED_MERGES[old]!r} merge (it "
                      "solves RegMean's normal equations with UCE's preservation and ridge terms) and is read as "
                      f"{RENAMED_MERGES[old]!r}; write {RENAMED_MERGES[old]!r}", FutureWarning, stacklevel=2)
    return list(dict.fromkeys(RENAMED_MERGES.get(n, n) for n in names))


def merge_sizes(cfg: dict) -> list[int]:
    """The N of each merge: ``merge_sizes``, or every joint size above 1; an N beyond ``needed(cfg)`` is a clear
    error (an order holds no more identities)."""
    sizes = sorted(n for n in cfg["joint_sizes"] if n > 1) if cfg["merge_sizes"] is None else sorted(cfg["merge_sizes"])
    if sizes and sizes[-1] > needed(cfg):
        raise ConfigError(f"config key 'many.merge_sizes': N = {sizes[-1]} exceeds the {needed(cfg)} identities an "
                          "order holds (the largest of joint_sizes and sequential_length); lower it or raise those")
    return sizes


def evaluated_steps(cfg: dict) -> list[int]:
    """The chain steps evaluated: every joint size up to the chain's length, and its last step."""
    return sorted({n for n in cfg["joint_sizes"] if n <= cfg["sequential_length"]} | {cfg["sequential_length"]})


def joint_run(run: dict, n: int, budget: dict) -> dict:
    """The settings of a joint job of ``n`` identities: the run's, with each key of ``budget`` (``forget_batch``,
    ``steps``) that is ``per_identity`` multiplied by n (``per_identity`` forget batch: every identity gets the single
    run's forget batch in every batch); ``shared`` keeps the single run's. N = 1 is the single run."""
    out = dict(run)
    for key, mode in budget.items():
        if mode == "per_identity" and key in out:  # a closed-form method has neither
            out[key] = run[key] * n
    return out


def step_run(run: dict, protection: str, step: int, replay_batch: int) -> tuple[dict, np.ndarray | None]:
    """The settings of chain step ``step`` under ``protection`` and its forget identities' batch weights (identities
    1..step in order; None: the step unlearns its own identity alone). ``replay``: the forget batch is the run's for
    the new identity plus ``replay_batch`` conditions shared among the earlier ones; ``replay_eupmu`` also takes the
    EUPMU optimiser (its settings the run's)."""
    if protection not in PROTECTIONS:
        raise ConfigError(f"config key 'many.sequential_protections': {protection!r} is unknown; use {PROTECTIONS}")
    if protection == "none" or step == 1:
        return dict(run), None
    out = {**run, "forget_batch": run["forget_batch"] + replay_batch}
    if protection == "replay_eupmu":
        out["optimiser"] = "eupmu"
    return out, np.array([replay_batch / (step - 1)] * (step - 1) + [run["forget_batch"]], np.float64)


def job_selections(labels: pd.DataFrame, centroids: pd.DataFrame, identities: list[int], mode: str,
                   selection_cfg: dict, seed: int) -> list[dict]:
    """The selections of one job, one per identity in ``identities`` (the job's identities in order). ``joint``:
    retain-train identities = the selection stage's retain-train side without all of them, each identity's anchor
    drawn among those; ``sequential`` (step len(identities)): identity j as step j saw it, retain-train without
    identities 1..j. Splits, anchors and retain-validation identities are the selection stage's draws (same seeds)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: use one of {MODES}")
    retain_train, retain_val = retain_identity_split(centroids["identity"].to_numpy(),
                                                     selection_cfg["retain_train_fraction"], seed)

    def selections(forget: list[int], excluded: list[int]) -> list[dict]:
        pool = retain_train[~np.isin(retain_train, excluded)]
        return [s.to_dict() for s in experiment_selections(labels, centroids, forget, pool, retain_val,
                                                           selection_cfg, seed)]

    if mode == "joint":
        return selections(identities, identities)
    return [selections([identity], identities[:j + 1])[0] for j, identity in enumerate(identities)]


def replay_selections(labels: pd.DataFrame, centroids: pd.DataFrame, identities: list[int], selection_cfg: dict,
                      seed: int) -> list[dict]:
    """Step len(identities) of a chain with replay: every identity 1..i as its own step drew it, all with step i's
    retain-train identities (without 1..i); an anchor that has been forgotten since is re-drawn among them (same tau,
    tolerance and stream), so that no replayed identity is steered toward a forgotten one."""
    chain = job_selections(labels, centroids, identities, "sequential", selection_cfg, seed)
    current = chain[-1]["retain_train_identities"]
    out = []
    for selection in chain:
        selection = {**selection, "retain_train_identities": current}
        if selection["anchor_identity"] in identities:
            selection.update(anchor_for_tau(selection, centroids, selection["tau"]))
        out.append(selection)
    return out


def merge_conditions(generator, selections: list[dict], faces: pd.DataFrame, centroids: pd.DataFrame,
                     n_mixtures: int, seed: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """What the closed-form merge fits (``models.export.merge_regmean``): per merged identity the
    conditions of its forget-train embeddings and ``n_mixtures`` Dirichlet mixtures of them (PIU Section 3.4, seeded
    per identity), and the conditions of the retain-train centroids of none of them (the preserved identities)."""
    emb, cents = ok_embeddings(faces), centroid_lookup(centroids)
    merged = {s["forget_identity"] for s in selections}
    kept = sorted(set(selections[0]["retain_train_identities"]) - merged)

    def encode(rows: np.ndarray) -> torch.Tensor:
        with torch.no_grad():
            return generator.conditions(torch.as_tensor(np.asarray(rows, np.float32))).float().cpu()

    forget = []
    for s in selections:
        own = np.stack(emb.loc[s["forget_train_images"]].to_numpy()).astype(np.float32)
        rng = np.random.default_rng([seed, _ORDERS, s["forget_identity"]])
        forget.append(encode(np.concatenate([own, dirichlet_mixtures(own, n_mixtures, rng)])))
    return forget, encode(np.stack([cents[j] for j in kept]))


def identity_rows(samples: pd.DataFrame, tau: float) -> pd.DataFrame:
    """Per forget identity (``forget_identity`` column of the scored evaluation samples): forget ISM (PIU eq. 7),
    Acc_U (eq. 8) and FA, the share of forget samples verified as the identity at the audit's threshold ``tau``."""
    is_verified = pd.Series(verified(samples, tau), index=samples.index)
    rows = []
    for identity, part in samples[samples["kind"] == "forget"].groupby("forget_identity", sort=False):
        hits = part["predicted_identity"] == part["target_identity"]
        rows.append({"identity": int(identity), "ism_forget": float(part["own_cosine"].mean()),
                     "acc_forget": float(hits.mean()), "fa_forget": float(is_verified[part.index].mean())})
    return pd.DataFrame(rows)


def pooled_rows(samples: pd.DataFrame) -> dict:
    """One job's pooled numbers over all its identities' evaluation samples: retain ISM (eq. 7 over every retain
    sample), the share of retain samples with a detected face (a model can keep the cosine of the faces it still
    draws while drawing fewer faces), Acc_U, Acc_R and one SRK of the pooled counts (PIU eqs. 8-10,
    ``statistics.pooled_srk``)."""
    counts = pd.DataFrame([sample_counts(part) for _, part in samples.groupby("forget_identity")]).sum()
    retain = samples[samples["kind"] == "retain"]
    return {"ism_retain": float(retain["own_cosine"].mean()),
            "detection_rate_retain": float(retain["detected"].astype(bool).mean()),
            "acc_forget_pooled": counts["forget_hits"] / counts["forget_n"],
            "acc_retain_pooled": counts["retain_hits"] / counts["retain_n"], "srk_pooled": float(pooled_srk(counts))}


def job_table(strategy: str, order: int, size: int, identities: list[int], after: pd.DataFrame,
              before: pd.DataFrame, timings: list[dict], tau: float) -> pd.DataFrame:
    """The rows of one job of ``strategy`` on identity order ``order``: a joint job or merge (``size`` N) or chain
    step (``size`` i): per forgotten identity its forget ISM, Acc_U and FA before and after, beside the job's pooled
    retain ISM, Acc_U, Acc_R and SRK before and after (the original model on the same identities' conditions and
    noise) and its cost: seconds and steps of this job (``timings[-1]``) and of every job it took (``timings``: the
    chain's steps up to i, or the merged single runs and the merge; one entry for a joint job).
    ``before``: the original model's evaluation samples of at least these identities."""
    before = before[before["forget_identity"].isin(identities)]
    rows = identity_rows(after, tau).merge(identity_rows(before, tau), on="identity", suffixes=("", "_before"))
    rows = rows.set_index("identity").loc[identities].reset_index()
    pooled, pooled_before = pooled_rows(after), pooled_rows(before)
    for position, (key, value) in enumerate({"strategy": strategy, "order": order, "size": size}.items()):
        rows.insert(position, key, value)
    rows.insert(4, "forgotten_at", range(1, len(identities) + 1))
    for key, value in pooled.items():
        rows[key], rows[f"{key}_before"] = value, pooled_before[key]
    rows["seconds"], rows["steps"] = job_seconds(timings[-1]), timings[-1]["steps"]
    rows["seconds_total"] = sum(job_seconds(t) for t in timings)
    rows["seconds_measure"] = "; ".join(sorted({job_seconds_measure(t) for t in timings}))  # what seconds_total is
    rows["steps_total"] = sum(t["steps"] for t in timings)
    return rows


def order_summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (strategy, order) at the strategy's largest size: the worst and the mean FA of its identities,
    their mean forget ISM, the pooled retain ISM as a share of the original model's on the same samples, the retain
    samples' face-detection rate, SRK and cost."""
    last = table[table["size"] == table.groupby("strategy")["size"].transform("max")]
    out = last.groupby(["strategy", "order"], sort=False).agg(
        size=("size", "first"), fa_max=("fa_forget", "max"), fa_mean=("fa_forget", "mean"),
        ism_forget_mean=("ism_forget", "mean"), ism_retain=("ism_retain", "first"),
        ism_retain_before=("ism_retain_before", "first"), detection_rate_retain=("detection_rate_retain", "first"),
        srk_pooled=("srk_pooled", "first"), seconds_total=("seconds_total", "first")).reset_index()
    out["retain_ratio"] = out["ism_retain"] / out["ism_retain_before"]
    return out


SUMMARY_METRICS = ("fa_max", "ism_forget_mean", "retain_ratio", "detection_rate_retain", "srk_pooled", "seconds_total")


def strategy_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per strategy: each ``SUMMARY_METRICS`` mean over the orders with its Student-t 95% interval (orders as the
    unit: each order is one draw of identities), and against each target (``FA_TARGET``, ``RETAIN_TARGETS``) the
    orders that meet it and by how much the mean misses or clears it (negative: missed)."""
    rows = []
    for strategy, part in summary.groupby("strategy", sort=False):
        row = {"strategy": strategy, "size": int(part["size"].iloc[0]), "orders": len(part)}
        for metric in SUMMARY_METRICS:
            mean, half = mean_ci(part[metric])
            row.update({metric: mean, f"{metric}_low": mean - half, f"{metric}_high": mean + half})
        row["fa_margin"] = FA_TARGET - row["fa_max"]
        for target, bar in RETAIN_TARGETS.items():
            meets = (part["fa_max"] <= FA_TARGET) & (part["retain_ratio"] >= bar)
            row[f"orders_meeting_{target}_target"] = int(meets.sum())
            row[f"retain_margin_{target}"] = row["retain_ratio"] - bar
        rows.append(row)
    return pd.DataFrame(rows)


def crossed_bootstrap(cells: pd.Series, seed: int, n_boot: int = N_BOOTSTRAP,
                      confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile interval of the mean of ``cells`` (one value per (order, identity), a two-level index) that takes
    both orders and identities as units: the pigeonhole bootstrap (Owen 2007, Ann. Appl. Stat. 1(2)) draws the orders
    and, independently, the distinct identities with replacement, and each replicate is the mean over the observed
    cells weighted by (times its order was drawn) x (times its identity was drawn). The identities of one order share
    a model, so an order moves as one; an identity in several orders moves as one in all of them. A replicate that
    holds no cell is dropped. Returns (low, high); NaN below two orders."""
    order = cells.index.get_level_values(0).to_numpy()
    identity = cells.index.get_level_values(1).to_numpy()
    orders, order_of = np.unique(order, return_inverse=True)
    identities, identity_of = np.unique(identity, return_inverse=True)
    if len(orders) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    order_counts = np.stack([np.bincount(rng.integers(0, len(orders), len(orders)), minlength=len(orders))
                             for _ in range(n_boot)])
    identity_counts = np.stack([np.bincount(rng.integers(0, len(identities), len(identities)),
                                            minlength=len(identities)) for _ in range(n_boot)])
    weights = order_counts[:, order_of] * identity_counts[:, identity_of]  # (replicate, cell)
    total = weights.sum(axis=1)
    replicates = (weights @ cells.to_numpy(np.float64))[total > 0] / total[total > 0]
    low, high = np.quantile(replicates, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return float(low), float(high)


def smallest_wilcoxon_p(n: int) -> float:
    """The smallest two-sided p an exact Wilcoxon signed-rank test can give on n paired differences: all of one sign,
    2 x 2^-n (0.25 at 3 orders; below 0.05 from 6 orders on)."""
    return 2.0 * 0.5 ** n if n else float("nan")


ORDER_METRICS = ("retain_ratio", "fa_max", "fa_mean", "ism_forget_mean", "seconds_total")
CELL_METRICS = ("ism_forget", "fa_forget")


def strategy_comparisons(table: pd.DataFrame, summary: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Paired comparisons of every two strategies (b - a) at their largest size, the order the unit of every interval
    and test: the 8 identities of an order share one model, so they are not 8 independent pairs.
    - unit ``order``: per order (retain ratio, worst and mean FA, mean forget ISM, seconds) the mean difference with
      bootstrap and Student-t intervals over the orders and the two-sided Wilcoxon signed-rank p over the orders
      (``statistics.mean_difference``), Holm-corrected within each metric's family of strategy pairs;
      ``p_smallest`` is the least p the orders can give (``smallest_wilcoxon_p``).
    - unit ``order x identity``: forget ISM and FA of the same identity in the same order, the mean difference with
      the pigeonhole interval over orders and identities (``crossed_bootstrap``, ``boot_low``/``boot_high``); no test
      of its own (the order rows ``ism_forget_mean`` and ``fa_mean`` test the same means order by order).
    ``identities`` counts the distinct identities paired, ``shared_identities`` those paired in more than one order."""
    last = table[table["size"] == table.groupby("strategy")["size"].transform("max")]
    per_order = summary.set_index(["strategy", "order"]).sort_index()
    per_cell = last.set_index(["strategy", "order", "identity"]).sort_index()
    rows = []
    for a, b in itertools.combinations(summary["strategy"].unique(), 2):
        cells = (per_cell.loc[b, CELL_METRICS] - per_cell.loc[a, CELL_METRICS]).dropna(how="all")
        ids = cells.index.get_level_values("identity")
        common = {"orders": cells.index.get_level_values("order").nunique(), "identities": ids.nunique(),
                  "shared_identities": int((pd.Series(ids).value_counts() > 1).sum())}
        for metric in ORDER_METRICS:
            diff = (per_order.loc[b, metric] - per_order.loc[a, metric]).dropna()
            rows.append({"a": a, "b": b, "unit": "order", "metric": metric, **mean_difference(diff, seed),
                         "p_smallest": smallest_wilcoxon_p(int((diff != 0).sum())), **common})
        for metric in CELL_METRICS:
            diff = cells[metric].dropna()
            low, high = crossed_bootstrap(diff, seed)
            rows.append({"a": a, "b": b, "unit": "order x identity", "metric": metric, "n": len(diff),
                         "mean_diff": float(diff.mean()), "boot_low": low, "boot_high": high, **common})
    out = pd.DataFrame(rows)
    out["p_holm"] = out.groupby(["unit", "metric"])["p_wilcoxon"].transform(holm)
    return out[["a", "b", "unit", "metric", "n", "orders", "identities", "shared_identities", "mean_diff", "boot_low",
                "boot_high", "t_low", "t_high", "p_wilcoxon", "p_holm", "p_smallest"]]


def plot_sizes(table: pd.DataFrame, path: str | Path, xlabel: str) -> None:
    """Per strategy against the size (N, or the chain's step): the mean forget ISM of the identities forgotten so
    far and the pooled retain ISM as a share of the original model's, each averaged over the orders (bars: their
    range)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for strategy, part in table.groupby("strategy", sort=False):
        per_order = part.groupby(["size", "order"]).agg(forget=("ism_forget", "mean"), retain=("ism_retain", "first"),
                                                        before=("ism_retain_before", "first"))
        per_order["ratio"] = per_order["retain"] / per_order["before"]
        for ax, column in ((left, "forget"), (right, "ratio")):
            stats = per_order.groupby("size")[column].agg(["mean", "min", "max"])
            ax.errorbar(stats.index, stats["mean"], yerr=[stats["mean"] - stats["min"], stats["max"] - stats["mean"]],
                        marker="o", capsize=3, label=strategy)
    left.set_ylabel("forget ISM (mean of the forgotten identities)")
    right.set_ylabel("retain ISM / original model's")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        sizes = sorted(table["size"].unique())
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_xlabel(xlabel)
        ax.legend(fontsize=7)
    save_figure(fig, path)
    plt.close(fig)
