import pandas as pd
import torch

from idunlearn.audit.probes import probe_set
from idunlearn.audit.run import audit_rows, score_probes
from idunlearn.experiment import load_generator
from idunlearn.faces import build_face_analyser
from idunlearn.io import read_json, write_parquet
from idunlearn.runlog import stage_log
from idunlearn.unlearning.runner import apply_changed_parameters

with stage_log(snakemake.log[0], "audit") as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    selection, centroids = read_json(i.selection), pd.read_parquet(i.centroids)
    generator = load_generator(p.generator, p.device)
    if "changed" in i.keys():
        apply_changed_parameters(generator, i.changed)
    probes = probe_set(selection, pd.read_parquet(i.faces), centroids, p.probes, p.seed)
    scored, _ = score_probes(generator, build_face_analyser(p.faces, i.models), probes, centroids, p.evaluation)
    ks = p.probes["leak"]["ks"] if "leak" in p.probes else []
    rows = audit_rows(scored, pd.read_parquet(i.evaluation), pd.read_parquet(i.before) if "before" in i.keys() else None,
                      centroids, selection["forget_identity"], read_json(i.verification)["tau"], ks)
    log.info("%d probe samples, %d rows", len(scored), len(rows))
    write_parquet(scored.drop(columns=["landmarks"]), out.samples)
    write_parquet(rows, out.rows)
