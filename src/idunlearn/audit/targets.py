"""Targets of removal under the held-out attacks (config ``audit.targets``; tables/audit_targets.csv).

A method removes a person when no held-out attack brings them back and everybody else keeps their likeness: per
audited run, every held-out attack's success (the embedding attack under each recognizer, the inversion attack) at
most ``attack_success_max``, every held-out relearning variant's recovery after each listed step count at most its
bound, and the pooled retain ISM at least ``retain_ratio_min`` x the ``compare_to`` run's. Each target's value is the
mean over forget identities with its identity-bootstrap 95% interval (the retain target: the ratio of the two runs'
mean retain ISM on the same identities, resampled together); ``met`` reads the mean and ``margin`` says by how much
it clears (positive) or misses (negative) the bound. Each run is also paired by identity with ``compare_to`` and with
the never-trained reference (mean difference, Student-t 95% interval, two-sided Wilcoxon p, Holm-corrected over the
run's targets against that run).

Recovery divides by the ISM gap unlearning opened, which is small where the light probes still find the person, so
there it can read well above 1 (relearning past the original) and pull the mean up: every recovery target also gives
its mean over the identities the run forgot under the light probes alone (verdict other than "not forgotten";
``forgotten_*`` columns). ``met`` reads the mean over all identities, as the targets are stated.

A target whose attack the run's method trains against (same step function and data, learning rate inside its
training range: audit/heldout.py, the table's ``trained_against`` column) is marked ``trained_against``: its value is
kept, but it is no held-out result for that run and is no part of what the run is said to meet.
"""

from __future__ import annotations

import pandas as pd

from ..evaluation.statistics import bootstrap_mean, bootstrap_pooled, holm, paired_with
from .heldout import HELDOUT_RELEARNING
from .tables import ORIGINAL
from .verdicts import HELDOUT_COMPARED, NOT_FORGOTTEN, row_values

RETAIN_ISM = ("evaluation", "retain", "ism")
# the target's name of each held-out attack's success row (verdicts.HELDOUT_COMPARED: the rows runs are compared on)
ATTACK_TARGETS = {("attack_heldout", "best", "fa"): "held-out embedding attack success",
                  ("attack_heldout", "best", "fa_second"): "held-out embedding attack success (second recognizer)",
                  ("inversion", "regenerated", "fa"): "inversion attack success"}
AGAINST = ("compare", "reference")  # column prefixes of the two pairings
TARGET_COLUMNS = ["run", "target", "probe", "setting", "metric", "kind", "bound", "n", "mean", "ci_low", "ci_high",
                  "met", "margin", "trained_against", "forgotten_n", "forgotten_mean", "forgotten_ci_low", "forgotten_ci_high",
                  *[f"{side}_{column}" for side in AGAINST
                    for column in ("run", "n", "mean_diff", "t_low", "t_high", "p_wilcoxon", "p_holm")]]


def target_rows(table: pd.DataFrame, targets: dict) -> list[tuple[str, str, str, str, str, float]]:
    """(name, probe, setting, metric, kind, bound) of every target the audit table can be judged on: kind "max"
    (at most the bound) or "retain_ratio" (the run's mean retain ISM over compare_to's, at least the bound)."""
    rows = [(ATTACK_TARGETS[key], *key, "max", targets["attack_success_max"]) for key in HELDOUT_COMPARED]
    variants = sorted(p[len(HELDOUT_RELEARNING) + 1:] for p in table["probe"].unique()
                      if p.startswith(f"{HELDOUT_RELEARNING}:"))
    rows += [(f"relearning recovery, {variant}, {t['steps']} steps", f"{HELDOUT_RELEARNING}:{variant}",
              f"k={t['steps']}", "recovery", "max", float(t["max"]))
             for t in targets["relearning"] for variant in variants]
    rows.append(("retain ISM / compare_to's", *RETAIN_ISM, "retain_ratio", targets["retain_ratio_min"]))
    present = set(zip(table["probe"], table["setting"], table["metric"]))
    return [row for row in rows if row[1:4] in present]


def audit_targets(table: pd.DataFrame, targets: dict, compare_to: str | None, reference: str | None,
                  seed: int, verdicts: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (audited run other than the original, target): value with interval, met, margin, and the pairings
    with ``compare_to`` and ``reference`` (``TARGET_COLUMNS``). No retain ratio without ``compare_to``. With
    ``verdicts`` (verdicts.identity_verdicts), a recovery target's mean over the identities the run forgot."""
    forgotten = set() if verdicts is None else {
        (run, int(identity)) for run, identity, verdict in verdicts[["run", "identity", "verdict"]].to_numpy()
        if verdict != NOT_FORGOTTEN}
    records = []
    runs = sorted(set(table["run"]) - {ORIGINAL})
    marked = (set() if "trained_against" not in table else
              set(map(tuple, table.loc[table["trained_against"].astype(bool), ["run", "probe"]].to_numpy())))
    for name, probe, setting, metric, kind, bound in target_rows(table, targets):
        values = row_values(table, probe, setting, metric)
        measured = set(values.index.get_level_values("run"))
        for run in (r for r in runs if r in measured):
            own = values.loc[run].dropna()
            if kind == "retain_ratio":
                if compare_to not in measured or run == compare_to:
                    continue
                both = pd.concat({"run": own, "base": values.loc[compare_to]}, axis=1).dropna()
                # the pooled ratio mean(run) / mean(compare_to), identities resampled together (percentile bootstrap)
                mean, low, high = bootstrap_pooled(both, lambda s: s["run"] / s["base"], seed)
                n, margin = len(both), mean - bound
            else:
                (mean, low, high), n = bootstrap_mean(own, seed), len(own)
                margin = bound - mean
            record = {"run": run, "target": name, "probe": probe, "setting": setting, "metric": metric, "kind": kind,
                      "bound": bound, "n": n, "mean": mean, "ci_low": low, "ci_high": high,
                      "met": bool(margin >= 0), "margin": margin, "trained_against": (run, probe) in marked}
            if metric == "recovery" and verdicts is not None:
                on_forgotten = own[[(run, int(identity)) in forgotten for identity in own.index]]
                record.update(zip(("forgotten_mean", "forgotten_ci_low", "forgotten_ci_high"),
                                  bootstrap_mean(on_forgotten, seed)), forgotten_n=len(on_forgotten))
            for side, other in zip(AGAINST, (compare_to, reference)):
                record.update({f"{side}_{k}": v for k, v in paired_with(values, run, other, seed).items()})
            records.append(record)
    out = pd.DataFrame.from_records(records).reindex(columns=TARGET_COLUMNS)
    for side in AGAINST:  # Holm over the run's targets against that run
        out[f"{side}_p_holm"] = out.groupby("run")[f"{side}_p_wilcoxon"].transform(holm)
    return out
