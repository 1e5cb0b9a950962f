import pandas as pd
import torch

from idunlearn.experiment import differentiable_recognizer, load_generator
from idunlearn.io import write_json, write_parquet
from idunlearn.rebuild import prepare, search_job
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], snakemake.rule) as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    cfg, manifest, faces = p.settings, pd.read_parquet(i.manifest), pd.read_parquet(i.faces)
    original = load_generator(p.generator)
    selections, data = prepare(pd.read_parquet(i.selections), faces, pd.read_parquet(i.labels),
                               pd.read_parquet(i.centroids), manifest, original, p.selection, p.seed, cfg)
    recognizer = differentiable_recognizer(p.faces, i.models) if cfg["search"]["recognizer_weight"] > 0 else None
    found, ledger = search_job(selections, data, original, manifest, faces, cfg, recognizer)
    log.info("search: %d finds, %s", len(found), ledger)
    write_parquet(found, out.found)
    write_json(ledger, out.ledger)
