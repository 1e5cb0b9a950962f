"""The audit's verdicts: for every audited (run, forget identity), whether the person is still drawn, hidden (the light
probes find nothing but the embedding attack brings the person back) or removed; per run the count of each, and the
paired differences of every run against a reference run on the same identities (the comparison a robust method is
judged by: PIU against `piu_robust`, a baseline against PIU).

The rule, declared in config ``audit.verdict`` before any audit runs:
- forgotten under the light probes: the evaluation's forget samples and the photo probe's train and validation
  photos each have FA <= ``light_max_fa``;
- recovered by the attack: the attack's samples have FA >= ``recovered_min_fa``; when the independent second
  recognizer ran, it must agree (its FA >= ``recovered_min_fa`` too), else the attack only fooled the recognizer it used
  ("hidden, first recognizer only");
- hidden when the attack recovers the person: its samples' FA >= ``recovered_min_fa`` (the absolute bar), or, with the
  never-trained reference (``reference``, run ``retrain``: the generator trained without the person) audited on the
  identity, its samples are verified significantly more often from the run than from the reference (one-sided
  Fisher exact test on the counts, p < 0.05). Either fires: hidden (a run past the absolute bar is never removed).
- removed only on evidence: with the reference, an equivalence test shows the attack's success close to the
  reference's (the one-sided 95% upper bound of run - reference, Newcombe's hybrid score interval, at most
  ``equivalence_margin``) under each recognizer that ran; without it (or on the reference itself), the absolute rule
  alone. Either way the attack must pass its control on the identity (on the original model at least
  ``ATTACK_BOUND`` x the original's forget ISM), and failing to show hidden is never enough.
- undetermined otherwise, with the reason: no attack ran, the attack failed its control, or too few attack samples
  to show equivalence (the samples per arm needed for ``power`` at the margin, with both arms at the reference's
  pooled rate, is in the reason and in the verdict table's ``samples_needed``: audit.attack_samples draws more
  without rerunning the audit jobs), or the upper bound lies above the margin with enough samples.
Per run, ``reference_comparisons`` gives the paired differences with the reference (attack success, Leak@k, relearning
recovery, retain ISM and the held-out attacks) with Holm-corrected p-values.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from ..evaluation.statistics import (difference_upper_bound, equivalence_power, equivalence_samples, holm,
                                     mean_difference, paired_differences)
from .heldout import HELDOUT_RELEARNING
from .tables import ORIGINAL, attack_control_by_identity
from .verification import clopper_pearson

NOT_FORGOTTEN, HIDDEN, HIDDEN_FIRST_ONLY, REMOVED, UNDETERMINED = (
    "not forgotten", "hidden", "hidden, first recognizer only", "removed", "undetermined")
VERDICTS = (NOT_FORGOTTEN, HIDDEN, HIDDEN_FIRST_ONLY, UNDETERMINED, REMOVED)  # most to least cautious: breaks ties
VERDICT_COLUMNS = ["run", "identity", "evaluation_fa", "photo_fa", "attack_fa", "attack_fa_second", "control_passes",
                   "upper_difference", "recovery_gap", "verdict", "reason"]
# the equivalence test's design, the same on every row of a verdict table (NaN without a reference)
DESIGN_COLUMNS = ["reference", "margin", "samples", "reference_rate", "samples_needed", "target_power", "power", "recovery_min_gap"]
RECOVERY_GAP = ("relearning", "k=0", "gap")  # the forget-ISM gap unlearning opened (relearning.with_recovery)
# why an identity is undetermined (the ``reason`` column; empty for every other verdict)
NO_ATTACK = "no attack ran (the attack probe is off in audit.probes, as in the default run's light audit)"
WEAK_ATTACK = "the attack failed its control on the identity (too weak there to tell hidden from removed)"
TOO_FEW_MARK = "attack samples per arm cannot show equivalence"
TOO_FEW = "{n} " + TOO_FEW_MARK + " with the reference at margin {margin:g}; {needed} per arm give {power:.0%} power"
NOT_CLOSE = "the attack's success is not shown within {margin:g} of the reference's (upper bound above the margin)"
# the overlay that adds the attack probe to the default run's audit, so that its verdicts are decided
DECIDE_COMMAND = "snakemake audit --cores 2 --configfile config/config.yaml config/audit.yaml"
COMPARISON_COLUMNS = ["run", "reference", "probe", "setting", "metric", "n", "mean_diff", "boot_low", "boot_high",
                      "t_low", "t_high", "p_wilcoxon"]


LOCALITY_MEAN = ("locality", "mean", "ism_delta")  # retain ISM after - before over all retain samples


def row_values(table: pd.DataFrame, probe: str, setting: str, metric: str, column: str = "value") -> pd.Series:
    """(run, identity) -> ``column`` of one audit row kind; LOCALITY_MEAN: the job's retain identities' ISM changes
    weighted by their sample counts, i.e. the mean change over all retain samples."""
    if (probe, setting, metric) == LOCALITY_MEAN:
        part = table[(table["probe"] == probe) & (table["metric"] == metric)]
        weighted = (part["value"] * part["n"]).groupby([part["run"], part["identity"]]).sum()
        return weighted / part.groupby(["run", "identity"])["n"].sum()
    part = table[(table["probe"] == probe) & (table["setting"] == setting) & (table["metric"] == metric)]
    return part.set_index(["run", "identity"])[column]


def attack_counts(table: pd.DataFrame, metric: str) -> tuple[pd.Series, pd.Series]:
    """(verified samples, samples) of the attack per (run, identity), under ``metric`` (fa or fa_second)."""
    share, n = (row_values(table, "attack", "best", metric, column) for column in ("value", "n"))
    return (share * n).round(), n


def above_reference(table: pd.DataFrame, reference: str | None, metric: str,
                    alpha: float = 0.05) -> dict[tuple[str, int], bool]:
    """(run, identity) -> whether the attack's samples are verified (``metric``: fa or fa_second) more often from
    the run than from the reference run on the same identity: one-sided Fisher exact test on the verified counts
    (Fisher 1922), p < ``alpha``; only identities the reference was audited on (with that metric)."""
    return {key: bool(stats.fisher_exact(cells, alternative="greater")[1] < alpha)
            for key, cells in _against_reference(table, reference, metric).items()}


def close_to_reference(table: pd.DataFrame, reference: str | None, metric: str,
                       confidence: float = 0.95) -> dict[tuple[str, int], float]:
    """(run, identity) -> the one-sided ``confidence`` upper bound of the attack's success from the run minus from
    the reference on the same identity (Newcombe's hybrid score interval), under ``metric``; only identities the
    reference was audited on. The equivalence test shows removal where it is at most the margin."""
    return {key: float(difference_upper_bound(hits, hits + misses, base_hits, base_hits + base_misses, confidence))
            for key, ((hits, misses), (base_hits, base_misses)) in
            _against_reference(table, reference, metric).items()}


def _against_reference(table: pd.DataFrame, reference: str | None, metric: str) -> dict:
    """(run, identity) -> the 2 x 2 table [[run hits, run misses], [reference hits, reference misses]] of the
    attack's verified samples, for every run other than the reference on identities the reference was audited on."""
    if reference is None:
        return {}
    hits, n = attack_counts(table, metric)
    if reference not in hits.index.get_level_values("run"):
        return {}
    base_hits, base_n = hits.loc[reference], n.loc[reference]
    cells = {}
    for (run, identity), count in hits.items():
        if run == reference or identity not in base_hits.index or np.isnan(count) or np.isnan(base_hits.loc[identity]):
            continue
        cells[(run, int(identity))] = [[int(count), int(n.loc[(run, identity)] - count)],
                                       [int(base_hits.loc[identity]), int(base_n.loc[identity] - base_hits.loc[identity])]]
    return cells


def equivalence_design(table: pd.DataFrame, reference: str | None, margin: float, power: float) -> dict:
    """The equivalence test's design (``DESIGN_COLUMNS``): the margin, the attack's samples per identity (the
    fewest any audited (run, identity) drew), the reference's pooled attack success (the larger of the two
    recognizers' where the second ran), the samples per arm at which the test reaches ``power`` when run and
    reference both succeed at that rate (a removed model: ``statistics.equivalence_samples``), and the power at the
    samples drawn. NaN (but the margin and power) where the reference was not audited with the attack."""
    design = dict.fromkeys(DESIGN_COLUMNS, float("nan")) | {"reference": reference, "margin": margin,
                                                            "target_power": power}
    # the original model is the attack's control, not an arm of the test
    rates = []
    for metric in ("fa", "fa_second"):
        hits, n = attack_counts(table, metric)
        if reference is not None and reference in hits.index.get_level_values("run"):
            base = pd.concat([hits.loc[reference], n.loc[reference]], axis=1).dropna()
            if len(base):
                rates.append(base.iloc[:, 0].sum() / base.iloc[:, 1].sum())
        audited = n.drop(ORIGINAL, level="run", errors="ignore").dropna()
        if metric == "fa" and len(audited):
            design["samples"] = int(audited.min())
    if rates and not np.isnan(design["samples"]):
        rate = max(rates)
        design.update(reference_rate=rate, samples_needed=equivalence_samples(rate, margin, power),
                      power=equivalence_power(design["samples"], rate, margin))
    return design


def identity_verdicts(table: pd.DataFrame, light_max_fa: float, recovered_min_fa: float,
                      reference: str | None = None, equivalence_margin: float = 0.1,
                      power: float = 0.8, recovery_min_gap: float = 0.1) -> pd.DataFrame:
    """One row per audited (run, forget identity), the original model left out (it is the control): the numbers the
    rule reads, the upper bound of the equivalence test (the larger over the recognizers; NaN without the
    reference), the relearning probe's forget-ISM gap (NaN where the table has none), the verdict (module docstring),
    for an undetermined one the reason, and the equivalence test's design (``equivalence_design``, the same on every
    row) with ``recovery_min_gap``, below which an identity's recovery is listed, not averaged."""
    control = attack_control_by_identity(table)  # identities without the control never pass it
    columns = {"evaluation_fa": ("evaluation", "forget", "fa"), "photo_train": ("photo", "train", "fa"),
               "photo_val": ("photo", "val", "fa"), "attack_fa": ("attack", "best", "fa"),
               "attack_fa_second": ("attack", "best", "fa_second")}
    audited = table[table["run"] != ORIGINAL]
    if audited.empty:
        return pd.DataFrame(columns=VERDICT_COLUMNS + DESIGN_COLUMNS)
    design = equivalence_design(table, reference, equivalence_margin, power) | {"recovery_min_gap": recovery_min_gap}
    frame = pd.DataFrame({name: row_values(audited, *key) for name, key in columns.items()})
    frame["photo_fa"] = frame[["photo_train", "photo_val"]].max(axis=1)  # NaN only when neither photo set exists
    frame["recovery_gap"] = row_values(audited, *RECOVERY_GAP) if RECOVERY_GAP[2] in set(audited["metric"]) else np.nan
    # against the never-trained reference where it was audited (the reference itself: the absolute rule alone)
    superior = {metric: above_reference(table, reference, metric) for metric in ("fa", "fa_second")}
    upper = {metric: close_to_reference(table, reference, metric) for metric in ("fa", "fa_second")}
    arms = {key: min(sum(run), sum(base)) for key, (run, base) in _against_reference(table, reference, "fa").items()}
    records = []
    for (run, identity), row in frame.sort_index().iterrows():
        key = (run, int(identity))
        light = [row["evaluation_fa"], row["photo_fa"]]
        forgotten = all(not np.isnan(v) and v <= light_max_fa for v in light)
        measured = [m for m, column in (("fa", "attack_fa"), ("fa_second", "attack_fa_second"))
                    if not np.isnan(row[column])]
        fires = {m: row[f"attack_{m}"] >= recovered_min_fa or superior[m].get(key, False) for m in measured}
        bounds = [upper[m][key] for m in measured if key in upper[m]]
        bound = max(bounds) if bounds else float("nan")
        compared = key in upper["fa"]  # the reference was audited on the identity: the equivalence test decides
        passes = control.get(int(identity), False)
        reason = ""
        if not forgotten:
            verdict = NOT_FORGOTTEN
        elif fires.get("fa", False):
            verdict = HIDDEN if fires.get("fa_second", True) else HIDDEN_FIRST_ONLY
        elif "fa" not in measured:
            verdict, reason = UNDETERMINED, NO_ATTACK
        elif not passes:
            verdict, reason = UNDETERMINED, WEAK_ATTACK
        elif not compared or bound <= equivalence_margin:  # no reference here: the absolute rule
            verdict = REMOVED
        elif arms[key] < design["samples_needed"]:
            verdict, reason = UNDETERMINED, TOO_FEW.format(n=arms[key], margin=equivalence_margin,
                                                           needed=design["samples_needed"], power=power)
        else:
            verdict, reason = UNDETERMINED, NOT_CLOSE.format(margin=equivalence_margin)
        records.append({"run": run, "identity": int(identity), "evaluation_fa": row["evaluation_fa"],
                        "photo_fa": row["photo_fa"], "attack_fa": row["attack_fa"],
                        "attack_fa_second": row["attack_fa_second"], "control_passes": passes,
                        "upper_difference": bound, "recovery_gap": row["recovery_gap"], "verdict": verdict,
                        "reason": reason, **design})
    return pd.DataFrame.from_records(records, columns=VERDICT_COLUMNS + DESIGN_COLUMNS)


def run_verdict_lines(verdicts: pd.DataFrame) -> list[str]:
    """One plain sentence per run: how many identities it left drawn, hid, removed or left undetermined, the share
    hidden among those the light probes call forgotten (exact binomial interval), why any are undetermined, and its
    majority verdict (both kinds of hidden together; ties go to the more cautious verdict)."""
    lines = []
    for run, part in verdicts.groupby("run", sort=True):
        counts = part["verdict"].value_counts()
        n = len(part)
        hidden = int(counts.get(HIDDEN, 0) + counts.get(HIDDEN_FIRST_ONLY, 0))
        forgotten = n - int(counts.get(NOT_FORGOTTEN, 0))
        grouped = {v: int(counts.get(v, 0)) for v in VERDICTS if v != HIDDEN_FIRST_ONLY}
        grouped[HIDDEN] = hidden  # both kinds of hidden count together for the majority
        majority = max(grouped, key=lambda v: (grouped[v], -VERDICTS.index(v)))
        listing = "; ".join(f"{v} {int(counts[v])}" for v in VERDICTS if counts.get(v, 0))
        share = ""
        if forgotten:
            low, high = clopper_pearson(hidden, forgotten)
            share = (f"; hidden on {hidden} of the {forgotten} it forgot under the light probes "
                     f"({hidden / forgotten:.2f}, {low:.2f} to {high:.2f})")
        reasons = part.loc[part["verdict"] == UNDETERMINED, "reason"].value_counts()
        why = "".join(f"; undetermined {count}: {reason}" for reason, count in reasons.items())
        lines.append(f"- **{run}** ({n} identities): {listing}{share}{why}. Most identities: {majority}.")
    return lines


def decide_note(verdicts: pd.DataFrame, code=lambda text: f"`{text}`") -> list[str]:
    """What decides the undetermined verdicts: the attack (DECIDE_COMMAND) where none ran, a stronger attack where it
    failed its control, more attack samples where too few could not show equivalence; ``code`` formats a command
    (Markdown backticks by default). None undetermined: no lines."""
    reasons = set(verdicts.loc[verdicts["verdict"] == UNDETERMINED, "reason"])
    lines = []
    if NO_ATTACK in reasons:
        lines.append("Whether a forgotten identity is hidden or removed takes the embedding attack (minutes per "
                     f"identity): {code(DECIDE_COMMAND)} adds it to this audit.")
    if WEAK_ATTACK in reasons:
        lines.append("Where the attack failed its control, a stronger attack decides: raise audit.probes.attack's "
                     "restarts and steps.")
    if any(TOO_FEW_MARK in reason for reason in reasons):
        needed = int(verdicts["samples_needed"].max())
        lines.append(f"Where too few attack samples could not show equivalence, more decide: "
                     f"{code(f'audit.attack_samples: {needed}')} repeats the attack and draws them in a job of its "
                     "own per audited run and identity, the reference's included (the audit jobs stay).")
    return lines


def small_gap_line(verdicts: pd.DataFrame, code=lambda text: f"`{text}`") -> str:
    """The identities whose relearning recovery is not averaged (forget-ISM gap below the table's
    recovery_min_gap), per run with their gap, negative gaps (counted as full recovery) said apart; empty where no
    gap was measured."""
    if "recovery_gap" not in verdicts or verdicts["recovery_gap"].isna().all():
        return ""
    min_gap = float(verdicts["recovery_min_gap"].iloc[0])
    parts = {"small": [], "negative": []}
    for run, part in verdicts.groupby("run", sort=True):
        for kind, mask in (("small", part["recovery_gap"].between(0, min_gap, inclusive="left")),
                           ("negative", part["recovery_gap"] < 0)):
            if mask.any():
                parts[kind].append(f"{code(run)} " + ", ".join(
                    f"{int(r.identity)} ({r.recovery_gap:+.2f})" for r in part[mask].itertuples()))
    return (f"Relearning recovery is a ratio only where unlearning opened a forget-ISM gap of at least {min_gap:g}. "
            + (f"Below it, listed and not averaged: {'; '.join(parts['small'])}. " if parts["small"] else
               "Every identity's gap reaches it. ")
            + (f"A negative gap counts as full recovery (a failure): {'; '.join(parts['negative'])}."
               if parts["negative"] else "")).strip()


def design_sentence(verdicts: pd.DataFrame) -> str:
    """The equivalence test's design in words (margin, the reference's pooled rate, samples drawn and needed, the
    power of those drawn); empty where the reference was not audited with the attack."""
    design = verdicts[DESIGN_COLUMNS].iloc[0] if len(verdicts) else None
    if design is None or pd.isna(design["samples_needed"]):
        return ""
    return (f"The equivalence margin is {design['margin']:g}; {design['reference']}'s pooled attack success is "
            f"{design['reference_rate']:.3f}, and with run and reference both at that rate the test shows "
            f"equivalence with {design['target_power']:.0%} power from {int(design['samples_needed'])} samples per arm; with the "
            f"{int(design['samples'])} drawn its power is {design['power']:.2f}.")


COMPARED = [("attack", "best", "fa"), ("attack", "best", "fa_second"), ("attack", "best", "ism"),
            ("evaluation", "forget", "fa"), ("evaluation", "retain", "verified"), LOCALITY_MEAN]
HELDOUT_COMPARED = [("attack_heldout", "best", "fa"), ("attack_heldout", "best", "fa_second"),
                    ("inversion", "regenerated", "fa")]


def compared_rows(table: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The row kinds compared between runs: the attack's success and ISM, the evaluation's FA and retain verification,
    the retain ISM change (the difference of two runs' changes is the difference of their retain ISM, same samples),
    the largest measured k of Leak@k and of relearning recovery; the held-out attacks' success (embedding attack,
    inversion) and every held-out relearning variant's recovery at every k above 0."""
    def ks(probe: str) -> list[int]:
        return sorted({int(s[2:]) for s in table.loc[table["probe"] == probe, "setting"] if s.startswith("k=")})

    def largest(probe: str) -> list[str]:
        return [f"k={k}" for k in ks(probe)[-1:]]

    variants = sorted(p for p in table["probe"].unique() if p.startswith(f"{HELDOUT_RELEARNING}:"))
    return ([*[("leak", s, "leak") for s in largest("leak")], *[("relearning", s, "recovery")
             for s in largest("relearning")], *COMPARED, *HELDOUT_COMPARED,
             *[(variant, f"k={k}", "recovery") for variant in variants for k in ks(variant) if k > 0]])


def paired_comparisons(table: pd.DataFrame, reference: str | None, seed: int) -> pd.DataFrame:
    """Every audited run other than ``reference`` and the original against ``reference``: per row kind the paired
    per-identity differences run - reference, their mean with bootstrap and Student-t 95% intervals and the
    two-sided Wilcoxon p-value (``evaluation.statistics.mean_difference``). No reference: no rows."""
    if reference is None:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    runs = sorted(set(table["run"]) - {reference, ORIGINAL})
    records = []
    for probe, setting, metric in compared_rows(table):
        values = row_values(table, probe, setting, metric)
        if reference not in values.index.get_level_values("run"):
            continue
        base = values.loc[reference]
        for run in runs:
            if run not in values.index.get_level_values("run"):
                continue
            differences = paired_differences(base, values.loc[run])
            if len(differences):
                records.append({"run": run, "reference": reference, "probe": probe, "setting": setting,
                                "metric": metric, **mean_difference(differences, seed)})
    return pd.DataFrame.from_records(records, columns=COMPARISON_COLUMNS)


def verdict_markdown(verdicts: pd.DataFrame, comparisons: pd.DataFrame, rule: dict) -> str:
    """The audit page's verdict section and, when a reference run is set, its paired differences table."""
    reference = rule.get("reference")
    lines = ["", "## Hidden or removed?", "",
             f"Per forget identity: forgotten when the evaluation's and the photo probe's FA are at most "
             f"{rule['light_max_fa']:g}; hidden when the attack's samples are then verified as the person at least "
             f"{rule['recovered_min_fa']:g} of the time (by both recognizers when the second ran)"
             + (f", or significantly more often than from the never-trained reference {reference} on the same "
                "identity (one-sided Fisher exact test, p < 0.05); removed only where an equivalence test shows the "
                f"attack's success within {rule.get('equivalence_margin', 0.1):g} of {reference}'s (the one-sided 95% "
                f"upper bound of the difference, Newcombe's hybrid score interval) and the attack passes its control; "
                "undetermined otherwise, with the reason. " + design_sentence(verdicts)
                if reference in set(verdicts["run"]) else
                "; removed when not, and the attack passes its control on that identity; undetermined when it does "
                "not."), "",
             *run_verdict_lines(verdicts)]
    note = decide_note(verdicts)
    lines += ["", " ".join(note)] if note else []
    gaps = small_gap_line(verdicts)
    lines += ["", gaps] if gaps else []
    if len(comparisons):
        reference = comparisons["reference"].iloc[0]
        lines += ["", f"## Paired differences against {reference}", "",
                  f"Run minus {reference} on the same forget identities: mean (95% identity-bootstrap interval; "
                  "Student-t interval), two-sided Wilcoxon p.", "",
                  "| run | probe | setting | metric | n | mean difference | t interval | p |", "|---" * 8 + "|"]
        for row in comparisons.itertuples():
            lines.append(f"| {row.run} | {row.probe} | {row.setting} | {row.metric} | {row.n} | {row.mean_diff:+.3f} "
                         f"({row.boot_low:+.3f} to {row.boot_high:+.3f}) | {row.t_low:+.3f} to {row.t_high:+.3f} | "
                         f"{row.p_wilcoxon:.3g} |")
    return "\n".join(lines) + "\n"


REFERENCE_COLUMNS = [*COMPARISON_COLUMNS, "p_holm", "finding"]


def reference_comparisons(table: pd.DataFrame, reference: str | None, seed: int) -> pd.DataFrame:
    """Every audited run against the never-trained reference (``paired_comparisons``), with Holm-corrected Wilcoxon
    p-values within each run's family of comparisons and a finding per row from the Student-t interval: "above"
    or "below" the reference when the interval excludes 0, "as the reference" when it covers 0 (none with one
    identity). Where a run leaks
    above the never-trained reference, the person was hidden, not removed; where the reference itself is recovered,
    the attack measures the generator's generalisation, not memory."""
    compared = paired_comparisons(table, reference, seed)
    if compared.empty:
        return pd.DataFrame(columns=REFERENCE_COLUMNS)
    compared["p_holm"] = compared.groupby("run")["p_wilcoxon"].transform(holm)  # Holm over the run's measures
    compared["finding"] = np.select(
        [compared["t_low"].isna(), compared["t_low"] > 0, compared["t_high"] < 0],
        ["no interval (fewer than 2 identities)", "above", "below"], "as the reference")
    return compared[REFERENCE_COLUMNS]


def reference_markdown(comparisons: pd.DataFrame) -> str:
    """The audit page's section on the never-trained reference (empty without one)."""
    if comparisons.empty:
        return ""
    reference = comparisons["reference"].iloc[0]
    lines = ["", f"## Against the never-trained reference ({reference})", "",
             f"{reference} is the generator trained without the forget identities: what \"removed\" looks like on this "
             f"world. Run minus {reference} on the same identities: mean (Student-t 95% interval), Holm-corrected "
             "Wilcoxon p within each run; above or below when the interval excludes 0. Attack success, Leak@k and "
             "recovery above the reference mean the person is hidden, not removed; retain ISM change below it is "
             "collateral a never-trained model does not pay.", "",
             "| run | probe | setting | metric | n | mean difference | t interval | p (Holm) | finding |",
             "|---" * 9 + "|"]
    for row in comparisons.itertuples():
        lines.append(f"| {row.run} | {row.probe} | {row.setting} | {row.metric} | {row.n} | {row.mean_diff:+.3f} | "
                     f"{row.t_low:+.3f} to {row.t_high:+.3f} | {row.p_holm:.3g} | {row.finding} |")
    return "\n".join(lines) + "\n"
