import os

import pandas as pd
import torch

from idunlearn.experiment import load_generator, run_selection, unlearn_selection
from idunlearn.io import write_json, write_parquet
from idunlearn.many import job_selections
from idunlearn.runlog import stage_log
from idunlearn.unlearning.runner import save_changed_parameters

with stage_log(snakemake.log[0], f"many_unlearn_{snakemake.params.mode}") as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    labels, centroids = pd.read_parquet(i.labels), pd.read_parquet(i.centroids)
    selections = [run_selection(s, p.run, centroids)
                  for s in job_selections(labels, centroids, p.identities, p.mode, p.selection, p.seed)]
    # joint: all of them in one run; a chain step: its own identity, from the previous step's weights
    training = selections if p.mode == "joint" else selections[-1:]
    previous = i.previous[0] if "previous" in i.keys() and i.previous else None
    log.info("%s: unlearning %s from %s", p.mode, [s["forget_identity"] for s in training], previous or "the original")
    generator = load_generator(p.generator, p.device, changed=previous)
    seed = p.seed + training[0]["forget_identity"]  # the ordinary unlearn job's seed for one identity
    losses, timings = unlearn_selection(generator, p.run, training, pd.read_parquet(i.faces), labels, centroids,
                                        pd.read_parquet(i.manifest), p.faces, i.models, p.state, seed)
    log.info("timings: %s", timings)
    save_changed_parameters(generator, p.run["regime"], p.run["surgical_blocks"], out.changed)
    write_parquet(losses, out.losses)
    write_json(selections, out.selections)
    write_json({**timings, "run_name": snakemake.wildcards.run, "run": p.run, "seed": seed, "mode": p.mode,
                "identities": list(p.identities), "previous": previous}, out.timings)
    if os.path.exists(p.state):
        os.remove(p.state)  # finished: the resume point is no longer needed
