from idunlearn.io import write_parquet
from idunlearn.recognizer import stages
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "recognizer_experiment"):
    stages.set_threads(snakemake.threads)
    i, w = snakemake.input, snakemake.wildcards
    rows = stages.experiment(i.data, i.model, i.shadows, w.task, w.dataset, w.experiment, snakemake.params.recognizer,
                             snakemake.params.seed, i.selection or None, i.get("tuned"), i.get("paper"))
    write_parquet(rows, snakemake.output[0])
