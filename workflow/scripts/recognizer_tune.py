from idunlearn.io import write_parquet
from idunlearn.recognizer import stages
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "recognizer_tune_method"):
    stages.set_threads(snakemake.threads)
    i = snakemake.input
    rows = stages.tune(i.data, i.model, i.shadows, i.requests, snakemake.wildcards.method, snakemake.params.recognizer,
                       snakemake.params.seed)
    write_parquet(rows, snakemake.output[0])
