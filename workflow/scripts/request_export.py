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
    selections = [read_json(path) for path in i.selection]
    people = {"forget_identity": selections[0]["forget_identity"],
              "in_training_data": selections[0]["in_training_data"]} if len(selections) == 1 else {
        "people": {person: {"forget_identity": s["forget_identity"], "in_training_data": s["in_training_data"]}
                   for person, s in zip(p.people, selections, strict=True)}}
    write_json({"request": p.name, "run": p.run_name, **people, **hashes}, out.manifest)
