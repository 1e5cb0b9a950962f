import os

import pandas as pd

from idunlearn.io import write_json, write_parquet
from idunlearn.many import forget_order
from idunlearn.runlog import stage_log
from idunlearn.selection import select_experiments, selections_table

with stage_log(snakemake.log[0], "many_select") as log:
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    labels, centroids = pd.read_parquet(i.labels), pd.read_parquet(i.centroids)
    order = forget_order(centroids, p.selection, p.seed)
    # the selection stage with every eligible identity: its per-identity files are select_experiments' own
    selections = select_experiments(labels, centroids, {**p.selection, "n_forget": len(order)}, p.seed)
    os.makedirs(out.identities, exist_ok=True)
    for selection in selections:
        write_json(selection.to_dict(), os.path.join(out.identities, f"{selection.forget_identity}.json"))
    table = selections_table(selections)
    log.info("%d eligible forget identities in order: %s", len(table), table["forget_identity"].tolist())
    write_parquet(table, out.order)
