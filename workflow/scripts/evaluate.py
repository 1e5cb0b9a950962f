import numpy as np
import pandas as pd
import torch

from idunlearn.evaluation.quality import build_quality
from idunlearn.evaluation.run import anchor_images, evaluate_generator
from idunlearn.evaluation.samples import evaluation_set
from idunlearn.experiment import build_features, load_generator, reference_features
from idunlearn.faces import build_face_analyser
from idunlearn.io import atomic_path, read_json, write_json, write_parquet
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "evaluate") as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    cfg, selection = p.evaluation, read_json(i.selection)
    if "timings" in i.keys():  # the run's own anchor (a tau-ablation run re-draws it)
        selection.update(read_json(i.timings)["anchor"])
    manifest, faces = pd.read_parquet(i.manifest), pd.read_parquet(i.faces)
    labels, centroids = pd.read_parquet(i.labels), pd.read_parquet(i.centroids)
    # the original model, an unlearning run's (input changed) or an external model's (input unet, or folder: a whole
    # generator such as the never-trained reference; selection's anchor)
    model = {k: i[k] for k in ("changed", "unet", "folder") if k in i.keys()}
    generator = load_generator(p.generator, p.device, **model, never_saw=selection["forget_identity"])
    analyser = build_face_analyser(p.faces, i.models)
    features, quality = build_features(cfg["kd"], analyser, p.device), build_quality(cfg["quality"])
    eval_set = evaluation_set(selection, faces, labels, cfg["n_forget_samples"], cfg["n_retain_samples"], p.seed)
    scored, metrics, images = evaluate_generator(generator, analyser, features, quality, eval_set, centroids,
                                                 selection["anchor_identity"],
                                                 reference_features(selection, manifest, faces, labels, generator,
                                                                    features), cfg)
    log.info("metrics: %s", metrics)
    arrays = {"samples": images, "sample_ids": scored["sample_id"].to_numpy(str)}
    if not model:
        arrays["anchor"] = anchor_images(generator, eval_set, centroids, selection["anchor_identity"], cfg)
    with atomic_path(out.images) as tmp:
        with open(tmp, "wb") as handle:
            np.savez_compressed(handle, **arrays)
    write_parquet(scored, out.samples)
    write_json({**metrics, "kd_features": features.name, "quality_measure": quality.name, "forget_identity": selection["forget_identity"]},
               out.metrics)
