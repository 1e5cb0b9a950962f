from idunlearn.recognizer import stages
from idunlearn.recognizer.data import ImageData
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "recognizer_original"):
    stages.set_threads(snakemake.threads)
    p, out = snakemake.params, snakemake.output
    stages.train_original(ImageData.load(snakemake.input.data), p.settings, p.seed, out.model, out.info)
