import pandas as pd

from idunlearn.audit.heldout import mark_trained_against, trained_against
from idunlearn.audit.relearning import with_recovery
from idunlearn.audit.relearning_worstcase import worstcase_cells, worstcase_markdown, worstcase_summary
from idunlearn.audit.targets import audit_targets
from idunlearn.audit.tables import (ORIGINAL, audit_markdown, audit_summary, audit_table, job_rows, plot_locality,
                                    plot_neighbourhood, plot_relearning_curves, with_attack_samples)
from idunlearn.audit.verdicts import (identity_verdicts, paired_comparisons, reference_comparisons,
                                      reference_markdown, verdict_markdown)
from idunlearn.io import atomic_path, read_json, write_csv, write_parquet
from idunlearn.runlog import stage_log


with stage_log(snakemake.log[0], "audit_tables"):
    i, out, params = snakemake.input, snakemake.output, snakemake.params
    marks = trained_against(params.training, params.probes)
    # recovery, ISM regained and gap derived from the jobs' ISM rows (audit.verdict.recovery_min_gap)
    jobs = [job_rows(p, True) for p in i.before] + [job_rows(p) for p in [*i.after, *i.worstcase]]
    table = with_attack_samples(audit_table(jobs), [job_rows(p) for p in i.attack_samples])
    table = mark_trained_against(with_recovery(table, params.verdict["recovery_min_gap"]), marks)
    summary = audit_summary(table, params.seed)
    verdicts = identity_verdicts(table, **params.verdict)
    comparisons = paired_comparisons(table, params.reference, params.seed)
    # each further pair alone: the table of its two runs (and the original), the second the reference
    pairs = pd.concat([paired_comparisons(table[table["run"].isin([run, against, ORIGINAL])], against, params.seed)
                       for run, against in params.pairs], ignore_index=True) if params.pairs else comparisons.iloc[:0]
    against_reference = reference_comparisons(table, params.verdict["reference"], params.seed)
    write_parquet(table, out.table)
    write_csv(table, out.csv)
    write_csv(summary, out.summary)
    write_csv(verdicts, out.verdicts)
    write_csv(comparisons, out.comparisons)
    write_csv(pairs, out.pairs)
    write_csv(against_reference, out.against_reference)
    targets = audit_targets(table, params.targets, params.reference, params.verdict["reference"], params.seed, verdicts)
    write_csv(targets, out.targets)
    write_csv(marks, out.trained_against)
    cells = worstcase_cells(table, params.verdict["reference"])
    worstcase = worstcase_summary(cells, params.verdict["reference"], params.seed)
    write_csv(cells, out.worstcase)
    write_csv(worstcase, out.worstcase_summary)
    with atomic_path(out.summary_md) as tmp:
        tmp.write_text(audit_markdown(summary, read_json(i.verification), table)
                       + verdict_markdown(verdicts, comparisons, params.verdict)
                       + reference_markdown(against_reference) + worstcase_markdown(worstcase))
    plot_neighbourhood(table, out.neighbourhood, params.seed)
    plot_locality(table, out.locality)
    plot_relearning_curves(table, out.relearning_curves, params.seed)
