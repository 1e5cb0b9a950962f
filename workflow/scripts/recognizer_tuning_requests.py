from idunlearn.io import write_parquet
from idunlearn.recognizer import stages
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "recognizer_tuning_requests"):
    stages.set_threads(snakemake.threads)
    i, w = snakemake.input, snakemake.wildcards
    rows = stages.tuning_requests(i.data, i.model, i.shadows, w.task, w.dataset, snakemake.params.recognizer,
                                  snakemake.params.seed, i.selection or None)
    write_parquet(rows, snakemake.output[0])
