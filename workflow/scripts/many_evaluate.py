import pandas as pd
import torch

from idunlearn.evaluation.quality import build_quality
from idunlearn.evaluation.run import evaluate_generator
from idunlearn.evaluation.samples import evaluation_set
from idunlearn.experiment import build_features, load_generator, reference_features
from idunlearn.faces import build_face_analyser
from idunlearn.io import read_json, write_parquet
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "many_evaluate") as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    cfg, selections = p.evaluation, read_json(i.selections)
    selections = [selections] if isinstance(selections, dict) else selections  # a single job: its one selection
    manifest, faces = pd.read_parquet(i.manifest), pd.read_parquet(i.faces)
    labels, centroids = pd.read_parquet(i.labels), pd.read_parquet(i.centroids)
    generator = load_generator(p.generator, p.device, changed=i.changed)
    analyser = build_face_analyser(p.faces, i.models)
    features, quality = build_features(cfg["kd"], analyser, p.device), build_quality(cfg["quality"])
    # the retain-validation identities are the same for every selection of the job
    reference = reference_features(selections[0], manifest, faces, labels, generator, features)
    samples, metrics = [], []
    for selection in selections:  # each forgotten identity's own evaluation set (as the ordinary evaluation's)
        eval_set = evaluation_set(selection, faces, labels, cfg["n_forget_samples"], cfg["n_retain_samples"], p.seed)
        scored, values, _ = evaluate_generator(generator, analyser, features, quality, eval_set, centroids,
                                               selection["anchor_identity"], reference, cfg)
        log.info("identity %d: %s", selection["forget_identity"], values)
        samples.append(scored.assign(forget_identity=selection["forget_identity"]))
        metrics.append({"forget_identity": selection["forget_identity"], **values})
    write_parquet(pd.concat(samples, ignore_index=True), out.samples)
    write_parquet(pd.DataFrame(metrics), out.metrics)
