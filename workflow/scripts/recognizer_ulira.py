from idunlearn.io import write_parquet
from idunlearn.recognizer import stages
from idunlearn.recognizer.data import ImageData
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], snakemake.rule):
    stages.set_threads(snakemake.threads)
    i, p = snakemake.input, snakemake.params
    if snakemake.rule == "recognizer_ulira_shadows":
        out = snakemake.output
        stages.ulira_shadows(ImageData.load(i.data), p.settings, p.n_shadows, p.seed, out.membership, list(out.models))
    else:
        rows = stages.ulira_experiment(i.data, i.model, i.membership, list(i.shadows), snakemake.wildcards.dataset,
                                       snakemake.wildcards.experiment, p.recognizer, p.seed)
        write_parquet(rows, snakemake.output[0])
