import os

import pandas as pd
import torch

from idunlearn.benchmarks import matmul_tflops
from idunlearn.controllable import run_epsilon
from idunlearn.experiment import load_generator, run_selection, unlearn_selection
from idunlearn.io import read_json, write_json, write_parquet
from idunlearn.runlog import stage_log
from idunlearn.tuning import tuned_settings
from idunlearn.unlearning.runner import save_changed_parameters

with stage_log(snakemake.log[0], "unlearn") as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    run, centroids = p.run, pd.read_parquet(i.centroids)
    # Phase II: epsilon from this identity's Phase I boundary runs (only epsilon_constrained runs hold the key)
    if run.get("epsilon_fraction") is not None:
        run = {**run, "epsilon": run_epsilon(run, *map(pd.read_parquet, i.boundaries))}
        log.info("Phase II epsilon %.6g at fraction %s", run["epsilon"], run["epsilon_fraction"])
    if "tuning_choice" in i.keys() and i.tuning_choice:  # <run>.tuned: the setting the tuning protocol chose
        run = tuned_settings(read_json(i.tuning_choice[0]), snakemake.wildcards.run)
        log.info("tuned settings: %s", run)
    selection = run_selection(read_json(i.selection), run, centroids)
    generator = load_generator(p.generator, p.device)
    seed = p.seed + selection["forget_identity"]
    # the host's speed around the job: shared 2-core hosts deliver 2-3x different FLOP rates from one day to the next,
    # so a job's seconds are read against this, never alone
    host = {"threads": snakemake.threads, "host_matmul_tflops_start": matmul_tflops(p.device)}
    losses, timings = unlearn_selection(generator, run, selection, pd.read_parquet(i.faces), pd.read_parquet(i.labels),
                                        centroids, pd.read_parquet(i.manifest), p.faces, i.models, p.state, seed)
    host["host_matmul_tflops_end"] = matmul_tflops(p.device)
    timings = {**timings, **host}
    log.info("timings: %s", timings)
    save_changed_parameters(generator, run["regime"], run["surgical_blocks"], out.changed)
    write_parquet(losses, out.losses)
    anchor = {k: selection[k] for k in ("anchor_identity", "anchor_cosine", "anchor_fallback", "tau")}
    write_json({**timings, "run_name": snakemake.wildcards.run, "run": run, "seed": seed, "anchor": anchor},
               out.timings)
    if os.path.exists(p.state):
        os.remove(p.state)  # finished: the resume point is no longer needed
