import os

import pandas as pd

from idunlearn.io import write_csv, write_json, write_parquet
from idunlearn.runlog import stage_log
from idunlearn.selection import select_experiments, selections_table

with stage_log(snakemake.log[0], "select_experiments") as log:
    out = snakemake.output
    selections = select_experiments(pd.read_parquet(snakemake.input.labels), pd.read_parquet(snakemake.input.centroids),
                                    snakemake.params.selection, snakemake.params.seed)
    table = selections_table(selections)
    log.info("\n%s", table.to_string(index=False))
    for selection in selections:
        write_json(selection.to_dict(), os.path.join(out.identities, f"{selection.forget_identity}.json"))
    write_csv(table, out.csv)
    write_parquet(table, out.table)
