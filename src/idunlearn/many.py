"""Forgetting many people (config ``many``): joint unlearning of N identities in one run, and a sequential chain
theta_i = unlearn(theta_{i-1}, id_i), with what each costs the identities kept.

Identities: ``many.identities``, or the first ones of the selection stage's forget order (PIU Section 4's draw; the
order ``selection.n_forget`` takes a prefix of, so identity 1 is the study's first forget identity).

Retain sets. Joint N: the retain-train identities leave out all N forgotten ones, and each identity's anchor (PIU
eq. 6) is drawn among those. Sequential step i: the retain-train identities leave out identities 1..i (never the
later ones), so that step i depends on identities 1..i only and changing identity 5 reruns steps 5-8 alone.
Retain ISM is always measured on the retain-validation identities, which are never forget identities.
With one identity both are the ordinary experiment of the selection stage: joint N = 1 and sequential step 1 are
the ``unlearn`` job of the same run and identity.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .audit.verification import verified  # noqa: E402
from .config import ConfigError  # noqa: E402
from .evaluation.statistics import pooled_srk, sample_counts  # noqa: E402
from .io import save_figure  # noqa: E402
from .selection import experiment_selections, forget_identity_order, retain_identity_split  # noqa: E402

MODES = ("joint", "sequential")


def forget_order(centroids: pd.DataFrame, selection_cfg: dict, seed: int) -> list[int]:
    """Every eligible forget identity in the selection stage's order (``selection.forget_identity_order`` over the
    retain-train side of its identity split)."""
    retain_train, _ = retain_identity_split(centroids["identity"].to_numpy(), selection_cfg["retain_train_fraction"],
                                            seed)
    return forget_identity_order(centroids.set_index("identity")["size"], retain_train,
                                 selection_cfg["min_forget_images"], seed, selection_cfg.get("target_mean_size"))


def needed(cfg: dict) -> int:
    """How many identities the ``many`` section uses: the largest joint size or the chain's length."""
    return max([*cfg["joint_sizes"], cfg["sequential_length"]])


def chosen_identities(cfg: dict, order: list[int]) -> list[int]:
    """The ``many`` section's identities in order: ``identities`` (checked: distinct eligible forget identities,
    enough of them) or the first ``needed(cfg)`` of ``order``."""
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
    sample), Acc_U, Acc_R and one SRK of the pooled counts (PIU eqs. 8-10, ``statistics.pooled_srk``)."""
    counts = pd.DataFrame([sample_counts(part) for _, part in samples.groupby("forget_identity")]).sum()
    return {"ism_retain": float(samples.loc[samples["kind"] == "retain", "own_cosine"].mean()),
            "acc_forget_pooled": counts["forget_hits"] / counts["forget_n"],
            "acc_retain_pooled": counts["retain_hits"] / counts["retain_n"], "srk_pooled": float(pooled_srk(counts))}


def job_table(mode: str, size: int, identities: list[int], after: pd.DataFrame, before: pd.DataFrame,
              timings: list[dict], tau: float) -> pd.DataFrame:
    """The rows of one joint job (``size`` N) or sequential step (``size`` i): per forgotten identity its forget ISM,
    Acc_U and FA before and after, beside the job's pooled retain ISM, Acc_U, Acc_R and SRK before and after (the
    original model on the same identities' conditions and noise) and its cost: seconds and steps of this job
    (``timings[-1]``) and of all jobs up to it (``timings``: the chain's steps up to i; one entry for a joint job).
    ``before``: the original model's evaluation samples of at least these identities."""
    before = before[before["forget_identity"].isin(identities)]
    rows = identity_rows(after, tau).merge(identity_rows(before, tau), on="identity", suffixes=("", "_before"))
    rows = rows.set_index("identity").loc[identities].reset_index()
    pooled, pooled_before = pooled_rows(after), pooled_rows(before)
    rows.insert(0, "mode", mode)
    rows.insert(1, "size", size)
    rows.insert(3, "forgotten_at", range(1, len(identities) + 1))
    for key, value in pooled.items():
        rows[key], rows[f"{key}_before"] = value, pooled_before[key]
    rows["seconds"], rows["steps"] = timings[-1]["seconds_this_session"], timings[-1]["steps"]
    rows["seconds_total"] = sum(t["seconds_this_session"] for t in timings)
    rows["steps_total"] = sum(t["steps"] for t in timings)
    return rows


def plot_sequential(table: pd.DataFrame, path: str | Path) -> None:
    """Forget ISM of every identity forgotten so far and the retain ISM (with the original model's on the same
    samples) against the chain's step: does earlier forgetting persist, and what does the chain cost the identities
    kept."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for identity, part in table.groupby("identity", sort=False):
        part = part.sort_values("size")
        ax.plot(part["size"], part["ism_forget"], marker="o", lw=1, label=f"forget {identity}")
    retain = table.drop_duplicates("size").sort_values("size")
    ax.plot(retain["size"], retain["ism_retain"], color="k", lw=2.5, marker="s", label="retain (validation ids)")
    # the retain samples pool the evaluation sets of identities 1..i, so the original model's value moves with i
    ax.plot(retain["size"], retain["ism_retain_before"], color="k", ls=":", lw=1, label="retain, original model")
    ax.set_xlabel("step i (identities forgotten so far)")
    ax.set_ylabel("ISM")
    ax.set_xticks(retain["size"])
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, path)
    plt.close(fig)


def plot_joint(table: pd.DataFrame, path: str | Path) -> None:
    """Per joint size N: every forgotten identity's forget ISM (points) and their mean, the pooled retain ISM, and
    both before unlearning."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.scatter(table["size"], table["ism_forget"], s=14, color="#c44e52", alpha=0.6, label="forget ISM per identity")
    per_n = table.groupby("size").agg(ism_forget=("ism_forget", "mean"), ism_forget_before=("ism_forget_before",
                                      "mean"), ism_retain=("ism_retain", "first"),
                                      ism_retain_before=("ism_retain_before", "first")).sort_index()
    ax.plot(per_n.index, per_n["ism_forget"], color="#c44e52", marker="o", label="forget ISM (mean)")
    ax.plot(per_n.index, per_n["ism_forget_before"], color="#c44e52", ls=":", label="forget ISM before")
    ax.plot(per_n.index, per_n["ism_retain"], color="k", lw=2.5, marker="s", label="retain ISM")
    ax.plot(per_n.index, per_n["ism_retain_before"], color="k", ls=":", label="retain ISM before")
    ax.set_xscale("log", base=2)
    ax.set_xticks(per_n.index, [str(n) for n in per_n.index])
    ax.set_xlabel("identities unlearned jointly (N)")
    ax.set_ylabel("ISM")
    ax.legend(fontsize=7)
    save_figure(fig, path)
    plt.close(fig)
