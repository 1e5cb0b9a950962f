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
- an identity counts as removed only where the attack passes its control on it (on the original model at least
  ``ATTACK_BOUND`` x the original's forget ISM); forgotten, not recovered but below the control bound is "undetermined":
  the attack was too weak there to say. A recovered identity is hidden whether or not the control passed.
- with the never-trained reference (``reference``, run ``retrain``: the generator trained without the person) audited
  on the identity, "recovered" is relative instead of absolute: the attack's samples are verified significantly more
  often from the run than from the reference (one-sided Fisher exact test on the counts, p < 0.05), i.e. the attack
  draws the person from the run more often than from a model that never saw them. Per run, ``reference_comparisons``
  gives the paired differences with the reference (attack success, Leak@k, relearning recovery, retain ISM and the
  held-out attacks) with Holm-corrected p-values.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from ..evaluation.statistics import holm, mean_difference, paired_differences
from .heldout import HELDOUT_RELEARNING
from .tables import ORIGINAL, attack_control_by_identity
from .verification import clopper_pearson

NOT_FORGOTTEN, HIDDEN, HIDDEN_FIRST_ONLY, REMOVED, UNDETERMINED = (
    "not forgotten", "hidden", "hidden, first recognizer only", "removed", "undetermined")
VERDICTS = (NOT_FORGOTTEN, HIDDEN, HIDDEN_FIRST_ONLY, UNDETERMINED, REMOVED)  # most to least cautious: breaks ties
VERDICT_COLUMNS = ["run", "identity", "evaluation_fa", "photo_fa", "attack_fa", "attack_fa_second", "control_passes",
                   "verdict", "reason"]
# why an identity is undetermined (the ``reason`` column; empty for every other verdict)
NO_ATTACK = "no attack ran (the attack probe is off in audit.probes, as in the default run's light audit)"
WEAK_ATTACK = "the attack failed its control on the identity (too weak there to tell hidden from removed)"
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


def above_reference(table: pd.DataFrame, reference: str | None, metric: str,
                    alpha: float = 0.05) -> dict[tuple[str, int], bool]:
    """(run, identity) -> whether the attack's samples are verified (``metric``: fa or fa_second) more often from
    the run than from the reference run on the same identity: one-sided Fisher exact test on the verified counts
    (Fisher 1922), p < ``alpha``; only identities the reference was audited on (with that metric)."""
    if reference is None:
        return {}
    share, n = (row_values(table, "attack", "best", metric, column) for column in ("value", "n"))
    if reference not in share.index.get_level_values("run"):
        return {}
    hits = (share * n).round()
    base_hits, base_n = hits.loc[reference], n.loc[reference]
    above = {}
    for (run, identity), count in hits.items():
        if identity not in base_hits.index or np.isnan(count) or np.isnan(base_hits.loc[identity]):
            continue
        table_2x2 = [[int(count), int(n.loc[(run, identity)] - count)],
                     [int(base_hits.loc[identity]), int(base_n.loc[identity] - base_hits.loc[identity])]]
        above[(run, int(identity))] = bool(stats.fisher_exact(table_2x2, alternative="greater")[1] < alpha)
    return above


def identity_verdicts(table: pd.DataFrame, light_max_fa: float, recovered_min_fa: float,
                      reference: str | None = None) -> pd.DataFrame:
    """One row per audited (run, forget identity), the original model left out (it is the control): the numbers the
    rule reads, the verdict (module docstring) and, for an undetermined one, the reason (NO_ATTACK or WEAK_ATTACK)."""
    control = attack_control_by_identity(table)  # identities without the control never pass it
    columns = {"evaluation_fa": ("evaluation", "forget", "fa"), "photo_train": ("photo", "train", "fa"),
               "photo_val": ("photo", "val", "fa"), "attack_fa": ("attack", "best", "fa"),
               "attack_fa_second": ("attack", "best", "fa_second")}
    audited = table[table["run"] != ORIGINAL]
    if audited.empty:
        return pd.DataFrame(columns=VERDICT_COLUMNS)
    frame = pd.DataFrame({name: row_values(audited, *key) for name, key in columns.items()})
    frame["photo_fa"] = frame[["photo_train", "photo_val"]].max(axis=1)  # NaN only when neither photo set exists
    # against the never-trained reference where it was audited (the reference itself: the absolute rule)
    relative_first, relative_second = (
        {key: above for key, above in above_reference(table, reference, metric).items() if key[0] != reference}
        for metric in ("fa", "fa_second"))
    records = []
    for (run, identity), row in frame.sort_index().iterrows():
        light = [row["evaluation_fa"], row["photo_fa"]]
        forgotten = all(not np.isnan(v) and v <= light_max_fa for v in light)
        first = relative_first.get((run, int(identity)), row["attack_fa"] >= recovered_min_fa)
        second = np.isnan(row["attack_fa_second"]) or relative_second.get(
            (run, int(identity)), row["attack_fa_second"] >= recovered_min_fa)
        passes = control.get(int(identity), False)
        if not forgotten:
            verdict = NOT_FORGOTTEN
        elif first:
            verdict = HIDDEN if second else HIDDEN_FIRST_ONLY
        else:  # includes "no attack ran" (NaN): then removal cannot be claimed
            verdict = REMOVED if passes and not np.isnan(row["attack_fa"]) else UNDETERMINED
        reason = "" if verdict != UNDETERMINED else NO_ATTACK if np.isnan(row["attack_fa"]) else WEAK_ATTACK
        records.append({"run": run, "identity": int(identity), "evaluation_fa": row["evaluation_fa"],
                        "photo_fa": row["photo_fa"], "attack_fa": row["attack_fa"],
                        "attack_fa_second": row["attack_fa_second"], "control_passes": passes, "verdict": verdict,
                        "reason": reason})
    return pd.DataFrame.from_records(records, columns=VERDICT_COLUMNS)


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
    failed its control; ``code`` formats a command (Markdown backticks by default). None undetermined: no lines."""
    reasons = set(verdicts.loc[verdicts["verdict"] == UNDETERMINED, "reason"])
    lines = []
    if NO_ATTACK in reasons:
        lines.append("Whether a forgotten identity is hidden or removed takes the embedding attack (minutes per "
                     f"identity): {code(DECIDE_COMMAND)} adds it to this audit.")
    if WEAK_ATTACK in reasons:
        lines.append("Where the attack failed its control, a stronger attack decides: raise audit.probes.attack's "
                     "restarts and steps.")
    return lines


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
    lines = ["", "## Hidden or removed?", "",
             f"Per forget identity: forgotten when the evaluation's and the photo probe's FA are at most "
             f"{rule['light_max_fa']:g}; hidden when the attack's samples are then verified as the person at least "
             f"{rule['recovered_min_fa']:g} of the time (by both recognizers when the second ran); removed when not, "
             f"and the attack passes its control on that identity; undetermined when it does not."
             + (f" Where the never-trained reference {rule['reference']} was audited on the identity, the attack "
                f"recovers the person when its samples are verified more often than {rule['reference']}'s (one-sided "
                "Fisher exact test, p < 0.05) instead."
                if rule.get("reference") in set(verdicts["run"]) else ""), "",
             *run_verdict_lines(verdicts)]
    note = decide_note(verdicts)
    lines += ["", " ".join(note)] if note else []
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
