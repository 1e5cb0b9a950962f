"""Held-out relearning variants: the relearning probe's fine-tuning (audit/relearning.py, the recipe of
unlearning/finetune.py) varied the ways an attacker may vary it: learning rate x0.1 and x10, a rank-4 LoRA on the
cross-attention instead of the weights themselves (audit/lora.py), more steps (10 / 50 / 200), and benign fine-tuning
on photos of other people (does the forgotten person resurface without being asked for?). Each variant fine-tunes a
fresh copy of the model from a held-out seed (audit/heldout.py) and is measured at every step count: on an unlearned
model the recovery of the forget identity, on the original model the ISM gain of the control identity under the same
variant (the control: what the same steps teach about a person never forgotten).

Rows: probe ``relearning_heldout:<variant>`` (``relearning_heldout_control:<variant>`` on the original model),
setting ``k=<steps>``, metrics ism, fa and recovery (gain for the control), as the relearning probe's.
"""

from __future__ import annotations

import copy

import pandas as pd

from ..faces.analyser import FaceAnalyser, ok_embeddings
from ..models.generator import IdentityGenerator
from ..runlog import logs_duration
from .heldout import HELDOUT_RELEARNING, heldout_seed
from .lora import add_cross_attention_lora
from .relearning import control_measure, forget_measure, image_pairs, relearn, relearning_rows

CONTROL_PROBE = f"{HELDOUT_RELEARNING}_control"


def benign_images(selection: dict, faces: pd.DataFrame, labels: pd.DataFrame, n: int) -> list[str]:
    """``n`` photos of other people: the first embedded image of each of the first ``n`` retain-train identities
    (never the forget identity, never the control identity, which is a retain-validation identity)."""
    embedded = set(ok_embeddings(faces).index)
    chosen = []
    for identity in sorted(selection["retain_train_identities"]):
        images = sorted(i for i in labels.loc[labels["identity"] == identity, "image_id"] if i in embedded)
        chosen += images[:1]
        if len(chosen) == n:
            return chosen
    raise ValueError(f"benign relearning needs {n} retain-train identities with an embedded image; the selection "
                     f"has {len(chosen)}: lower audit.probes.relearning.images")


@logs_duration("held-out relearning variants")
def heldout_relearning_rows(generator: IdentityGenerator, analyser: FaceAnalyser, selection: dict,
                            manifest: pd.DataFrame, faces: pd.DataFrame, labels: pd.DataFrame,
                            centroids: pd.DataFrame, evaluation_cfg: dict, relearning_cfg: dict, cfg: dict, tau: float,
                            seed: int, ism_before: float | None) -> list[dict]:
    """Every variant of ``cfg['variants']`` on a copy of ``generator`` (left as it is), with the relearning probe's
    images, batch, lr and regime (``relearning_cfg``). ``ism_before`` (the original's forget ISM): an unlearned
    model, measured on the forget identity; None: the original model, measured on the control identity."""
    forget_side = ism_before is not None
    if forget_side:
        measure, n = forget_measure(analyser, selection, faces, labels, centroids, evaluation_cfg, tau, seed)
        own = sorted(selection["forget_train_images"])
    else:
        measure, n, own = control_measure(analyser, selection, faces, labels, centroids, evaluation_cfg, tau, seed)
    count = relearning_cfg["images"]
    # every variant starts from the same model (a LoRA adapter starts at zero), so k = 0 is measured once
    generator.unet.eval()
    initial = measure(generator) if 0 in cfg["steps"] else None
    rows = []
    for name, variant in sorted(cfg["variants"].items()):
        model, variant_seed = copy.deepcopy(generator), heldout_seed(seed, "relearning_heldout", name)
        adapter = (add_cross_attention_lora(model.unet, variant["lora_rank"], variant_seed)
                   if variant["lora_rank"] else None)
        images = benign_images(selection, faces, labels, count) if variant["data"] == "benign" else own[:count]
        settings = {**relearning_cfg, "lr": relearning_cfg["lr"] * variant["lr_scale"]}
        records = relearn(model, *image_pairs(model, manifest, faces, images), cfg["steps"], settings, variant_seed,
                          measure, adapter, initial)
        probe = HELDOUT_RELEARNING if forget_side else CONTROL_PROBE
        rows += relearning_rows(records, f"{probe}:{name}", ism_before, n)
    return rows
