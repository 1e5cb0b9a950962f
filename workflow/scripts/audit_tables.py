import os

import pandas as pd

from idunlearn.audit.tables import (ORIGINAL, audit_markdown, audit_summary, audit_table, plot_locality,
                                    plot_neighbourhood)
from idunlearn.audit.verdicts import identity_verdicts, paired_comparisons, verdict_markdown
from idunlearn.io import atomic_path, read_json, write_csv, write_parquet
from idunlearn.runlog import stage_log


def job(path: str, original: bool) -> tuple[str, int, pd.DataFrame]:
    """(run, identity, rows) from .../audit/before/<identity>/rows.parquet or .../after/<run>/<identity>/rows.parquet"""
    folder, identity = os.path.split(os.path.dirname(path))
    return ORIGINAL if original else os.path.basename(folder), int(identity), pd.read_parquet(path)


with stage_log(snakemake.log[0], "audit_tables"):
    i, out, params = snakemake.input, snakemake.output, snakemake.params
    table = audit_table([job(p, True) for p in i.before] + [job(p, False) for p in i.after])
    summary = audit_summary(table, params.seed)
    verdicts = identity_verdicts(table, **params.verdict)
    comparisons = paired_comparisons(table, params.reference, params.seed)
    write_parquet(table, out.table)
    write_csv(table, out.csv)
    write_csv(summary, out.summary)
    write_csv(verdicts, out.verdicts)
    write_csv(comparisons, out.comparisons)
    with atomic_path(out.summary_md) as tmp:
        tmp.write_text(audit_markdown(summary, read_json(i.verification), table)
                       + verdict_markdown(verdicts, comparisons, params.verdict))
    plot_neighbourhood(table, out.neighbourhood, params.seed)
    plot_locality(table, out.locality)
