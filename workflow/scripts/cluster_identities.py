import pandas as pd

from idunlearn.identities import run_identity_stage
from idunlearn.io import write_csv, write_parquet
from idunlearn.pictures import plot_nn_histogram
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "cluster_identities") as log:
    out, cfg = snakemake.output, snakemake.params.identities
    stage = run_identity_stage(pd.read_parquet(snakemake.input.embeddings), pd.read_parquet(snakemake.input.manifest), cfg)
    log.info("\n%s", stage.summary.to_string(index=False))
    write_parquet(stage.labels, out.labels)
    write_parquet(stage.centroids, out.centroids)
    write_parquet(stage.summary, out.summary)
    write_csv(stage.summary, out.summary_csv)
    write_parquet(stage.histogram_table, out.histogram)
    plot_nn_histogram(stage.histogram, out.histogram_png, eps=cfg["eps"])
