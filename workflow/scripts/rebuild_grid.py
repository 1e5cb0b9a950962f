from idunlearn.pictures import compared_grid
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], snakemake.rule):
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    rows = [("original", i.original, i.original_samples), (snakemake.wildcards.external, i.rebuilt[0],
            i.rebuilt_samples[0]), (p.reference, i.reference[0], i.reference_samples[0])]
    compared_grid(rows, "forget", out.forget, p.per_row)
    compared_grid(rows, "retain", out.retain, p.per_row)
