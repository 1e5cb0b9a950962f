import pandas as pd
import torch

from idunlearn.experiment import load_generator
from idunlearn.faces import build_face_analyser
from idunlearn.io import read_json, write_json, write_parquet
from idunlearn.request.assess import assess
from idunlearn.request.selection import request_worlds
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "request_assess") as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    selection = read_json(i.own)  # this person's; the world holds every person of the request
    world = request_worlds([read_json(path) for path in i.selection], [pd.read_parquet(path) for path in i.photos],
                           *map(pd.read_parquet, (i.manifest, i.faces, i.labels, i.centroids)))
    # the original model, or the request's unlearned one (input changed)
    generator = load_generator(p.generator, p.device, changed=i.changed if "changed" in i.keys() else None)
    before = pd.read_parquet(i.before) if "before" in i.keys() else None
    samples, metrics, rows = assess(generator, build_face_analyser(p.faces, i.models), selection, world,
                                    read_json(i.verification)["tau"], p.evaluation, p.probes, p.seed, before)
    log.info("metrics: %s", metrics)
    write_parquet(samples.drop(columns=["landmarks"]), out.samples)
    write_json(metrics, out.metrics)
    write_parquet(rows, out.rows)
