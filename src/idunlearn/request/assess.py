"""A forget request's model work, with the study's own code: unlearning (the run loop and its data), and one
assessment of a generator state (the evaluation's samples and metrics, then the audit's light probes)."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import torch

from ..audit.probes import probe_set
from ..audit.run import audit_rows, score_probes
from ..evaluation.quality import build_quality
from ..evaluation.run import evaluate_generator
from ..evaluation.samples import evaluation_set
from ..experiment import build_features, reference_features, unlearning_data
from ..faces.analyser import FaceAnalyser
from ..models.generator import IdentityGenerator
from ..unlearning import build_method
from ..unlearning.runner import unlearn
from .selection import RequestWorld

LIGHT_PROBES = ("leak", "photo", "neighbourhood")  # the audit's generation probes; no fine-tuning, no attack


def unlearn_request(generator: IdentityGenerator, selection: dict | list[dict], world: RequestWorld, run: dict,
                    state_path, seed: int, recognizer: Callable[[], torch.nn.Module]) -> tuple[pd.DataFrame, dict]:
    """Unlearn the request with ``run`` (a run config) in place, like an unlearning job of the study (a request for
    several people: their selections, unlearned jointly as the many stage's joint jobs are); ``recognizer`` makes the
    differentiable recognizer for methods that need one. Returns (loss log, timings)."""
    method = build_method(run["method"], run)
    needs = getattr(method, "needs", ())
    data = unlearning_data(selection, world.faces, world.labels, world.centroids,
                           latents_of=(world.manifest, generator) if "latents" in needs else None,
                           recognizer=recognizer() if "recognizer" in needs else None)
    return unlearn(generator, method, data, run, state_path, seed)


def assess(generator: IdentityGenerator, analyser: FaceAnalyser, selection: dict, world: RequestWorld, tau: float,
           evaluation_cfg: dict, probes_cfg: dict, seed: int,
           before: pd.DataFrame | None = None) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """Evaluate one generator state on the request (forget samples: Dirichlet mixtures of the request photos, scored
    against the request centroid; retain samples: retain-validation identities) and audit it with the light probes
    ``probes_cfg`` (the audit's settings). ``before``: the original model's evaluation samples (locality rows).
    Returns (evaluation samples, metrics, audit rows)."""
    unknown = set(probes_cfg) - set(LIGHT_PROBES)
    if unknown:
        raise ValueError(f"config key 'request.probes': {sorted(unknown)} are not light probes; use {LIGHT_PROBES}")
    features, quality = build_features(evaluation_cfg["kd"], analyser), build_quality(evaluation_cfg["quality"])
    eval_set = evaluation_set(selection, world.faces, world.labels, evaluation_cfg["n_forget_samples"],
                              evaluation_cfg["n_retain_samples"], seed)
    reference = reference_features(selection, world.manifest, world.faces, world.labels, generator, features)
    samples, metrics, _ = evaluate_generator(generator, analyser, features, quality, eval_set, world.centroids,
                                             selection["anchor_identity"], reference, evaluation_cfg)
    # every request photo is both forget-train and forget-validation: the photo probe takes each once
    probes = probe_set({**selection, "forget_train_images": []}, world.faces, world.centroids, probes_cfg, seed)
    scored, _ = score_probes(generator, analyser, probes, world.centroids, evaluation_cfg)
    ks = probes_cfg["leak"]["ks"] if "leak" in probes_cfg else []
    rows = audit_rows(scored, samples, before, world.centroids, selection["forget_identity"], tau, ks)
    return samples, metrics, rows

