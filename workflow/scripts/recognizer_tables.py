from idunlearn.recognizer import stages
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "recognizer_tables") as log:
    tables = stages.tables(list(snakemake.input.metrics), list(snakemake.input.originals), snakemake.output,
                           list(snakemake.input.ulira))
    log.info("\n%s\n\n%s", tables["random_subset"].to_string(index=False), tables["classwise"].to_string(index=False))
