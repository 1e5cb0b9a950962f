import numpy as np
import pandas as pd
import torch

from idunlearn.audit.attack import attack_rows, heldout_attack_rows
from idunlearn.audit.inversion import inversion_rows
from idunlearn.audit.probes import probe_set
from idunlearn.audit.relearning import control_relearning, forget_relearning
from idunlearn.audit.relearning_heldout import heldout_relearning_rows
from idunlearn.audit.run import audit_rows, score_probes
from idunlearn.audit.second_recognizer import SecondRecognizer, second_evaluation_rows, second_probe_rows
from idunlearn.audit.trajectory import trajectory_probe
from idunlearn.experiment import differentiable_recognizer, load_generator
from idunlearn.faces import build_face_analyser
from idunlearn.faces.dlib_descriptor import DlibDescriptor
from idunlearn.io import read_json, write_parquet
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "audit") as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    selection, centroids = read_json(i.selection), pd.read_parquet(i.centroids)
    model = {k: i[k] for k in ("changed", "unet", "folder") if k in i.keys()}  # see evaluate.py
    generator = load_generator(p.generator, p.device, **model, never_saw=selection["forget_identity"])
    faces, labels, manifest = pd.read_parquet(i.faces), pd.read_parquet(i.labels), pd.read_parquet(i.manifest)
    tau, analyser = read_json(i.verification)["tau"], build_face_analyser(p.faces, i.models)
    probes = probe_set(selection, faces, centroids, p.probes, p.seed)
    scored, images = score_probes(generator, analyser, probes, centroids, p.evaluation)
    evaluation = pd.read_parquet(i.evaluation)
    before = pd.read_parquet(i.before) if "before" in i.keys() else None
    extra, second = [], None
    if "second_centroids" in i.keys():  # every verified sample verified again by the independent recognizer
        second = SecondRecognizer(DlibDescriptor(i.second_models, p.second["mode"]),
                                  pd.read_parquet(i.second_centroids), read_json(i.second_verification)["tau"])
        extra += second_probe_rows(second, scored, images)
        extra += second_evaluation_rows(second, evaluation, np.load(i.evaluation_images))
    if "trajectory" in p.probes:
        extra += trajectory_probe(generator, analyser, centroids, manifest, faces, labels, selection,
                                  p.probes["trajectory"], p.evaluation, tau, p.seed)
    if "attack" in p.probes:
        attack = p.probes["attack"]
        recognizer = differentiable_recognizer(p.faces, i.models) if attack["recognizer_weight"] > 0 else None
        extra += attack_rows(generator, analyser, centroids, manifest, faces, labels, selection, attack, p.evaluation,
                             tau, p.seed, recognizer, second)
        if "attack_heldout" in p.probes:
            extra += heldout_attack_rows(generator, analyser, centroids, manifest, faces, labels, selection, attack,
                                         p.probes["attack_heldout"], p.evaluation, tau, p.seed, recognizer, second,
                                         control=before is None)
    if "inversion" in p.probes:
        extra += inversion_rows(generator, analyser, centroids, manifest, faces, labels, selection,
                                p.probes["inversion"], tau)
    ism_before = None if before is None else before.loc[before["kind"] == "forget", "own_cosine"].mean()
    if "relearning_heldout" in p.probes:  # each variant on a copy of the generator
        extra += heldout_relearning_rows(generator, analyser, selection, manifest, faces, labels, centroids,
                                         p.evaluation, p.probes["relearning"], p.probes["relearning_heldout"], tau,
                                         p.seed, ism_before)
    if "relearning" in p.probes:  # last: it fine-tunes the generator in place
        common = (generator, analyser, selection, manifest, faces, labels, centroids, p.evaluation,
                  p.probes["relearning"], tau, p.seed)
        if before is None:
            extra += control_relearning(*common)
        else:
            extra += forget_relearning(*common, ism_before)
    ks = p.probes["leak"]["ks"] if "leak" in p.probes else []
    rows = audit_rows(scored, evaluation, before, centroids, selection["forget_identity"], tau, ks,
                      extra)
    log.info("%d probe samples, %d rows", len(scored), len(rows))
    write_parquet(scored.drop(columns=["landmarks"]), out.samples)
    write_parquet(rows, out.rows)
