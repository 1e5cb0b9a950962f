from idunlearn.recognizer import stages
from idunlearn.recognizer.data import ImageData
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "recognizer_shadows"):
    stages.set_threads(snakemake.threads)
    p = snakemake.params
    stages.shadows(ImageData.load(snakemake.input.data), p.settings, p.mia, p.seed, snakemake.output[0])
