import os

import pandas as pd
import torch

from idunlearn.experiment import load_generator, unlearning_data
from idunlearn.io import read_json, write_json, write_parquet
from idunlearn.runlog import stage_log
from idunlearn.unlearning import build_method
from idunlearn.unlearning.runner import save_changed_parameters, unlearn

with stage_log(snakemake.log[0], "unlearn") as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    run, selection = p.run, read_json(i.selection)
    generator = load_generator(p.generator, p.device)
    data = unlearning_data(selection, pd.read_parquet(i.faces), pd.read_parquet(i.labels), pd.read_parquet(i.centroids))
    seed = p.seed + selection["forget_identity"]
    losses, timings = unlearn(generator, build_method(run["method"], run), data, run, p.state, seed)
    log.info("timings: %s", timings)
    save_changed_parameters(generator, run["regime"], run["surgical_blocks"], out.changed)
    write_parquet(losses, out.losses)
    write_json({**timings, "run_name": snakemake.wildcards.run, "run": run, "seed": seed}, out.timings)
    if os.path.exists(p.state):
        os.remove(p.state)  # finished: the resume point is no longer needed
