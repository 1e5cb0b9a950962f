"""Rebuild: remove forgotten people the way retraining does, by distilling a mapped teacher into a noised copy.

UNDO (Foote et al. 2025, "Distillation Robustifies Unlearning") moves a model's weights towards random noise,
theta <- (1 - alpha) theta + alpha noise, and distils an unlearned teacher's outputs into that copy; what the
teacher no longer shows cannot be relearned from the copy's weights. Here the teacher is the original generator with
the forget people mapped away (PIU's anchor target), queried only where that mapping is safe:
- at retain identities' conditions (their own real images, noised): its own prediction;
- at forget conditions (Dirichlet mixtures of the forget-train embeddings, PIU Section 3.4) and at attack-found
  conditions (the audit's embedding search run on the original model, every find kept, as STEREO collects attack
  embeddings, Srivatsan et al. 2025): the original's prediction for the forget person's anchor centroid, on noised
  anchor images;
- at the empty prompt (classifier-free dropout): its own unconditional prediction.
No query condition lies within ``near_cosine`` of a forget person's centroid (checked on every query; the record is
kept), and no forget image is ever a student input. One job removes a batch of people together, as the never-trained
reference excludes them together.

Compute is counted in retraining's unit: UNet sample-passes, a forward + backward of one sample = 1, a forward alone
and a search step (backward to the condition only) at their FLOP shares (FlopCounterMode). Retraining the generator
(its config's steps x batch) is 100%.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.nn.functional import normalize
from tqdm.auto import tqdm

from .benchmarks import flop_count
from .conditions import dirichlet_mixtures
from .experiment import real_latents
from .identities import centroid_lookup
from .io import atomic_path, write_json
from .models.generator import IdentityGenerator
from .models.mini import build_mini_generator, save_mini_generator
from .models.pretrain import dropped_conditions, train_denoiser
from .selection import experiment_selections, retain_identity_split
from .unlearning.adversarial import centroid_and_random_starts, search_conditions

log = logging.getLogger(__name__)

RECORD_COLUMNS = ["step", "kind", "source_identity", "query_identity", "max_forget_cosine"]
UNCONDITIONAL = -1  # query_identity of an empty-prompt query


def noised_copy(generator: IdentityGenerator, alpha: float, seed: int) -> IdentityGenerator:
    """The student's start: every weight of the identity encoder and UNet moved to (1 - alpha) theta + alpha theta0
    (UNDO's noising, eq. 1), theta0 a freshly initialised generator of the same architecture (the model's own
    initialisation, seeded by ``seed``). alpha 0: the teacher's weights bit for bit; alpha 1: none of them."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"rebuild alpha {alpha}: the share of noise must lie in [0, 1]")
    arch = getattr(generator, "architecture", None)
    if arch is None:
        raise ValueError("rebuild builds mini generators (generator.backend mini); for Arc2Face it is priced in "
                         "docs/rebuild.md, not run")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        student = build_mini_generator(arch)
    with torch.no_grad():
        for theta, fresh in zip(generator.parameters(), student.parameters()):
            if alpha == 0.0:
                fresh.copy_(theta)
            elif alpha < 1.0:
                fresh.copy_(torch.lerp(theta.detach(), fresh, alpha))
    return student


def joint_selections(labels: pd.DataFrame, centroids: pd.DataFrame, identities: list[int], selection_cfg: dict,
                     seed: int) -> list[dict]:
    """The selection stage's draws (splits, retain-validation identities, same seeds) for removing ``identities``
    together: every anchor drawn among the retain-train identities that are none of them (PIU eq. 6), so that no
    forget person is steered towards another."""
    retain_train, retain_val = retain_identity_split(centroids["identity"].to_numpy(),
                                                     selection_cfg["retain_train_fraction"], seed)
    pool = retain_train[~np.isin(retain_train, identities)]
    return [s.to_dict() for s in experiment_selections(labels, centroids, identities, pool, retain_val,
                                                       selection_cfg, seed)]


@dataclass
class RebuildData:
    """What the rebuild reads: every retained person's real images (the student's inputs) with their embeddings,
    and per forget person (group g) its forget-train embeddings, centroid, anchor and attack-found conditions."""

    retain_images: torch.Tensor  # (N, C, H, W) real images of every identity not removed
    retain_embeddings: np.ndarray  # (N, D)
    retain_identities: np.ndarray  # (N,)
    forget_identities: list[int]  # (G,)
    forget_train: np.ndarray  # (n_f, D) forget-train embeddings (conditions only, never images)
    forget_groups: np.ndarray  # (n_f,) g of each forget_train row
    forget_centroids: np.ndarray  # (G, D) unit
    anchor_identities: list[int]  # (G,)
    anchor_centroids: np.ndarray  # (G, D)
    found: np.ndarray | None = None  # (K, D) attack-found conditions
    found_groups: np.ndarray | None = None  # (K,)

    def max_forget_cosine(self, embeddings: np.ndarray) -> np.ndarray:
        """(n,) each embedding's highest cosine to any forget person's centroid."""
        unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
        return (unit @ self.forget_centroids.T).max(axis=1)


def rebuild_data(selections: list[dict], faces: pd.DataFrame, labels: pd.DataFrame, centroids: pd.DataFrame,
                 manifest: pd.DataFrame, generator: IdentityGenerator, near_cosine: float) -> RebuildData:
    """RebuildData of ``joint_selections``: the retained images are every embedded face of an identity outside the
    forget set (the images retraining without them reads), less any whose embedding lies within ``near_cosine`` of
    a forget centroid (none on the offline world; a look-alike's photo would teach the student the person)."""
    forget = [int(s["forget_identity"]) for s in selections]
    anchors = [int(s["anchor_identity"]) for s in selections]
    if set(anchors) & set(forget):
        raise ValueError(f"anchors {sorted(set(anchors) & set(forget))} are forget identities: build the "
                         "selections with rebuild.joint_selections")
    ok = faces[faces["status"] == "ok"]
    identity = ok["image_id"].map(labels.set_index("image_id")["identity"]).to_numpy()
    embeddings = np.stack(ok["embedding"].to_numpy()).astype(np.float32)
    cents = centroid_lookup(centroids)
    forget_centroids = normalize(torch.tensor(np.stack([cents[f] for f in forget]), dtype=torch.float32)).numpy()
    data = RebuildData(
        retain_images=torch.empty(0), retain_embeddings=embeddings, retain_identities=identity,
        forget_identities=forget, forget_train=np.empty((0, embeddings.shape[1]), np.float32),
        forget_groups=np.empty(0, int), forget_centroids=forget_centroids, anchor_identities=anchors,
        anchor_centroids=np.stack([cents[a] for a in anchors]).astype(np.float32))
    keep = ~np.isin(identity, forget) & (data.max_forget_cosine(embeddings) < near_cosine)
    log.info("rebuild: %d retained images (%d of retained people left out as within cosine %.2f of a forget "
             "person)", keep.sum(), (~np.isin(identity, forget) & ~keep).sum(), near_cosine)
    image_ids = ok["image_id"].to_numpy()[keep]
    data.retain_images = real_latents(generator, manifest, faces, list(image_ids))
    data.retain_embeddings, data.retain_identities = embeddings[keep], identity[keep]
    emb = ok.set_index("image_id")["embedding"]
    data.forget_train = np.stack([emb[i] for s in selections for i in s["forget_train_images"]]).astype(np.float32)
    data.forget_groups = np.repeat(np.arange(len(forget)), [len(s["forget_train_images"]) for s in selections])
    missing = [a for a in anchors if a not in set(data.retain_identities)]
    if missing:
        raise ValueError(f"anchor identities {missing} have no retained image to noise; choose other anchors")
    return data


class PassCounter:
    """Counts UNet sample-passes by kind through forward pre-hooks: ``train`` (the student's forwards under
    autograd: each is followed by its backward to every weight), ``forward`` (any forward without autograd: teacher
    targets, candidate scoring) and ``search`` (the searched model's forwards under autograd: backward to the
    condition only)."""

    def __init__(self, student_unet: torch.nn.Module | None = None, searched_unet: torch.nn.Module | None = None,
                 teacher_unet: torch.nn.Module | None = None):
        self.counts = {"train": 0, "forward": 0, "search": 0}
        roles = [(student_unet, "train"), (searched_unet, "search"), (teacher_unet, None)]
        self.handles = [unet.register_forward_pre_hook(self._hook(role), with_kwargs=True)
                        for unet, role in roles if unet is not None]

    def _hook(self, role: str | None):
        def count(module, args, kwargs):
            kind = role if role is not None and torch.is_grad_enabled() else "forward"
            self.counts[kind] += len(args[0] if args else kwargs["sample"])
        return count

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def unit_weights(generator: IdentityGenerator, batch: int = 2) -> dict:
    """FLOPs of one sample's UNet forward and of a search step, as shares of a training pass (forward + backward to
    every weight), counted by FlopCounterMode on ``generator`` at ``batch`` samples."""
    unet = generator.unet
    shape = (batch, *generator.latent_shape)
    x, t = torch.randn(shape), torch.full((batch,), 500)
    cond = generator.conditions(torch.randn(batch, 8)).detach()

    requires = [p.requires_grad for p in unet.parameters()]
    unet.requires_grad_(True)
    train = flop_count(lambda: generator.predict_noise(x, t, cond).sum().backward(), unet)
    unet.zero_grad(set_to_none=True)
    unet.requires_grad_(False)
    with torch.no_grad():
        forward = flop_count(lambda: generator.predict_noise(x, t, cond), unet)
    cond_leaf = cond.clone().requires_grad_(True)
    # backward to the condition only
    search = flop_count(lambda: generator.predict_noise(x, t, cond_leaf).sum().backward(), unet)
    for p, r in zip(unet.parameters(), requires):
        p.requires_grad_(r)
    return {"train": 1.0, "forward": forward / train, "search": search / train, "train_flops_per_sample": train / batch}


def budget_units(counts: dict, weights: dict) -> float:
    """Sample-passes in retraining's unit: sum over kinds of count x FLOP share (a training pass = 1)."""
    return float(sum(counts[kind] * weights[kind] for kind in counts))


def retrain_units(reference_config: dict) -> int:
    """Retraining's compute in the same unit: the never-trained reference's steps x batch (each a training pass)."""
    training = reference_config["training"]
    return int(training["steps"]) * int(training["batch_size"])


def find_conditions(original: IdentityGenerator, data: RebuildData, forget_latents: list[torch.Tensor], cfg: dict,
                    seed: int, recognizer=None) -> tuple[pd.DataFrame, dict]:
    """The audit's embedding search (unlearning/adversarial.py) on the original model for each forget person, from
    their centroid and random starts: every candidate along every path is a find, to be mapped to the anchor.
    Returns (one row per find: group, identity, restart, step, cosine to the centroid, loss, embedding; the
    search's ledger: its UNet passes by kind and seconds)."""
    original.requires_grad_(False)
    rows, counter = [], PassCounter(searched_unet=original.unet)
    wall, cpu = time.perf_counter(), time.process_time()
    for g, latents in enumerate(tqdm(forget_latents, desc="condition search", unit="person")):
        centre = torch.from_numpy(data.forget_centroids[g])
        gen = torch.Generator().manual_seed(seed + 1000 * g)
        starts, kept = centroid_and_random_starts(centre, cfg, gen)
        for found in search_conditions(original, latents, centre, starts, {**cfg, "min_cosine": None}, gen,
                                       recognizer if cfg["recognizer_weight"] > 0 else None, kept):
            rows.append({"group": g, "identity": data.forget_identities[g], "restart": found["restart"],
                         "step": found["step"], "cosine": found["cosine"], "loss": found["loss"],
                         "embedding": found["embedding"]})
    counter.remove()
    ledger = {"passes": counter.counts, "seconds_wall": time.perf_counter() - wall,
              "seconds_cpu": time.process_time() - cpu}
    return pd.DataFrame(rows), ledger


class MappedTeacher:
    """The original generator with the forget people mapped away: ``predict`` takes each row's query condition
    (already mapped: retain embeddings, anchor centroids, or None for the empty prompt), refuses any within
    ``near_cosine`` of a forget centroid, and records every query."""

    def __init__(self, original: IdentityGenerator, data: RebuildData, near_cosine: float):
        self.original, self.data, self.near = original, data, near_cosine
        self.records: list[dict] = []

    @torch.no_grad()
    def predict(self, x_t: torch.Tensor, t: torch.Tensor, queries: np.ndarray, conditional: np.ndarray,
                kinds: list[str], sources: np.ndarray, query_identities: np.ndarray, step: int) -> torch.Tensor:
        closest = np.full(len(queries), np.nan)
        if conditional.any():
            closest[conditional] = self.data.max_forget_cosine(queries[conditional])
            if np.nanmax(closest) >= self.near:
                raise AssertionError(f"rebuild teacher queried within cosine {np.nanmax(closest):.3f} of a forget "
                                     f"person (limit {self.near}): an unmapped forget condition")
        cond = self.original.conditions(torch.from_numpy(queries))
        cond = dropped_conditions(self.original, cond, torch.from_numpy(~conditional))
        self.records.extend({"step": step, "kind": kind, "source_identity": int(source), "query_identity": int(q),
                             "max_forget_cosine": float(c)}
                            for kind, source, q, c in zip(kinds, sources, query_identities, closest))
        return self.original.predict_noise(x_t, t, cond)


class RebuildBatches:
    """One distillation batch per call (models.pretrain.train_denoiser's ``draw``): ``batch_size`` rows, a
    ``forget_share`` of them mapped (a forget condition or, with probability ``found_share``, an attack find, on a
    noised image of its anchor), the rest retain images with their own embeddings (the empty prompt with
    probability ``cond_dropout``). The target is the mapped teacher's prediction."""

    def __init__(self, data: RebuildData, teacher: MappedTeacher, cfg: dict):
        self.data, self.teacher, self.cfg = data, teacher, cfg
        self.rng = np.random.default_rng(cfg["seed"])
        self.step = 0
        self.anchor_rows = [np.flatnonzero(data.retain_identities == a) for a in data.anchor_identities]
        # passes and seconds of the sessions before this one (a resume, a smaller budget's job), and this one's
        self.carried = {"train": 0, "forward": 0, "seconds_wall": 0.0, "seconds_cpu": 0.0}
        self.counter: PassCounter | None = None
        self.clock = (time.perf_counter(), time.process_time())

    def totals(self) -> dict:
        """Training passes and seconds so far, every session included."""
        live = self.counter.counts if self.counter is not None else {"train": 0, "forward": 0}
        return {"train": self.carried["train"] + live["train"], "forward": self.carried["forward"] + live["forward"],
                "seconds_wall": self.carried["seconds_wall"] + time.perf_counter() - self.clock[0],
                "seconds_cpu": self.carried["seconds_cpu"] + time.process_time() - self.clock[1]}

    def state_dict(self) -> dict:
        record = pd.DataFrame(self.teacher.records, columns=RECORD_COLUMNS)
        return {"numpy_rng": json.dumps(self.rng.bit_generator.state), "step": self.step,
                "ledger": json.dumps(self.totals()),
                "record": {c: torch.tensor(record[c].to_numpy(dtype=np.float64)) for c in RECORD_COLUMNS
                           if c != "kind"}, "record_kind": list(record["kind"])}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = json.loads(state["numpy_rng"])
        self.step = int(state["step"])
        self.carried = json.loads(state["ledger"])
        self.clock = (time.perf_counter(), time.process_time())
        if self.counter is not None:
            self.counter.counts.update(train=0, forward=0)
        columns = {c: v.numpy() for c, v in state["record"].items()}
        self.teacher.records = [
            {"step": int(columns["step"][i]), "kind": kind, "source_identity": int(columns["source_identity"][i]),
             "query_identity": int(columns["query_identity"][i]), "max_forget_cosine": columns["max_forget_cosine"][i]}
            for i, kind in enumerate(state["record_kind"])]

    def _mapped_condition(self, g: int) -> tuple[np.ndarray, str]:
        d, c = self.data, self.cfg
        if d.found is not None and len(d.found) and self.rng.random() < c["found_share"]:
            rows = np.flatnonzero(d.found_groups == g)
            if len(rows):
                return d.found[self.rng.choice(rows)], "found"
        mixture = dirichlet_mixtures(d.forget_train[d.forget_groups == g], 1, self.rng, c["dirichlet_k"],
                                     c["dirichlet_alpha"])
        return mixture[0], "forget"

    def __call__(self, student: IdentityGenerator, gen: torch.Generator):
        d, c = self.data, self.cfg
        self.step += 1
        n_mapped = int(round(c["batch_size"] * c["forget_share"]))
        n_retain = c["batch_size"] - n_mapped
        rows = self.rng.integers(len(d.retain_images), size=n_retain)
        conditional = np.concatenate([self.rng.random(n_retain) >= c["cond_dropout"], np.ones(n_mapped, bool)])
        groups = self.rng.integers(len(d.forget_identities), size=n_mapped)
        mapped = [self._mapped_condition(g) for g in groups]
        anchor_rows = np.array([self.rng.choice(self.anchor_rows[g]) for g in groups], int)
        student_emb = np.concatenate([d.retain_embeddings[rows], *([np.stack([m for m, _ in mapped])]
                                                                    if n_mapped else [])]).astype(np.float32)
        queries = np.concatenate([d.retain_embeddings[rows], d.anchor_centroids[groups]]).astype(np.float32)
        x0 = d.retain_images[np.concatenate([rows, anchor_rows])]
        sched = student.training_scheduler()
        noise = torch.randn(x0.shape, generator=gen)
        t = torch.randint(sched.config.num_train_timesteps, (len(x0),), generator=gen)
        x_t = sched.add_noise(x0, noise, t)
        kinds = ["retain" if keep else "unconditional" for keep in conditional[:n_retain]] + [k for _, k in mapped]
        sources = np.concatenate([d.retain_identities[rows], np.asarray(d.forget_identities)[groups]])
        query_ids = np.concatenate([np.where(conditional[:n_retain], d.retain_identities[rows], UNCONDITIONAL),
                                    np.asarray(d.anchor_identities)[groups]])
        target = self.teacher.predict(x_t, t, queries, conditional, kinds, sources, query_ids, self.step)
        cond = dropped_conditions(student, student.conditions(torch.from_numpy(student_emb)),
                                  torch.from_numpy(~conditional))
        return x_t, t, cond, target


def settings_key(cfg: dict) -> str:
    """A short hash of a rebuild run's settings less its budgets: the resume state of one run serves every budget."""
    return hashlib.sha256(json.dumps({k: v for k, v in cfg.items() if k != "budgets"}, sort_keys=True,
                                     default=str).encode()).hexdigest()[:12]


def search_key(cfg: dict) -> str:
    """A short hash of what a rebuild's condition search depends on: its settings, the seed and the near cosine."""
    return hashlib.sha256(json.dumps([cfg["search"], cfg["seed"], cfg["near_cosine"]], sort_keys=True).encode()
                          ).hexdigest()[:12]


def budget_steps(budget_percent: float, retrain: int, search_units: float, weights: dict, cfg: dict) -> int:
    """Distillation steps that bring the job's sample-passes (the search's included) to ``budget_percent`` of
    retraining's: every step is batch_size training passes and batch_size teacher forwards."""
    per_step = cfg["batch_size"] * (weights["train"] + weights["forward"])
    steps = int(np.floor((budget_percent / 100 * retrain - search_units) / per_step))
    if steps < 1:
        raise ValueError(f"rebuild budget {budget_percent}% of retraining ({retrain} sample-passes) is spent by the "
                         f"condition search alone ({search_units:.0f}); raise the budget or shrink rebuild search")
    return steps


def run_rebuild(original: IdentityGenerator, data: RebuildData, cfg: dict, budget_percent: float, retrain: int,
                search: dict, out_dir: str | Path, state_path: str | Path, provenance: dict) -> dict:
    """Distil the mapped teacher into a noised copy of ``original`` up to ``budget_percent`` of retraining's compute
    (resuming from ``state_path``: a smaller budget's job leaves it there) and save the EMA student in ``out_dir``
    (a mini generator folder whose config.json lists the removed identities and the ledger). ``search``: the
    condition search's ledger (``search_ledger``). Returns the job's ledger: passes by kind, sample-passes in
    retraining's unit, seconds, and the loss history of this session."""
    student = noised_copy(original, cfg["alpha"], cfg["seed"])
    original.requires_grad_(False).eval()
    weights = unit_weights(student)
    steps = budget_steps(budget_percent, retrain, budget_units(search["passes"], weights), weights, cfg)
    teacher = MappedTeacher(original, data, cfg["near_cosine"])
    batches = RebuildBatches(data, teacher, cfg)
    batches.counter = PassCounter(student_unet=student.unet, teacher_unet=original.unet)
    try:
        ema, history = train_denoiser(student, batches, {**cfg, "steps": steps}, state_path, extra_state=batches)
    finally:
        batches.counter.remove()
    trained = batches.totals()
    passes = {kind: trained.get(kind, 0) + search["passes"].get(kind, 0) for kind in ("train", "forward", "search")}
    units = budget_units(passes, weights)
    ledger = {"budget_percent": budget_percent, "steps": steps, "alpha": cfg["alpha"], "passes": passes,
              "unit_weights": weights, "units": units, "retrain_units": retrain,
              "fraction_of_retrain": units / retrain, "identities": len(data.forget_identities),
              "seconds_wall": trained["seconds_wall"] + search["seconds_wall"],
              "seconds_cpu": trained["seconds_cpu"] + search["seconds_cpu"]}
    ledger["seconds_cpu_per_person"] = ledger["seconds_cpu"] / len(data.forget_identities)
    ema.architecture = original.architecture
    save_mini_generator(ema, out_dir, {
        "rebuild": {**ledger, "settings": cfg}, "excluded_identities": sorted(data.forget_identities),
        "anchors": dict(zip(map(str, data.forget_identities), data.anchor_identities)),
        "final": {"step": steps, "loss": history[-1]["loss"] if history else None}, "produced_by": provenance})
    return {**ledger, "history": history}


def query_record(state_path: str | Path) -> pd.DataFrame:
    """The teacher's query record saved with a rebuild's resume state: one row per query."""
    extra = torch.load(state_path, weights_only=True)["extra"]
    frame = pd.DataFrame({c: v.numpy() for c, v in extra["record"].items()})
    frame.insert(1, "kind", extra["record_kind"])
    return frame[RECORD_COLUMNS]


def write_ledger(ledger: dict, path: str | Path) -> None:
    write_json({k: v for k, v in ledger.items() if k != "history"}, path)


def rebuild_settings(rebuild_cfg: dict, name: str) -> dict:
    """A rebuild run's settings: rebuild.defaults with the run's overrides (the search block merged key by key)."""
    runs = rebuild_cfg.get("runs") or {}
    if name not in runs:
        raise ValueError(f"rebuild run {name!r} is not in config key 'rebuild.runs' ({sorted(runs) or 'none'})")
    run = runs[name] or {}
    return {**rebuild_cfg["defaults"], **run, "search": {**rebuild_cfg["defaults"]["search"], **run.get("search", {})}}


def prepare(selections_table: pd.DataFrame, faces: pd.DataFrame, labels: pd.DataFrame, centroids: pd.DataFrame,
            manifest: pd.DataFrame, original: IdentityGenerator, selection_cfg: dict, seed: int, cfg: dict
            ) -> tuple[list[dict], RebuildData]:
    """The joint selections of every forget identity of the selection stage (in its order) and their RebuildData."""
    identities = [int(i) for i in selections_table["forget_identity"]]
    selections = joint_selections(labels, centroids, identities, selection_cfg, seed)
    return selections, rebuild_data(selections, faces, labels, centroids, manifest, original, cfg["near_cosine"])


def search_job(selections: list[dict], data: RebuildData, original: IdentityGenerator, manifest: pd.DataFrame,
               faces: pd.DataFrame, cfg: dict, recognizer=None) -> tuple[pd.DataFrame, dict]:
    """``find_conditions`` on every forget person's forget-train images (the search's input; never the student's)."""
    latents = [real_latents(original, manifest, faces, s["forget_train_images"]) for s in selections]
    return find_conditions(original, data, latents, cfg["search"], cfg["seed"], recognizer)


def with_finds(data: RebuildData, found: pd.DataFrame) -> RebuildData:
    """``data`` with the search's finds as mapped conditions."""
    data.found = np.stack(found["embedding"].to_numpy()).astype(np.float32) if len(found) else None
    data.found_groups = found["group"].to_numpy() if len(found) else None
    return data


def meta_sample_flops(unet_config: dict, cross_attention_tokens: int = 77) -> dict:
    """FLOPs of one sample through a UNet of ``unet_config`` built on the meta device (no weights, no memory, no
    time): a forward, a training pass (forward + backward to every weight) and PIU's surgical training pass
    (backward to the surgical cross-attention weights only), by FlopCounterMode with explicit attention matmuls."""
    from diffusers import UNet2DConditionModel

    from .models.layers import select_trainable

    with torch.device("meta"):
        unet = UNet2DConditionModel(**unet_config)
        size, channels = unet.config.sample_size, unet.config.in_channels
        x, t = torch.empty(1, channels, size, size), torch.full((1,), 500)
        cond = torch.empty(1, cross_attention_tokens, unet.config.cross_attention_dim)

    with torch.no_grad():
        forward = flop_count(lambda: unet(x, t, encoder_hidden_states=cond), unet)
    train = flop_count(lambda: unet(x, t, encoder_hidden_states=cond).sample.sum().backward(), unet)
    unet.requires_grad_(False)
    select_trainable(unet, "surgical")
    surgical = flop_count(lambda: unet(x, t, encoder_hidden_states=cond).sample.sum().backward(), unet)
    return {"forward": forward, "train": train, "surgical_train": surgical}


def paper_price(flops: dict, retrain_samples: float, budgets=(10, 25, 50), people=(1, 12, 100, 1000),
                piu_steps: int = 400, piu_batch: int = 32) -> pd.DataFrame:
    """The rebuild priced at the paper's scale: per person of a batch of N removed together, in PFLOP and in PIU
    jobs. Retraining is ``retrain_samples`` training passes; a rebuild at budget b spends b% of that (a training pass
    and a teacher forward per distilled sample, the search included in the budget); a PIU job (paper recipe) is
    ``piu_steps`` steps of 3 x batch frozen forwards (anchor, forget and retain targets) and 2 x batch surgical
    training passes."""
    piu = piu_steps * (3 * piu_batch * flops["forward"] + 2 * piu_batch * flops["surgical_train"])
    rows = []
    for budget in budgets:
        total = budget / 100 * retrain_samples * flops["train"]
        for n in people:
            rows.append({"budget_percent": budget, "people": n, "pflop_per_person": total / n / 1e15,
                         "piu_jobs_per_person": total / n / piu, "retrain_pflop": retrain_samples * flops["train"]
                         / 1e15, "piu_job_pflop": piu / 1e15})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """`python -m idunlearn.rebuild price`: the rebuild priced for Arc2Face (the SD1.5 UNet) against PIU."""
    import argparse

    from .models.arc2face import sd15_unet_config

    parser = argparse.ArgumentParser(prog="python -m idunlearn.rebuild", description=main.__doc__)
    parser.add_argument("command", choices=["price"])
    parser.add_argument("--retrain-samples", type=float, default=21e6,
                        help="training passes of retraining Arc2Face (default: one epoch of its 21M training faces)")
    parser.add_argument("--budgets", type=int, nargs="+", default=[10, 25, 50])
    parser.add_argument("--people", type=int, nargs="+", default=[1, 12, 100, 1000])
    args = parser.parse_args(argv)
    table = paper_price(meta_sample_flops(sd15_unet_config()), args.retrain_samples, args.budgets, args.people)
    print(table.to_markdown(index=False, floatfmt=".3g"))
    return table


if __name__ == "__main__":
    main()
