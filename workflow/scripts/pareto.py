import os

import pandas as pd

from idunlearn.controllable import pareto_figure, pareto_summary, pareto_table
from idunlearn.io import save_figure, write_csv, write_parquet
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "pareto") as log:
    i, out = snakemake.input, snakemake.output
    losses = {}
    for path in i.losses:  # results/unlearning/<run>/<identity>/losses.parquet
        run_dir, identity = os.path.split(os.path.dirname(path))
        losses[(os.path.basename(run_dir), int(identity))] = pd.read_parquet(path)
    table = pareto_table(snakemake.params.points, pd.read_parquet(i.metrics), losses, snakemake.params.tolerances)
    summary = pareto_summary(table, pd.read_parquet(i.counts), snakemake.params.seed)
    degenerate = table.loc[table["degenerate"], ["base_run", "forget_identity"]].drop_duplicates()
    if len(degenerate):  # a finding about the model (its objectives barely conflict), reported, not an error
        log.warning("degenerate front (f1(lowest) <= f1(highest) + tolerance) for %s",
                    degenerate.to_dict("records"))
    log.info("\n%s", summary.to_string())
    write_csv(table, out.table)
    write_parquet(table, out.parquet)
    write_csv(summary, out.summary)
    save_figure(pareto_figure(table, summary), out.figure, dpi=120)
