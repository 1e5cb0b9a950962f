import time

import pandas as pd
import torch
from safetensors.torch import load_file, save_file

from idunlearn.experiment import load_generator
from idunlearn.io import atomic_path, read_json, write_json
from idunlearn.many import CLOSED_FORM_MERGES, merge_conditions
from idunlearn.models.export import merge_changes, merge_regmean
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "many_merge") as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    started = time.perf_counter()
    generator = load_generator(p.generator, p.device)
    changed, selections = [load_file(path) for path in i.changed], [read_json(path) for path in i.selections]
    base = {name: tensor.detach().clone() for name, tensor in generator.unet.state_dict().items() if name in changed[0]}
    if p.merge == "sum":
        merged = merge_changes(base, changed)
    else:
        conditions, preserve = merge_conditions(generator, selections, pd.read_parquet(i.faces),
                                                pd.read_parquet(i.centroids), p.settings["merge_mixtures"], p.seed)
        merged = merge_regmean(base, changed, conditions, preserve, p.settings["merge_preserve_weight"],
                               p.settings["merge_lambda"], others=CLOSED_FORM_MERGES[p.merge])
    with atomic_path(out.changed) as tmp:  # the runs' file format: the new values of the parameters they changed
        save_file({name: tensor.contiguous() for name, tensor in merged.items()}, str(tmp))
    seconds = time.perf_counter() - started
    log.info("merged %s (%s) in %.1f s", p.identities, p.merge, seconds)
    write_json(selections, out.selections)
    write_json({"merge": p.merge, "identities": list(p.identities), "settings": p.settings,
                "seconds_this_session": seconds, "steps": 0}, out.timings)
