import os

import torch
from safetensors.torch import load_file

from idunlearn.experiment import load_generator
from idunlearn.io import read_json, write_json
from idunlearn.models.export import export_unet
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "request_export") as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    unet = load_generator(p.generator).unet
    hashes = export_unet(unet, load_file(i.changed), os.path.dirname(out.unet[0]), out.delta)
    log.info("exported request %s: %s", p.name, hashes)
    selection = read_json(i.selection)
    write_json({"request": p.name, "run": p.run_name, "forget_identity": selection["forget_identity"],
                "in_training_data": selection["in_training_data"], **hashes}, out.manifest)
