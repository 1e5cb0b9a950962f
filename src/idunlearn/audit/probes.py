"""The conditions the forgetting audit generates from (parts 1-3): Leak@k conditions, the photo probe and the
neighbourhood probe. The same conditions and initial noise go to the original and to every unlearned model of a
forget identity, so that each probe is a paired comparison.

Probe table columns: sample_id, probe, setting, condition, seed_index, target_identity (always the forget identity:
the question is whether it comes back), cosine (condition to the forget centroid), seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..conditions import dirichlet_mixtures, great_circle
from ..faces.analyser import ok_embeddings
from ..identities import centroid_lookup

AUDIT_SEED_OFFSET = 200_000  # audit sample i uses seed + 200000 + i: apart from the evaluation's seeds
# relearning, trajectory and attack take no conditions from here (relearning.py, trajectory.py, attack.py), nor do the
# held-out attacks (attack.py's attack_heldout, inversion.py, relearning_heldout.py, relearning_worstcase.py)
PROBES = ("leak", "photo", "neighbourhood", "relearning", "trajectory", "attack", "attack_heldout", "inversion",
          "relearning_heldout", "relearning_worstcase")


def control_identity(selection: dict, faces: pd.DataFrame, labels: pd.DataFrame) -> tuple[int, list[str]]:
    """The audit's control identity (the first retain-validation identity) and its embedded images, sorted: the
    relearning, trajectory and attack probes treat it like the forget identity."""
    identity = selection["retain_val_identities"][0]
    embedded = set(ok_embeddings(faces).index)
    return identity, sorted(i for i in labels.loc[labels["identity"] == identity, "image_id"] if i in embedded)


@dataclass
class ProbeSet:
    table: pd.DataFrame
    embeddings: np.ndarray  # (N, D) float32 unit conditions, row i for table row i


def _rows(probe: str, setting: list[str], condition: list[str], seed_index: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"probe": probe, "setting": setting, "condition": condition, "seed_index": seed_index})


def probe_set(selection: dict, faces: pd.DataFrame, centroids: pd.DataFrame, cfg: dict, seed: int) -> ProbeSet:
    """Every enabled probe's conditions for one forget identity (``cfg``: the config's ``audit.probes``)."""
    unknown = set(cfg) - set(PROBES)
    if unknown:
        raise ValueError(f"config key 'audit.probes': unknown probe(s) {sorted(unknown)}; use {', '.join(PROBES)}")
    for heldout, base in (("attack_heldout", "attack"), ("relearning_heldout", "relearning")):
        if heldout in cfg and base not in cfg:
            raise ValueError(f"config key 'audit.probes.{heldout}' varies the {base} probe's settings; enable "
                             f"audit.probes.{base} too")
    forget = selection["forget_identity"]
    emb = ok_embeddings(faces)
    cents = centroid_lookup(centroids)
    centre = cents[forget]
    rng = np.random.default_rng([seed, forget, 7])  # the audit's own stream, apart from the evaluation's
    parts, conditions = [], []

    if "leak" in cfg:  # Leak@k: Dirichlet mixtures of forget-validation images, as the evaluation draws them
        p = cfg["leak"]
        if max(p["ks"]) > p["seeds"]:
            raise ValueError(f"config key 'audit.probes.leak.ks': Leak@{max(p['ks'])} needs at least that many seeds "
                             f"per condition ('audit.probes.leak.seeds' is {p['seeds']})")
        mixtures = dirichlet_mixtures(np.stack(emb.loc[selection["forget_val_images"]].to_numpy()), p["conditions"],
                                      rng)
        names = [f"mixture_{i:02d}" for i in range(p["conditions"])]
        parts.append(_rows("leak", ["mixture"] * (len(names) * p["seeds"]), np.repeat(names, p["seeds"]).tolist(),
                           list(range(p["seeds"])) * len(names)))
        conditions.append(np.repeat(mixtures, p["seeds"], axis=0))

    if "photo" in cfg:  # every real image of the forget identity, alone
        p = cfg["photo"]
        images = sorted(selection["forget_train_images"]) + sorted(selection["forget_val_images"])
        split = ["train"] * len(selection["forget_train_images"]) + ["val"] * len(selection["forget_val_images"])
        parts.append(_rows("photo", np.repeat(split, p["seeds"]).tolist(), np.repeat(images, p["seeds"]).tolist(),
                           list(range(p["seeds"])) * len(images)))
        conditions.append(np.repeat(np.stack(emb.loc[images].to_numpy()).astype(np.float32), p["seeds"], axis=0))

    if "neighbourhood" in cfg:  # great circles from the forget centroid to retain-validation centroids and random
        p = cfg["neighbourhood"]
        retain = selection["retain_val_identities"][:p["retain_directions"]]
        directions = {f"retain_{r}": cents[r] for r in retain}
        for i in range(p["random_directions"]):
            directions[f"random_{i}"] = rng.standard_normal(len(centre))
        cosines = sorted(set(p["cosines"]), reverse=True)
        settings, names, points = [], [], []
        for name, direction in directions.items():
            for cos, point in zip(cosines, great_circle(centre, direction, cosines)):
                if cos == 1.0 and name != next(iter(directions)):
                    continue  # cosine 1 is the centroid itself: once
                settings.append(f"{cos:g}")
                names.append("centroid" if cos == 1.0 else f"{name}@{cos:g}")
                points.append(point)
        parts.append(_rows("neighbourhood", np.repeat(settings, p["seeds"]).tolist(),
                           np.repeat(names, p["seeds"]).tolist(), list(range(p["seeds"])) * len(names)))
        conditions.append(np.repeat(np.stack(points), p["seeds"], axis=0))

    if not parts:
        raise ValueError("config key 'audit.probes' enables no generation probe; enable at least one of leak, photo, "
                         "neighbourhood")
    table = pd.concat(parts, ignore_index=True)
    embeddings = np.concatenate(conditions).astype(np.float32)
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    table.insert(0, "sample_id", [f"audit_{i:04d}" for i in range(len(table))])
    table["target_identity"] = forget
    table["cosine"] = unit @ (centre / np.linalg.norm(centre))
    table["seed"] = seed + AUDIT_SEED_OFFSET + np.arange(len(table))
    return ProbeSet(table, embeddings)
