import os

import pandas as pd
import torch

from idunlearn.experiment import load_generator
from idunlearn.io import read_json, write_parquet
from idunlearn.rebuild import prepare, query_record, retrain_units, run_rebuild, with_finds, write_ledger
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], snakemake.rule) as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out, wc = snakemake.input, snakemake.params, snakemake.output, snakemake.wildcards
    original = load_generator(p.generator)
    _, data = prepare(pd.read_parquet(i.selections), pd.read_parquet(i.faces), pd.read_parquet(i.labels),
                      pd.read_parquet(i.centroids), pd.read_parquet(i.manifest), original, p.selection, p.seed,
                      p.settings)
    ledger = run_rebuild(original, with_finds(data, pd.read_parquet(i.found)), p.settings, int(wc.budget),
                         retrain_units(read_json(i.reference)), read_json(i.search), os.path.dirname(out.model),
                         p.state, {"rule": snakemake.rule, "run": wc.name,
                                   "teacher": p.generator["mini"]["checkpoint"]})
    log.info("ledger: %s", {k: v for k, v in ledger.items() if k != "history"})
    write_ledger(ledger, out.ledger)
    write_parquet(pd.DataFrame(ledger["history"]), out.losses)
    write_parquet(query_record(p.state), out.queries)
