from idunlearn.data import acquire_dataset
from idunlearn.io import write_parquet
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "acquire_dataset") as log:
    p = snakemake.params
    manifest = acquire_dataset(p.dataset, p.cache_dir, p.image_dir)
    log.info("%d images from %s", len(manifest), p.dataset["source"])
    write_parquet(manifest, snakemake.output.manifest)
