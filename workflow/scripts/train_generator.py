import os

import pandas as pd
import torch

from idunlearn.evaluation.generation import identity_monitor
from idunlearn.faces import build_face_analyser
from idunlearn.io import write_parquet
from idunlearn.models.mini import DEFAULT_ARCHITECTURE
from idunlearn.models.pretrain import train_mini_generator
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], snakemake.rule):
    torch.set_num_threads(snakemake.threads)
    p, i = snakemake.params, snakemake.input
    history = train_mini_generator(
        pd.read_parquet(i.manifest), pd.read_parquet(i.faces), {**DEFAULT_ARCHITECTURE, **p.mini["architecture"]},
        p.mini["training"],
        os.path.dirname(snakemake.output.model), p.state,
        monitor=identity_monitor(build_face_analyser(p.faces, i.models), pd.read_parquet(i.centroids), p.mini["training"]),
        labels=pd.read_parquet(i.labels), exclude_identities=p.exclude)
    write_parquet(pd.DataFrame(history), snakemake.output.history)
