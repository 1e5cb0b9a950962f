import pandas as pd
import torch

from idunlearn.experiment import load_generator
from idunlearn.io import write_csv, write_parquet
from idunlearn.layer_analysis import analysis_samples, layer_separation, plot_layer_separation
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "layer_analysis") as log:
    torch.set_num_threads(snakemake.threads)
    cfg, out = snakemake.params.analysis, snakemake.output
    embeddings, identities = analysis_samples(
        pd.read_parquet(snakemake.input.embeddings), pd.read_parquet(snakemake.input.labels),
        cfg["n_identities"], cfg["images_per_identity"], cfg["seed"])
    generator = load_generator(snakemake.params.generator, snakemake.params.device)
    table = layer_separation(generator, embeddings, identities, tuple(cfg["timesteps"]), cfg["seed"])
    log.info("\n%s", table.to_string(index=False))
    write_parquet(table, out.table)
    write_csv(table, out.csv)
    plot_layer_separation(table, out.figure)
