from idunlearn.pictures import before_after_grids
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "sample_grids"):
    i, out = snakemake.input, snakemake.output
    before_after_grids(i.before, i.before_samples, i.after, i.after_samples, snakemake.wildcards.run,
                       out.forget, out.retain, snakemake.params.per_row)
