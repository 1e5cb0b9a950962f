from idunlearn.recognizer import stages
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "recognizer_tuning_tables") as log:
    tables = stages.tuning_tables(list(snakemake.input.grids), list(snakemake.input.requests),
                                  snakemake.params.recognizer, snakemake.output)
    log.info("\n%s", tables["choice"].drop(columns=["settings"]).to_string(index=False))
