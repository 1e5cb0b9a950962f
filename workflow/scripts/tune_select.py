import os

import pandas as pd

from idunlearn.io import write_csv, write_json, write_parquet
from idunlearn.runlog import stage_log
from idunlearn.selection import selections_table
from idunlearn.tuning import tuning_selections

with stage_log(snakemake.log[0], "tune_select") as log:
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    study = pd.read_parquet(i.study)["forget_identity"].tolist()
    selections = tuning_selections(pd.read_parquet(i.labels), pd.read_parquet(i.centroids), study, p.selection,
                                   p.tuning, p.seed)
    table = selections_table(selections).assign(
        retain_val_identities=[" ".join(map(str, s.retain_val_identities)) for s in selections])
    log.info("study forget identities %s; tuning:\n%s", study, table.to_string(index=False))
    for selection in selections:
        write_json(selection.to_dict(), os.path.join(out.identities, f"{selection.forget_identity}.json"))
    write_csv(table, out.csv)
    write_parquet(table, out.table)
