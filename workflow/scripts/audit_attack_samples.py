import pandas as pd
import torch

from idunlearn.audit.attack import attack_rows
from idunlearn.audit.run import ROW_COLUMNS
from idunlearn.audit.second_recognizer import SecondRecognizer
from idunlearn.experiment import differentiable_recognizer, load_generator
from idunlearn.faces import build_face_analyser
from idunlearn.faces.dlib_descriptor import DlibDescriptor
from idunlearn.io import read_json, write_parquet
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "audit_attack_samples") as log:
    torch.set_num_threads(snakemake.threads)
    i, p = snakemake.input, snakemake.params
    selection = read_json(i.selection)
    model = {k: i[k] for k in ("changed", "unet", "folder") if k in i.keys()}  # see evaluate.py
    generator = load_generator(p.generator, p.device, **model, never_saw=selection["forget_identity"])
    second = None
    if "second_centroids" in i.keys():  # as in the audit job: its samples verified again by the second recognizer
        second = SecondRecognizer(DlibDescriptor(i.second_models, p.second["mode"]),
                                  pd.read_parquet(i.second_centroids), read_json(i.second_verification)["tau"])
    recognizer = differentiable_recognizer(p.faces, i.models) if p.attack["recognizer_weight"] > 0 else None
    # the forget identity alone: the attack's control is read from the original model's audit job
    rows = attack_rows(generator, build_face_analyser(p.faces, i.models), pd.read_parquet(i.centroids),
                       pd.read_parquet(i.manifest), pd.read_parquet(i.faces), pd.read_parquet(i.labels), selection,
                       p.attack, p.evaluation, read_json(i.verification)["tau"], p.seed, recognizer, second,
                       control=False)
    log.info("%d attack rows from %d samples", len(rows), p.attack["samples"])
    write_parquet(pd.DataFrame.from_records(rows, columns=ROW_COLUMNS).assign(cosine=float("nan")),
                  snakemake.output.rows)
