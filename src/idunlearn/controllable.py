"""Controllable unlearning (epsilon-constrained optimisation, seed paper 001 Section 4.3): the Phase II bound from
the Phase I boundary runs, and the Pareto table and plot of the whole sweep."""

from __future__ import annotations

import copy
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from .evaluation.aggregate import identity_counts, mean_ci  # noqa: E402
from .evaluation.statistics import bootstrap_pooled, pooled_srk  # noqa: E402
from .unlearning import build_method  # noqa: E402
from .unlearning.optimisers import epsilon_at  # noqa: E402
from .unlearning.runner import unlearn  # noqa: E402

TAIL = 0.1  # the last 10% of steps: the objectives "at the end of training", averaged over batches
PARETO_METRICS = ["ism_forget_after", "ism_retain_after", "srk_identity_after", "kd_forget_delta", "kd_retain_delta"]


def final_objective(losses: pd.DataFrame, column: str) -> float:
    """An objective at the end of training: its mean over the last ``TAIL`` of the logged steps (each step sees a
    fresh batch, so one step's value is noisy)."""
    values = losses.sort_values("step")[column].to_numpy(np.float64)
    return float(values[-max(1, int(round(TAIL * len(values)))):].mean())


# the loss-log column Phase II's epsilon bounds, per ``epsilon_scale``: f1 itself, or f1 / the original model's f1
# on the same batch (logged by the epsilon-constrained optimiser under ``batch`` only)
BOUNDED_COLUMNS = {"first_step": "forget_loss", "batch": "forget_relative"}


def bounded_column(log: pd.DataFrame) -> str:
    """The column Phase II's epsilon bounds in a run's loss log: ``forget_relative`` where the run logged it
    (``epsilon_scale: batch``), else ``forget_loss``."""
    relative = BOUNDED_COLUMNS["batch"]
    return relative if relative in log.columns else BOUNDED_COLUMNS["first_step"]


def phase_two_epsilon(fraction: float, highest: pd.DataFrame, lowest: pd.DataFrame, column: str | None = None) -> float:
    """Phase II's bound on f1 (the forget objective, in ``column``; by default the boundary runs'
    ``bounded_column``) at ``fraction`` of the range between the Phase I boundaries, from their loss logs."""
    column = column or bounded_column(highest)
    return epsilon_at(fraction, final_objective(highest, column), final_objective(lowest, column))


def run_epsilon(run: dict, highest: pd.DataFrame, lowest: pd.DataFrame) -> float:
    """A Phase II run's epsilon at its ``epsilon_fraction`` from its identity's boundary runs, which must have
    logged the column its ``epsilon_scale`` bounds (the controllable expansion gives every point the same scale)."""
    expected = BOUNDED_COLUMNS[run["epsilon_scale"]]
    if bounded_column(highest) != expected or bounded_column(lowest) != expected:
        raise ValueError(f"Phase II run with epsilon_scale {run['epsilon_scale']!r}: its boundary runs were not run "
                         f"with the same epsilon_scale (their loss logs lack or carry 'forget_relative'); give "
                         f"epsilon_scale to the base run or to unlearning.controllable.<run>.overrides")
    return phase_two_epsilon(run["epsilon_fraction"], highest, lowest)


def boundary_range(highest: pd.DataFrame, lowest: pd.DataFrame, column: str = "forget_loss") -> float:
    """f1(lowest) - f1(highest) at the end of the two Phase I runs (f1 itself, or ``column``)."""
    return final_objective(lowest, column) - final_objective(highest, column)


def epsilon_spacing(fractions) -> float:
    """The smallest gap between neighbouring bounds, as a fraction of the boundaries' range: Phase II's fractions
    with the boundaries' own 0 and 1 (0.25 for fractions 0.25, 0.5, 0.75)."""
    return float(np.diff(sorted({0.0, 1.0, *map(float, fractions)})).min())


def tracking(log: pd.DataFrame, epsilon: float, column: str, spacing: float) -> dict:
    """How a Phase II run tracked its bound, in the bounded ``column``'s units: ``bound_gap_spacings`` = (its end
    value - epsilon) / ``spacing`` (the epsilon spacing in those units; negative: it ended below the bound, i.e. more
    forgetting than asked), the lowest tenth-of-steps mean after the first step at the bound
    (``overshoot_spacings``, same units: momentum carrying f1 past the bound), the first step at the bound (None:
    never reached) and the share of steps from there on with eta_t = 0 (``bound_activity``)."""
    first, idle = bound_activity(log, epsilon, column)
    after = [mean for last, mean in tenths(log, column) if first is not None and last >= first]
    return {"bound_gap_spacings": (final_objective(log, column) - epsilon) / spacing,
            "overshoot_spacings": (min(after) - epsilon) / spacing if after else float("nan"),
            "first_step_at_bound": first, "bound_idle_share": idle}


TRACKING_COLUMNS = ["bound_gap_spacings", "overshoot_spacings", "first_step_at_bound", "bound_idle_share"]


def pareto_table(points: dict[str, list[tuple[str, str]]], metrics: pd.DataFrame,
                 losses: dict[tuple[str, int], pd.DataFrame], tolerances: dict[str, float]) -> pd.DataFrame:
    """One row per (base run, forget identity, point): completeness rank (0 = highest), f1 and f2 at the end of
    training, Phase II's bound epsilon (NaN at the boundaries) and the bounded objective at the end (``f1_bounded``,
    the same column as epsilon: f1, or f1 relative to the original model's under ``epsilon_scale: batch``), how
    Phase II tracked its bound (``tracking``; NaN at the boundaries), the boundaries' f1 range and whether it is
    degenerate (range <= the base run's tolerance: the boundaries coincide and every point is the same trade-off),
    and the evaluation metrics. ``points``: base run -> [(point, run name)] in completeness order, the highest
    boundary first and the lowest last; ``losses``: (run, identity) -> loss log; ``tolerances``: base run ->
    ``unlearning.controllable.<run>.tolerance``."""
    rows = []
    for base, runs in points.items():
        highest, lowest = runs[0][1], runs[-1][1]
        spacing = epsilon_spacing(point for point, _ in runs[1:-1])
        for rank, (point, run) in enumerate(runs):
            for rec in metrics[metrics["run"] == run].itertuples():
                log, identity = losses[(run, rec.forget_identity)], rec.forget_identity
                boundaries = losses[(highest, identity)], losses[(lowest, identity)]
                column = bounded_column(boundaries[0])
                f1_range = boundary_range(*boundaries)
                if run in (highest, lowest):
                    bound, tracked = float("nan"), dict.fromkeys(TRACKING_COLUMNS, float("nan"))
                else:
                    bound = phase_two_epsilon(float(point), *boundaries)
                    tracked = tracking(log, bound, column, spacing * boundary_range(*boundaries, column=column))
                rows.append({"base_run": base, "forget_identity": identity, "point": point, "run": run,
                             "completeness_rank": rank, "epsilon": bound, "f1_range": f1_range,
                             "degenerate": bool(f1_range <= tolerances[base]),
                             "f1_forget": final_objective(log, "forget_loss"),
                             "f1_bounded": final_objective(log, column), **tracked,
                             "f2_retain": final_objective(log, "retain_loss"),
                             **{m: getattr(rec, m) for m in PARETO_METRICS}})
    return pd.DataFrame(rows).sort_values(["base_run", "forget_identity", "completeness_rank"]).reset_index(drop=True)


def pareto_summary(table: pd.DataFrame, counts: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Per (base run, point): mean and 95% half width over forget identities, the pooled SRK after unlearning with
    its identity-bootstrap interval (``srk_after``: PIU eqs. 8-10 on the counts of all the point's forget
    identities, ``counts`` = aggregate's sample_counts table, as the study's SRK; ``srk_identity_after_mean`` is the
    mean of per-identity SRKs, a different statistic), and how many identities have a degenerate front; and per
    base run the Spearman correlation of forget ISM with the completeness rank (positive: forget ISM rises as
    completeness falls)."""
    records = []
    for (base, rank, point), group in table.groupby(["base_run", "completeness_rank", "point"], sort=True):
        after = identity_counts(counts, group["run"].iloc[0], "after").loc[sorted(group["forget_identity"])]
        srk, low, high = bootstrap_pooled(after, pooled_srk, seed)
        record = {"base_run": base, "point": point, "completeness_rank": rank, "n_identities": len(group),
                  "n_degenerate": int(group["degenerate"].sum()), "srk_after": srk, "srk_after_ci_low": low,
                  "srk_after_ci_high": high}
        for col in ["epsilon", "f1_range", "f1_forget", "f2_retain", "bound_gap_spacings", *PARETO_METRICS]:
            record[f"{col}_mean"], record[f"{col}_ci95"] = mean_ci(group[col])
        records.append(record)
    summary = pd.DataFrame(records)
    for base, part in table.groupby("base_run"):
        rho = stats.spearmanr(part["completeness_rank"], part["ism_forget_after"]).statistic
        summary.loc[summary["base_run"] == base, "ism_forget_rank_spearman"] = float(rho)
    return summary


def pareto_figure(table: pd.DataFrame, summary: pd.DataFrame):
    """Left: f2 against f1 at the end of training per identity (thin) and averaged (thick, with 95% bars).
    Right: retain ISM against forget ISM after unlearning, same layout."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    panels = [("f1_forget", "f2_retain", "forget objective f1 (end of training)", "retain objective f2"),
              ("ism_forget_after", "ism_retain_after", "forget ISM after", "retain ISM after")]
    for ax, (x, y, xlabel, ylabel) in zip(axes, panels):
        for (base, ident), part in table.groupby(["base_run", "forget_identity"]):
            ax.plot(part[x], part[y], "-o", color="0.75", lw=0.8, ms=3)
        for base, part in summary.groupby("base_run"):
            ax.errorbar(part[f"{x}_mean"], part[f"{y}_mean"], xerr=part[f"{x}_ci95"], yerr=part[f"{y}_ci95"],
                        fmt="-o", lw=2, capsize=3, label=f"{base} (mean over identities)")
            for px, py, point in zip(part[f"{x}_mean"], part[f"{y}_mean"], part["point"]):
                ax.annotate(point, (px, py), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Controllable unlearning: the boundaries (highest, lowest) and Phase II epsilon fractions")
    fig.tight_layout()
    return fig


def tenths(losses: pd.DataFrame, column: str) -> list[tuple[int, float]]:
    """(last step, mean of ``column``) of each tenth of the logged steps, in step order (one per step below ten)."""
    ordered = losses.sort_values("step")
    chunks = zip(np.array_split(ordered["step"].to_numpy(), 10),
                 np.array_split(ordered[column].to_numpy(np.float64), 10))
    return [(int(steps[-1]), float(values.mean())) for steps, values in chunks if len(steps)]


def f1_by_tenth(losses: pd.DataFrame, column: str = "forget_loss") -> list[float]:
    """The forget objective's (or ``column``'s) mean over each tenth of the logged steps, in step order (``tenths``:
    one per step below ten steps)."""
    return [mean for _, mean in tenths(losses, column)]


def bound_activity(losses: pd.DataFrame, epsilon: float, column: str = "forget_loss") -> tuple[int | None, float]:
    """Whether Phase II's bound still acts once it is reached: the first logged step whose batch f1 is <= epsilon,
    and the share of steps from there on with eta_t = 0, where Algorithm 1 steps along the retain gradient alone
    (psi < 0 and grad f2 . grad f1 >= psi). A share near 1 with f1 still falling means the retain descent itself
    lowers f1: the paper's constraint bounds f1 from above only (Lemma 7: [f1 - epsilon]+), so nothing pulls it back
    up to epsilon. (None, nan) when f1 never reaches the bound."""
    ordered = losses.sort_values("step")
    reached = ordered[ordered[column] <= epsilon]
    if reached.empty:
        return None, float("nan")
    first = int(reached["step"].iloc[0])
    after = ordered[ordered["step"] >= first]
    return first, float((after["eta_t"] == 0).mean())


def phase_two_tracking(generator, data, run: dict, workdir, betas=(1.0,), fraction: float = 0.5, seed: int = 0,
                       spacing_fraction: float = 0.25) -> pd.DataFrame:
    """How close Phase II ends to its bound: the boundary runs (``highest`` and the extension's ``original``, which
    needs no training to span a range) and one Phase II run at ``fraction`` per beta, every run on the same batches
    (one seed). One row per beta, in the column epsilon bounds (``bounded_column``: f1, or f1 relative to the
    original model's on the batch under the run's ``epsilon_scale: batch``): epsilon, the spacing of the paper's
    grid (``spacing_fraction`` of the boundaries' range), the bounded objective at the end (``final_objective``), the
    distance in spacings, the violation [f1 - epsilon]+ (what the paper's Lemma 7 bounds), whether the bound still
    acts once reached (``bound_activity``) and the mean over each tenth of the steps, for the Phase II run and for
    both boundaries on the same batches (the ``original`` run's weights never change, so its tenths show how much f1
    moves with the batches alone); and, whatever the scale, the distance of f1 itself from the bound that
    ``epsilon_scale: first_step`` would set (``spacings_from_f1_bound``), so that both scales are compared on one
    measure."""
    def losses(name: str, **settings) -> pd.DataFrame:
        return unlearn(copy.deepcopy(generator), build_method(run["method"], run), data, {**run, **settings},
                       Path(workdir) / f"{name}.pt", seed=seed)[0]

    highest, original = losses("highest", epsilon_phase="highest"), losses("original", epsilon_phase="original")
    column = bounded_column(highest)
    spacing = spacing_fraction * boundary_range(highest, original, column)
    epsilon = phase_two_epsilon(fraction, highest, original)
    f1_spacing = spacing_fraction * boundary_range(highest, original)
    f1_epsilon = phase_two_epsilon(fraction, highest, original, "forget_loss")
    rows = []
    for beta in betas:
        f1 = losses(f"controlled_{beta}", epsilon_phase="controlled", epsilon=epsilon, epsilon_beta=beta)
        end, tracked = final_objective(f1, column), tracking(f1, epsilon, column, spacing)
        rows.append({"beta": beta, "bounded": column, "epsilon": epsilon, "spacing": spacing, "f1_end": end,
                     "spacings_from_bound": abs(tracked["bound_gap_spacings"]), "violation": max(end - epsilon, 0.0),
                     "spacings_from_f1_bound": abs(final_objective(f1, "forget_loss") - f1_epsilon) / f1_spacing,
                     "first_step_at_bound": tracked["first_step_at_bound"],
                     "eta_zero_share_after": tracked["bound_idle_share"],
                     "f1_by_tenth": f1_by_tenth(f1, column), "highest_f1_by_tenth": f1_by_tenth(highest, column),
                     "original_f1_by_tenth": f1_by_tenth(original, column)})
    return pd.DataFrame(rows)
