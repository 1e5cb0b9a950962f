"""Evaluate one generator state on one experiment's fixed evaluation set."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..faces.analyser import FaceAnalyser
from ..identities import centroid_lookup
from ..models.generator import IdentityGenerator
from .metrics import run_metrics
from .samples import EvaluationSet, generate_samples, score_samples


def evaluate_generator(generator: IdentityGenerator, analyser: FaceAnalyser, features, quality,
                       eval_set: EvaluationSet, centroids: pd.DataFrame, anchor_identity: int,
                       reference_features: np.ndarray, cfg: dict) -> tuple[pd.DataFrame, dict, np.ndarray]:
    """Generate the evaluation samples, score them (identity, detection, ``quality``) and compute the run metrics.
    Returns (samples, metrics, images)."""
    images = generate_samples(generator, eval_set.embeddings, eval_set.table["seed"], cfg["steps"], cfg["guidance"],
                              cfg["batch_size"])
    scored = score_samples(eval_set.table, images, analyser, centroids, anchor_identity)
    scored["quality"] = quality(images, scored)
    metrics = run_metrics(scored, features(images), reference_features, cfg["kd"])
    return scored, metrics, images


def anchor_images(generator: IdentityGenerator, eval_set: EvaluationSet, centroids: pd.DataFrame,
                  anchor_identity: int, cfg: dict) -> np.ndarray:
    """The forget samples' initial noise conditioned on the anchor centroid: the anchor row of PIU Fig. 4."""
    forget = eval_set.table["kind"] == "forget"
    cents = centroid_lookup(centroids)
    cond = np.repeat(cents[anchor_identity][None].astype(np.float32), int(forget.sum()), axis=0)
    return generate_samples(generator, cond, eval_set.table.loc[forget, "seed"], cfg["steps"], cfg["guidance"],
                            cfg["batch_size"])
