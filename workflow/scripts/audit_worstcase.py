import pandas as pd
import torch

from idunlearn.audit.relearning_worstcase import worstcase_relearning_rows
from idunlearn.audit.run import ROW_COLUMNS
from idunlearn.experiment import load_generator
from idunlearn.faces import build_face_analyser
from idunlearn.io import read_json, write_parquet
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "audit_worstcase") as log:
    torch.set_num_threads(snakemake.threads)
    i, p = snakemake.input, snakemake.params
    selection = read_json(i.selection)
    model = {k: i[k] for k in ("changed", "unet", "folder") if k in i.keys()}  # see evaluate.py
    generator = load_generator(p.generator, p.device, **model, never_saw=selection["forget_identity"])
    rows = worstcase_relearning_rows(generator, build_face_analyser(p.faces, i.models), selection,
                                     pd.read_parquet(i.manifest), pd.read_parquet(i.faces), pd.read_parquet(i.labels),
                                     pd.read_parquet(i.centroids), p.evaluation, p.probe,
                                     read_json(i.verification)["tau"], p.seed)
    log.info("%d worst-case relearning rows", len(rows))
    write_parquet(pd.DataFrame.from_records(rows, columns=ROW_COLUMNS).assign(cosine=float("nan")),
                  snakemake.output.rows)
