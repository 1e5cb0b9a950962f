"""Evaluation samples of one experiment: fixed conditions and initial noise, generated before and after
unlearning, read back with the face analyser (PIU Section 4: 25 forget + 25 retain samples in the paper)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..faces.analyser import FaceAnalyser, ok_embeddings, read_embeddings
from ..conditions import dirichlet_mixtures
from ..identities import centroid_matrix
from ..models.generator import IdentityGenerator, initial_noise
from .generation import read_samples, to_uint8_images
from .identity import identity_similarity, nearest_centroid

RETAIN_SEED_OFFSET = 100_000  # forget sample i uses seed + i, retain sample i seed + 100000 + i (reference code)


@dataclass
class EvaluationSet:
    """Conditions of one experiment's evaluation samples; identical before and after unlearning."""

    table: pd.DataFrame  # sample_id, kind (forget / retain), target_identity, seed
    embeddings: np.ndarray  # (N, D) identity conditions


def evaluation_set(selection: dict, faces: pd.DataFrame, labels: pd.DataFrame, n_forget: int, n_retain: int,
                   seed: int) -> EvaluationSet:
    """Forget samples: Dirichlet mixtures of forget-validation embeddings; retain samples: retain-validation
    image embeddings, cycling over the retain-validation identities."""
    emb = ok_embeddings(faces)
    rng = np.random.default_rng([seed, selection["forget_identity"]])
    forget_val = np.stack(emb.loc[selection["forget_val_images"]].to_numpy())
    forget = dirichlet_mixtures(forget_val, n_forget, rng)
    retain_ids = selection["retain_val_identities"]
    by_identity = labels.groupby("identity")["image_id"].apply(sorted)
    retain_targets = [retain_ids[i % len(retain_ids)] for i in range(n_retain)]
    retain = np.stack([np.asarray(emb[rng.choice(by_identity[r])], np.float32) for r in retain_targets])
    table = pd.DataFrame({
        "sample_id": [f"forget_{i:03d}" for i in range(n_forget)] + [f"retain_{i:03d}" for i in range(n_retain)],
        "kind": ["forget"] * n_forget + ["retain"] * n_retain,
        "target_identity": [selection["forget_identity"]] * n_forget + retain_targets,
        "seed": [seed + i for i in range(n_forget)] + [seed + RETAIN_SEED_OFFSET + i for i in range(n_retain)],
    })
    return EvaluationSet(table, np.concatenate([forget, retain]).astype(np.float32))


def generate_samples(generator: IdentityGenerator, embeddings: np.ndarray, seeds, steps: int, guidance: float,
                     batch_size: int = 16) -> np.ndarray:
    """(N, H, W, 3) uint8 images at the generator's resolution, sample i from the initial noise of seeds[i]."""
    noise = initial_noise(generator.latent_shape, list(seeds))
    with torch.no_grad():
        images = generator.generate(torch.as_tensor(embeddings), noise, steps, guidance, batch_size)
    return to_uint8_images(images)


def score_samples(samples: pd.DataFrame, images: np.ndarray, analyser: FaceAnalyser, centroids: pd.DataFrame,
                  anchor_identity: int | None) -> pd.DataFrame:
    """Per-sample rows: detected, detection score, landmarks, embedding, cosine to own centroid and to the anchor's
    (none without an anchor), nearest-centroid prediction over all identities."""
    read = read_samples(analyser, images, samples["sample_id"].tolist())
    ids, cents = centroids["identity"].to_numpy(), centroid_matrix(centroids)
    emb, detected = read_embeddings(read, cents.shape[1])
    own = cents[pd.Index(ids).get_indexer(samples["target_identity"])]
    out = samples.copy()
    out["detected"] = detected
    out["det_score"] = read["det_score"].to_numpy()
    out["landmarks"] = read["landmarks"].to_numpy()
    out["embedding"] = read["embedding"].to_numpy()
    out["own_cosine"] = identity_similarity(emb, own, detected)
    if anchor_identity is not None:
        anchor = np.repeat(cents[pd.Index(ids).get_indexer([anchor_identity])], len(samples), axis=0)
        out["anchor_cosine"] = identity_similarity(emb, anchor, detected)
    out["predicted_identity"] = nearest_centroid(emb, ids, cents, detected)
    return out
