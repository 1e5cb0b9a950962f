"""Relearning probe (forgetting audit, part 5): fine-tune a generator for k steps on a few real images of one identity
with the plain denoising loss, the same recipe for every method, and measure how much of the identity comes back.

recovery_k = (ISM_k - ISM_after) / (ISM_before - ISM_after): 0 at k = 0 by construction, 1 when the unlearned model is
back at the original's ISM. A person that returns after a few steps was hidden, not removed. The control is the
original model fine-tuned the same way on a retain-validation identity: how much the same few steps teach about a
person that was never forgotten.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from ..conditions import dirichlet_mixtures
from ..evaluation.samples import evaluation_set, generate_samples, score_samples
from ..experiment import real_latents
from ..faces.analyser import FaceAnalyser, ok_embeddings
from ..models.generator import IdentityGenerator
from ..models.layers import select_trainable
from ..runlog import logs_duration
from ..unlearning.finetune import attacker_optimiser, finetune_step
from .probes import AUDIT_SEED_OFFSET, control_identity
from .verification import verified

CONTROL_SEED_OFFSET = 100_000  # the control identity's samples: apart from the probe samples' seeds


def relearn(generator: IdentityGenerator, latents: torch.Tensor, embeddings: np.ndarray, checkpoints, cfg: dict,
            seed: int, measure: Callable[[IdentityGenerator], dict],
            params: list[torch.nn.Parameter] | None = None, initial: dict | None = None) -> list[dict]:
    """Fine-tune ``generator`` in place on (clean latent, own embedding) pairs and ``measure`` it at every step count
    in ``checkpoints`` (0 measures the model as given). ``cfg``: regime, batch, lr (AdamW, no weight decay);
    ``params``: the tensors that train instead of the regime's (a LoRA adapter's); ``initial``: the measurement
    of the model as given when it is already taken (it is then the k = 0 record, not measured again). Returns one
    record per checkpoint: {"k": k, **measure(generator)}."""
    steps = sorted({int(k) for k in checkpoints})
    if not steps or steps[0] < 0:
        raise ValueError(f"config key 'audit.probes.relearning.steps': non-negative step counts needed (got {steps})")
    generator.requires_grad_(False)
    params = (list(select_trainable(generator.unet, cfg["regime"]).values()) if params is None
              else [p.requires_grad_(True) for p in params])
    optimiser = attacker_optimiser(params, cfg["lr"])
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    records, done = [], 0
    for k in steps:
        generator.unet.train()
        while done < k:
            finetune_step(generator, optimiser, latents, embeddings, cfg["batch"], rng, gen)
            done += 1
        generator.unet.eval()
        records.append({"k": k, **(initial if done == 0 and initial is not None else measure(generator))})
    return records


def recovery(ism_k: float, ism_after: float, ism_before: float) -> float:
    """(ISM_k - ISM_after) / (ISM_before - ISM_after); NaN when unlearning left nothing to recover."""
    gap = ism_before - ism_after
    return float((ism_k - ism_after) / gap) if gap > 1e-9 else float("nan")


def identity_measure(analyser: FaceAnalyser, centroids: pd.DataFrame, table: pd.DataFrame, embeddings: np.ndarray,
                     cfg: dict, tau: float):
    """generator -> {"ism", "fa"} of the samples of ``table`` (sample_id, target_identity, seed; conditions
    ``embeddings``): ISM and the share verified as the target identity (the relearning probe's measurement)."""
    def measure(generator: IdentityGenerator) -> dict:
        images = generate_samples(generator, embeddings, table["seed"], cfg["steps"], cfg["guidance"],
                                  cfg["batch_size"])
        scored = score_samples(table, images, analyser, centroids, anchor_identity=None)
        return {"ism": float(scored["own_cosine"].mean()), "fa": float(verified(scored, tau).mean())}
    return measure


def relearning_rows(records: list[dict], probe: str, ism_before: float | None, n: int) -> list[dict]:
    """Rows of a relearning run: ISM and FA at every k, and recovery (against ``ism_before``, the original model's
    ISM on the same conditions, and the k = 0 ISM) or, for the control, the ISM gain over k = 0."""
    start = records[0]["ism"]
    rows = []
    for record in records:
        setting = f"k={record['k']}"
        extra = (("recovery", recovery(record["ism"], start, ism_before)) if ism_before is not None
                 else ("gain", record["ism"] - start))
        for metric, value in (("ism", record["ism"]), ("fa", record["fa"]), extra):
            rows.append({"probe": probe, "setting": setting, "metric": metric, "value": value,
                         "ci_low": float("nan"), "ci_high": float("nan"), "n": n})
    return rows


def forget_measure(analyser: FaceAnalyser, selection: dict, faces: pd.DataFrame, labels: pd.DataFrame,
                   centroids: pd.DataFrame, evaluation_cfg: dict, tau: float, seed: int):
    """(measure, n): the evaluation's forget samples (same conditions and noise as the evaluation stage) as an
    ``identity_measure``, and their number."""
    evaluation = evaluation_set(selection, faces, labels, evaluation_cfg["n_forget_samples"],
                                evaluation_cfg["n_retain_samples"], seed)
    forget = (evaluation.table["kind"] == "forget").to_numpy()
    return identity_measure(analyser, centroids, evaluation.table[forget].reset_index(drop=True),
                            evaluation.embeddings[forget], evaluation_cfg, tau), int(forget.sum())


def control_measure(analyser: FaceAnalyser, selection: dict, faces: pd.DataFrame, labels: pd.DataFrame,
                    centroids: pd.DataFrame, evaluation_cfg: dict, tau: float, seed: int):
    """(measure, n, images): Dirichlet mixtures of the control identity's (first retain-validation identity's) images
    as an ``identity_measure``, their number, and the identity's embedded images."""
    identity, images = control_identity(selection, faces, labels)
    own = np.stack(ok_embeddings(faces).loc[images].to_numpy()).astype(np.float32)
    n = evaluation_cfg["n_forget_samples"]
    conditions = dirichlet_mixtures(own, n, np.random.default_rng([seed, identity, 11]))
    table = pd.DataFrame({"sample_id": [f"control_{i:03d}" for i in range(n)], "target_identity": identity,
                          "seed": seed + AUDIT_SEED_OFFSET + CONTROL_SEED_OFFSET + np.arange(n)})
    return identity_measure(analyser, centroids, table, conditions, evaluation_cfg, tau), n, images


def image_pairs(generator: IdentityGenerator, manifest: pd.DataFrame, faces: pd.DataFrame,
                images: list[str]) -> tuple[torch.Tensor, np.ndarray]:
    """(clean latents, own embeddings) of ``images``: what the attacker fine-tunes on."""
    return (real_latents(generator, manifest, faces, images),
            np.stack(ok_embeddings(faces).loc[images].to_numpy()).astype(np.float32))


@logs_duration("relearning probe")
def forget_relearning(generator: IdentityGenerator, analyser: FaceAnalyser, selection: dict, manifest: pd.DataFrame,
                      faces: pd.DataFrame, labels: pd.DataFrame, centroids: pd.DataFrame, evaluation_cfg: dict,
                      cfg: dict, tau: float, seed: int, ism_before: float) -> list[dict]:
    """Fine-tune ``generator`` (in place) on the first ``cfg['images']`` forget-train images and measure the
    evaluation's forget samples (same conditions and noise as the evaluation stage) at every k."""
    measure, n = forget_measure(analyser, selection, faces, labels, centroids, evaluation_cfg, tau, seed)
    images = sorted(selection["forget_train_images"])[:cfg["images"]]
    records = relearn(generator, *image_pairs(generator, manifest, faces, images), cfg["steps"], cfg, seed, measure)
    return relearning_rows(records, "relearning", ism_before, n)


@logs_duration("relearning probe (control)")
def control_relearning(generator: IdentityGenerator, analyser: FaceAnalyser, selection: dict,
                       manifest: pd.DataFrame, faces: pd.DataFrame, labels: pd.DataFrame, centroids: pd.DataFrame,
                       evaluation_cfg: dict, cfg: dict, tau: float, seed: int) -> list[dict]:
    """The control: the same fine-tuning of ``generator`` (in place; the original model) on the first
    retain-validation identity, measured on Dirichlet mixtures of its images."""
    measure, n, images = control_measure(analyser, selection, faces, labels, centroids, evaluation_cfg, tau, seed)
    records = relearn(generator, *image_pairs(generator, manifest, faces, images[:cfg["images"]]), cfg["steps"], cfg,
                      seed, measure)
    return relearning_rows(records, "relearning_control", None, n)
