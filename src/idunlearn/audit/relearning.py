"""Relearning probe (forgetting audit, part 5): fine-tune a generator for k steps on a few real images of one identity
with the plain denoising loss, the same recipe for every method, and measure how much of the identity comes back.

recovery_k = (ISM_k - ISM_after) / (ISM_before - ISM_after): 0 at k = 0 by construction, 1 when the unlearned model is
back at the original's ISM. A person that returns after a few steps was hidden, not removed. The ratio divides by the
gap unlearning opened, so it is taken only where that gap is at least a declared minimum (audit.verdict's
recovery_min_gap): below it the identity is listed, not averaged, and a negative gap (unlearning left the person
closer than the original did) counts as full recovery, a failure. Beside it every row kind reports the forget ISM
regained, ISM_k - ISM_after, and the gap itself. The audit's tables derive all three from the jobs' ISM rows
(``with_recovery``). The control is the original model fine-tuned the same way on a retain-validation identity: how
much the same few steps teach about a person that was never forgotten.
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
from .heldout import HELDOUT_RELEARNING
from .probes import AUDIT_SEED_OFFSET, control_identity
from .tables import ORIGINAL
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


def recovery(ism_k: float, ism_after: float, ism_before: float, min_gap: float = 0.0) -> float:
    """(ISM_k - ISM_after) / (ISM_before - ISM_after) where the gap is at least ``min_gap`` (and above 0); 1.0 (full
    recovery: a failure) where the gap is negative; NaN where it is in [0, min_gap): too small to divide by."""
    gap = ism_before - ism_after
    if gap < 0:
        return 1.0
    # relearning recovery (this module's docstring): the share of the gap unlearning opened that fine-tuning closes
    return float((ism_k - ism_after) / gap) if gap >= max(min_gap, 1e-9) else float("nan")


FORGET_RELEARNING = "relearning"  # the forget side's probe (and relearning_heldout:<variant>, not their controls)


def with_recovery(table: pd.DataFrame, min_gap: float) -> pd.DataFrame:
    """The audit table with every forget-side relearning probe's ``recovery`` rows derived again from its ISM rows,
    and ``regained`` (ISM_k - ISM_after) and ``gap`` (ISM_before - ISM_after) rows added at every k: ISM_after is
    the probe's k = 0 ISM, ISM_before the original model's forget ISM on the same identity (its evaluation row, the
    value the audit job divides by). Recovery as ``recovery`` with ``min_gap``. A probe without a k = 0 row cannot
    say what unlearning left: a clear error."""
    forget_side = table["probe"].eq(FORGET_RELEARNING) | table["probe"].str.startswith(f"{HELDOUT_RELEARNING}:")
    derived = forget_side & table["metric"].isin(["recovery", "regained", "gap"])
    ism = table[forget_side & table["metric"].eq("ism")]
    if ism.empty:
        return table
    before = table[table["run"].eq(ORIGINAL) & table["probe"].eq("evaluation") & table["setting"].eq("forget")
                   & table["metric"].eq("ism")].set_index("identity")["value"]
    starts = ism[ism["setting"] == "k=0"].set_index(["run", "identity", "probe"])["value"]
    records = []
    for row in ism.itertuples(index=False):
        key = (row.run, row.identity, row.probe)
        if key not in starts.index:
            raise ValueError(f"relearning rows of run {row.run!r}, identity {row.identity}, probe {row.probe!r} have "
                             "no k=0 measurement: recovery needs the model as given; add 0 to the probe's steps")
        after, original = starts.loc[key], before.get(row.identity, np.nan)
        for metric, value in (("recovery", recovery(row.value, after, original, min_gap)),
                              ("regained", row.value - after), ("gap", original - after)):
            records.append({**row._asdict(), "metric": metric, "value": value, "ci_low": np.nan, "ci_high": np.nan})
    return pd.concat([table[~derived], pd.DataFrame.from_records(records, columns=table.columns)], ignore_index=True)


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
    """Rows of a relearning run: ISM and FA at every k and, for the control (``ism_before`` None), the ISM gain over
    k = 0; the forget side's recovery, regained and gap rows are derived by the audit's tables (``with_recovery``)."""
    if records[0]["k"] != 0:
        raise ValueError(f"relearning probe {probe!r}: the step counts must include 0 (the model as given is the "
                         f"baseline of recovery and gain); got {[r['k'] for r in records]}")
    start = records[0]["ism"]
    rows = []
    for record in records:
        setting = f"k={record['k']}"
        extra = [] if ism_before is not None else [("gain", record["ism"] - start)]
        for metric, value in (("ism", record["ism"]), ("fa", record["fa"]), *extra):
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
