"""Embedding attack (forgetting audit, part 4): a white-box search for an identity condition from which the model
draws the forgotten person again.

The search (unlearning/adversarial.py, shared with piu_robust's inner attack) optimises a unit identity condition to
minimise the model's denoising loss on the forget-train images (UnlearnDiffAtk's objective on the identity embedding),
optionally with a recognizer pull and inside a cosine ball around the centroid. Each restart (the centroid, then
random starts) runs ``steps`` Adam steps and keeps ``checkpoints`` conditions evenly spaced along its path (the last
one at its end; never the start). The candidate
with the lowest loss on a fixed evaluation batch wins (``select: loss``), or, for an attacker who may use a recognizer
(``select: recognizer``), the candidate whose condition draws the person best in a few samples of their own seeds: a
search that passes through the person and then drifts past keeps what it found. Fresh samples from the winner are
then verified: the attack success rate.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch
from torch.nn.functional import normalize

from ..evaluation.samples import generate_samples, score_samples
from ..experiment import real_latents
from ..faces.analyser import FaceAnalyser
from ..identities import centroid_lookup
from ..models.generator import IdentityGenerator
from ..runlog import logs_duration
from ..unlearning.adversarial import centroid_and_random_starts, search_conditions
from .heldout import heldout_seed
from .probes import AUDIT_SEED_OFFSET, control_identity
from .run import mean_row, share_row
from .verification import verified

ATTACK_SEED_OFFSET = 400_000  # samples drawn from an attack's condition: apart from every other sample's seeds


def attack_condition(generator: IdentityGenerator, latents: torch.Tensor, centroid: np.ndarray, cfg: dict, seed: int,
                     recognizer=None) -> dict:
    """Search a condition for the identity of ``latents`` (its real images) whose centroid is ``centroid``.

    cfg: restarts (the first starts at the centroid), steps, checkpoints, lr, batch, t_low, t_high, min_cosine (None:
    no ball), recognizer_weight. Returns the candidate with the lowest evaluation loss: embedding (unit, float32), its
    cosine to the centroid, its loss on the evaluation batch, the restart and step it came from; ``candidates`` holds
    every checkpoint of every restart, ``restart_losses`` each restart's final loss."""
    generator.requires_grad_(False)
    centre = normalize(torch.as_tensor(np.asarray(centroid), dtype=torch.float32), dim=0)
    gen = torch.Generator().manual_seed(seed)

    starts, kept = centroid_and_random_starts(centre, cfg, gen)
    candidates = search_conditions(generator, latents, centre, starts, cfg, gen, recognizer, kept)
    best = min(candidates, key=lambda r: r["loss"])
    finals = [c["loss"] for c in candidates if c["step"] == cfg["steps"]]
    return {**best, "restart_losses": finals, "candidates": candidates}


@logs_duration("embedding attack")
def attack_rows(generator: IdentityGenerator, analyser: FaceAnalyser, centroids: pd.DataFrame, manifest: pd.DataFrame,
                faces: pd.DataFrame, labels: pd.DataFrame, selection: dict, cfg: dict, sampler_cfg: dict, tau: float,
                seed: int, recognizer=None, second=None, probe: str = "attack",
                seeds: Callable[[int], tuple[int, int]] | None = None, control: bool = True) -> list[dict]:
    """The attack on the forget identity (probe ``probe``) and, with ``control``, on the first retain-validation
    identity (``<probe>_control``), each from its own real images (forget-train images; the control identity's
    images): the winner's samples verified as the attacked identity (fa), their ISM, the winner's cosine to the
    centroid and its loss; with ``second`` (an ``audit.second_recognizer.SecondRecognizer``) also the winner's samples
    under the independent recognizer (fa_second, ism_second). ``seeds``: index (0 the forget identity, 1 the control)
    -> (the search's seed, the first sample seed); by default the audit attack's, seed + index and
    seed + 600000 + 1000 x index."""
    seeds = seeds or (lambda index: (seed + index, seed + AUDIT_SEED_OFFSET + ATTACK_SEED_OFFSET + 1000 * index))
    cents = centroid_lookup(centroids)
    attacked = [(probe, selection["forget_identity"], sorted(selection["forget_train_images"]))]
    if control:
        identity, images = control_identity(selection, faces, labels)
        attacked.append((f"{probe}_control", identity, images[:len(selection["forget_train_images"])]))
    rows = []
    for index, (name, identity, images) in enumerate(attacked):
        search_seed, base = seeds(index)
        found = attack_condition(generator, real_latents(generator, manifest, faces, images), cents[identity], cfg,
                                 search_seed, recognizer)

        def scored_from(embedding: np.ndarray, n: int, first_seed: int) -> tuple[pd.DataFrame, np.ndarray]:
            table = pd.DataFrame({"sample_id": [f"{name}_{i:02d}" for i in range(n)], "target_identity": identity,
                                  "seed": first_seed + np.arange(n)})
            drawn = generate_samples(generator, np.repeat(embedding[None], n, axis=0), table["seed"],
                                     sampler_cfg["steps"], sampler_cfg["guidance"], sampler_cfg["batch_size"])
            return score_samples(table, drawn, analyser, centroids, anchor_identity=None), drawn

        if cfg["select"] == "recognizer":  # the attacker checks each candidate condition with its recognizer
            found = max(found["candidates"], key=lambda r: scored_from(
                r["embedding"], cfg["select_samples"], base + 500)[0]["own_cosine"].mean())
        scored, drawn = scored_from(found["embedding"], cfg["samples"], base)  # fresh seeds: no selection bias
        rows += [share_row(name, "best", "fa", verified(scored, tau)), mean_row(name, "best", "ism",
                 scored["own_cosine"])]
        if second is not None:
            rows += second.rows(name, "best", scored["target_identity"], drawn)
        rows += [{"probe": name, "setting": "best", "metric": metric, "value": found[metric], "ci_low": float("nan"),
                  "ci_high": float("nan"), "n": 1} for metric in ("cosine", "loss")]
    return rows


@logs_duration("held-out embedding attack")
def heldout_attack_rows(generator: IdentityGenerator, analyser: FaceAnalyser, centroids: pd.DataFrame,
                        manifest: pd.DataFrame, faces: pd.DataFrame, labels: pd.DataFrame, selection: dict,
                        attack_cfg: dict, cfg: dict, sampler_cfg: dict, tau: float, seed: int, recognizer=None,
                        second=None, control: bool = True) -> list[dict]:
    """The held-out embedding attack (probe ``attack_heldout``): the audit attack's settings ``attack_cfg`` at
    ``cfg['budget']`` x its steps with ``cfg['restarts']`` starts, every seed from the held-out stream. ``control``:
    also the control identity (the audit job of the original model; the verdicts and targets read the held-out
    controls from that job only, so an audited model's job leaves it out: about half the attack's time)."""
    strong = {**attack_cfg, "steps": attack_cfg["steps"] * cfg["budget"], "restarts": cfg["restarts"]}
    # the undecorated search, so that the log names the held-out attack's time once, not as the audit attack's too
    return attack_rows.__wrapped__(generator, analyser, centroids, manifest, faces, labels, selection, strong,
                                   sampler_cfg, tau, seed, recognizer, second, probe="attack_heldout",
                                   seeds=lambda index: (heldout_seed(seed, "attack_heldout", index),
                                                        heldout_seed(seed, "attack_heldout", 10 + index)),
                                   control=control)
