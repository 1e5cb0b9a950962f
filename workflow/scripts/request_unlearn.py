import os

import pandas as pd
import torch

from idunlearn.experiment import differentiable_recognizer, load_generator
from idunlearn.io import read_json, write_json, write_parquet
from idunlearn.request.assess import unlearn_request
from idunlearn.request.selection import request_worlds
from idunlearn.runlog import stage_log
from idunlearn.unlearning.runner import save_changed_parameters

with stage_log(snakemake.log[0], "request_unlearn") as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    selections, run = [read_json(path) for path in i.selection], p.run
    world = request_worlds(selections, [pd.read_parquet(path) for path in i.photos],
                           *map(pd.read_parquet, (i.manifest, i.faces, i.labels, i.centroids)))
    generator = load_generator(p.generator, p.device)
    seed = p.seed + selections[0]["forget_identity"]
    # one person: that person's experiment; several: all of them jointly, in one run
    losses, timings = unlearn_request(generator, selections[0] if len(selections) == 1 else selections, world, run,
                                      p.state, seed,
                                      lambda: differentiable_recognizer(p.faces, i.models).to(p.device))
    log.info("timings: %s", timings)
    save_changed_parameters(generator, run["regime"], run["surgical_blocks"], out.changed)
    write_parquet(losses, out.losses)
    write_json({**timings, "run_name": p.run_name, "run": run, "seed": seed}, out.timings)
    if os.path.exists(p.state):
        os.remove(p.state)  # finished: the resume point is no longer needed
