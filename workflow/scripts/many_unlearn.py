import copy
import os

import pandas as pd
import torch

from idunlearn.experiment import load_generator, run_selection, unlearn_selection
from idunlearn.io import write_json, write_parquet
from idunlearn.many import job_selections, replay_selections
from idunlearn.runlog import stage_log
from idunlearn.unlearning.runner import apply_changed_parameters, save_changed_parameters

with stage_log(snakemake.log[0], f"many_unlearn_{snakemake.params.mode}") as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    labels, centroids = pd.read_parquet(i.labels), pd.read_parquet(i.centroids)
    replay = p.weights is not None  # a chain step that replays the earlier identities
    if replay:
        drawn = replay_selections(labels, centroids, p.identities, p.selection, p.seed)
    else:
        drawn = job_selections(labels, centroids, p.identities, p.mode, p.selection, p.seed)
    selections = [run_selection(s, p.run, centroids) for s in drawn]
    # joint or replay: all of them in one run; a plain chain step: its own identity, from the previous step's weights
    training = selections if p.mode == "joint" or replay else selections[-1:]
    previous = i.previous if "previous" in i.keys() else None  # a chain step's previous weights
    log.info("%s (%s): unlearning %s from %s, settings %s", p.mode, p.protection,
             [s["forget_identity"] for s in training], previous or "the original", p.run)
    generator = load_generator(p.generator, p.device)
    # replay: every target is the original model's, so the chain's protection does not drift with its steps
    teacher = copy.deepcopy(generator.unet) if replay else None
    if previous:
        apply_changed_parameters(generator, previous)
    # the seed of the ordinary job of the step's own identity (a joint job: of its first identity)
    seed = p.seed + selections[-1 if p.mode == "sequential" else 0]["forget_identity"]
    losses, timings = unlearn_selection(generator, p.run, training, pd.read_parquet(i.faces), labels, centroids,
                                        pd.read_parquet(i.manifest), p.faces, i.models, p.state, seed, teacher,
                                        p.weights)
    log.info("timings: %s", timings)
    save_changed_parameters(generator, p.run["regime"], p.run["surgical_blocks"], out.changed)
    write_parquet(losses, out.losses)
    write_json(selections, out.selections)
    write_json({**timings, "run_name": snakemake.wildcards.run, "run": p.run, "seed": seed, "mode": p.mode,
                "protection": p.protection, "identities": list(p.identities), "weights": p.weights,
                "previous": previous}, out.timings)
    if os.path.exists(p.state):
        os.remove(p.state)  # finished: the resume point is no longer needed
