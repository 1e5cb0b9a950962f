from idunlearn.faces import install_face_models
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "face_models"):
    install_face_models(snakemake.params.faces, snakemake.params.cache_dir, snakemake.output[0])
