import pandas as pd

from idunlearn.evaluation.aggregate import paired_runs
from idunlearn.io import write_csv
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "audit_evaluation_comparisons") as log:
    i, p = snakemake.input, snakemake.params
    table = paired_runs(pd.read_parquet(i.metrics), pd.read_parquet(i.counts), pd.read_csv(i.costs),
                        {"compare": p.compare_to, "reference": p.reference}, p.seed)
    log.info("\n%s", table.to_string(index=False))
    write_csv(table, snakemake.output[0])
