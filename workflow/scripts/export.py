import os

import torch
from safetensors.torch import load_file

from idunlearn.experiment import load_generator
from idunlearn.io import write_json
from idunlearn.models.export import export_unet
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "export") as log:
    torch.set_num_threads(snakemake.threads)
    i, out, wc = snakemake.input, snakemake.output, snakemake.wildcards
    unet = load_generator(snakemake.params.generator).unet
    hashes = export_unet(unet, load_file(i.changed), os.path.dirname(out.unet[0]), out.delta)
    log.info("exported %s/%s: %s", wc.run, wc.identity, hashes)
    write_json({"run": wc.run, "forget_identity": int(wc.identity), **hashes}, out.manifest)
