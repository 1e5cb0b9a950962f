import pandas as pd
import torch

from idunlearn.faces import build_face_analyser
from idunlearn.io import write_parquet
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "extract_embeddings") as log:
    torch.set_num_threads(snakemake.threads)
    faces = snakemake.params.faces
    analyser = build_face_analyser(faces, snakemake.input.models)
    manifest = pd.read_parquet(snakemake.input.manifest)
    table = analyser.analyse(zip(manifest["image_id"], manifest["path"]), batch_size=faces["batch_size"])
    log.info("status counts: %s", table["status"].value_counts().to_dict())
    write_parquet(table, snakemake.output.embeddings)
