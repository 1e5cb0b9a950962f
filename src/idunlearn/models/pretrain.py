"""Training the mini Arc2Face the way Arc2Face was trained: denoising faces conditioned on their own identity
embedding, with classifier-free dropout to the empty prompt, EMA weights, and resumable chunks."""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from ..io import atomic_path
from .generator import IdentityGenerator

log = logging.getLogger(__name__)


def faces_to_training_images(aligned: np.ndarray, size: int, channels: int) -> torch.Tensor:
    """Aligned 112x112 RGB uint8 faces -> (N, channels, size, size) float in [-1, 1] (area-averaged downsizing)."""
    mode = "L" if channels == 1 else "RGB"
    small = [np.asarray(Image.fromarray(face).convert(mode).resize((size, size), Image.BOX)) for face in aligned]
    x = torch.from_numpy(np.stack(small)).float().div(127.5).sub(1)
    return x[:, None] if channels == 1 else x.permute(0, 3, 1, 2)


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # (x_t, t, conditions, target noise)


def denoising_batches(images: torch.Tensor, embeddings: torch.Tensor, batch_size: int, cond_dropout: float
                      ) -> Callable[[IdentityGenerator, torch.Generator], Batch]:
    """The pretraining batch: real faces noised at uniform timesteps, each conditioned on its own embedding (the
    empty prompt with probability ``cond_dropout``: classifier-free guidance), the target being the added noise."""

    def draw(generator: IdentityGenerator, rng: torch.Generator) -> Batch:
        sched = generator.training_scheduler()
        idx = torch.randint(len(images), (batch_size,), generator=rng)
        x0, emb = images[idx], embeddings[idx]
        noise = torch.randn(x0.shape, generator=rng)
        t = torch.randint(sched.config.num_train_timesteps, (len(x0),), generator=rng)
        drop = torch.rand(len(x0), generator=rng) < cond_dropout
        return sched.add_noise(x0, noise, t), t, dropped_conditions(generator, generator.conditions(emb), drop), noise

    return draw


def dropped_conditions(generator: IdentityGenerator, cond: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """``cond`` with the rows where ``drop`` holds replaced by the empty prompt's (classifier-free dropout)."""
    if not drop.any():
        return cond
    return torch.where(drop[:, None, None], generator.unconditional(1).expand_as(cond), cond)


def pretrain(generator: IdentityGenerator, images: torch.Tensor, embeddings: torch.Tensor, cfg: dict,
             state_path: str | Path, monitor: Callable[[IdentityGenerator, int], dict] | None = None) -> tuple:
    """Train for ``cfg['steps']`` steps on ``denoising_batches``; resumes from ``state_path`` if it holds a saved step.

    cfg: steps, batch_size, lr, weight_decay, ema_decay, cond_dropout, seed, checkpoint_every, monitor_every.
    Returns (EMA generator, history rows).
    """
    return train_denoiser(generator, denoising_batches(images, embeddings, cfg["batch_size"], cfg["cond_dropout"]),
                          cfg, state_path, monitor)


def ema_decay_at(cfg: dict, step: int) -> float:
    """The EMA decay after ``step`` updates: ``ema_decay``, or with ``ema_warmup`` min(ema_decay, (1 + step) /
    (10 + step)) (the warm-up of diffusers' EMAModel), so that a short run's average does not keep its start."""
    if not cfg.get("ema_warmup", False):
        return cfg["ema_decay"]
    return min(cfg["ema_decay"], (1 + step) / (10 + step))


def train_denoiser(generator: IdentityGenerator, draw: Callable[[IdentityGenerator, torch.Generator], Batch],
                   cfg: dict, state_path: str | Path, monitor: Callable[[IdentityGenerator, int], dict] | None = None,
                   after_step: Callable[[IdentityGenerator, int], None] | None = None, extra_state=None) -> tuple:
    """The denoiser training loop shared by pretraining and rebuilding: ``cfg['steps']`` AdamW steps on
    MSE(prediction, target) over batches ``draw(generator, rng)`` returns, an EMA copy, resumable chunks.

    ``after_step(ema, step)`` runs after every step (the rebuild saves budget checkpoints there); ``extra_state``
    (an object with state_dict / load_state_dict: the rebuild's query record) is saved and restored with the rest.
    Returns (EMA generator, history rows)."""
    state_path = Path(state_path)
    opt = torch.optim.AdamW(generator.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    ema = copy.deepcopy(generator).requires_grad_(False)
    rng = torch.Generator().manual_seed(cfg["seed"])
    step, history = 0, []
    if state_path.is_file():
        state = torch.load(state_path, weights_only=True)
        generator.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["optimizer"])
        rng.set_state(state["rng"])
        step, history = int(state["step"]), [dict(zip(state["history_keys"], row)) for row in state["history"].tolist()]
        if extra_state is not None:
            extra_state.load_state_dict(state["extra"])
        log.info("resumed denoiser training at step %d", step)
    generator.train()
    bar = tqdm(total=cfg["steps"], initial=step, desc="train generator", unit="step")
    while step < cfg["steps"]:
        start = time.perf_counter()
        x_t, t, cond, target = draw(generator, rng)
        # epsilon-prediction denoising loss (DDPM, Ho et al. 2020, eq. 14), as Arc2Face/SD are trained; against a
        # teacher's prediction instead of the noise, the distillation loss of the rebuild (UNDO, Foote et al. 2025)
        loss = torch.nn.functional.mse_loss(generator.predict_noise(x_t, t, cond), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        decay = ema_decay_at(cfg, step)
        with torch.no_grad():
            for p_ema, p in zip(ema.parameters(), generator.parameters()):
                p_ema.lerp_(p, 1 - decay)
        step += 1
        row = {"step": step, "loss": float(loss.detach()), "seconds": time.perf_counter() - start}
        if monitor and (step % cfg["monitor_every"] == 0 or step == cfg["steps"]):
            row.update(monitor(ema, step))
            log.info("step %d: %s", step, row)
        history.append(row)
        bar.update(1)
        if after_step is not None:
            after_step(ema, step)
        if step % cfg["checkpoint_every"] == 0 or step == cfg["steps"]:
            _save_state(state_path, generator, ema, opt, rng, step, history, extra_state)
    bar.close()
    return ema.eval(), history


def _save_state(path: Path, generator, ema, opt, rng, step: int, history: list[dict], extra_state=None) -> None:
    keys = sorted({k for row in history for k in row})
    table = torch.tensor([[float(row.get(k, np.nan)) for k in keys] for row in history], dtype=torch.float64)
    with atomic_path(path) as tmp:
        torch.save({"model": generator.state_dict(), "ema": ema.state_dict(), "optimizer": opt.state_dict(),
                    "rng": rng.get_state(), "step": step, "history": table, "history_keys": keys,
                    **({"extra": extra_state.state_dict()} if extra_state is not None else {})}, tmp)


def training_faces(faces, labels=None, exclude_identities=()):
    """The embedded faces the generator trains on: every detected face, less those of ``exclude_identities``
    (identity ids of ``labels``, identities/labels.parquet), so that an excluded person's images are never read."""
    ok = faces[faces["status"] == "ok"]
    exclude = {int(i) for i in exclude_identities}
    if not exclude:
        return ok
    if labels is None:
        raise ValueError("exclude_identities needs the identity labels (identities/labels.parquet)")
    identity = labels.set_index("image_id")["identity"]
    unknown = sorted(exclude - set(identity.astype(int)))
    if unknown:
        raise ValueError(f"exclude_identities: {unknown} are no identity of identities/labels.parquet; "
                         "name identities that the clustering found")
    return ok[~ok["image_id"].map(identity).isin(exclude).to_numpy()]


def train_mini_generator(manifest, faces, arch: dict, cfg: dict, out_dir, state_path,
                         monitor: Callable | None = None, labels=None, exclude_identities=(),
                         provenance: dict | None = None) -> list[dict]:
    """Train the mini Arc2Face on every embedded face (less ``exclude_identities``: the never-trained reference) and
    save it (EMA weights) with its config, history and, when given, ``provenance``.

    Every ``monitor_every`` steps ``monitor(ema, step)`` returns metrics to log (the workflow passes
    ``evaluation.generation.identity_monitor``: ISM and nearest-centroid accuracy of one sample per identity).
    """
    from ..faces.analyser import aligned_crops
    from .mini import build_mini_generator, save_mini_generator

    torch.manual_seed(cfg["seed"])
    ok = training_faces(faces, labels, exclude_identities)
    paths = manifest.set_index("image_id").loc[ok["image_id"], "path"]
    images = faces_to_training_images(aligned_crops(paths, ok["landmarks"]), arch["image_size"], arch["channels"])
    embeddings = torch.tensor(np.stack(ok["embedding"].to_numpy()), dtype=torch.float32)
    generator = build_mini_generator(arch)
    ema, history = pretrain(generator, images, embeddings, cfg, state_path, monitor)
    ema.architecture = generator.architecture
    info = {"training": cfg, "images": len(images),
            "final": {k: v for k, v in history[-1].items() if k != "seconds"}}
    if exclude_identities:
        info["excluded_identities"] = sorted(int(i) for i in exclude_identities)
    save_mini_generator(ema, out_dir, {**info, **({"produced_by": provenance} if provenance else {})})
    return history
