"""The unlearning run loop: resumable from its last saved step, saves only the changed parameters."""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ..config import run_loop_settings
from ..io import atomic_path
from ..models.generator import IdentityGenerator
from ..models.layers import select_trainable
from ..models.precision import forward_autocast, training_precision
from .base import ClosedFormMethod, UnlearningData, UnlearningMethod
from .optimisers import build_optimiser

log = logging.getLogger(__name__)


def unlearn(generator: IdentityGenerator, method: UnlearningMethod | ClosedFormMethod, data: UnlearningData,
            cfg: dict, state_path: str | Path, seed: int, teacher: torch.nn.Module | None = None
            ) -> tuple[pd.DataFrame, dict]:
    """Run ``cfg['steps']`` optimisation steps of ``method`` on ``generator`` (in place), or its one closed-form
    edit (a ClosedFormMethod: no optimiser, no resume state, one loss-log row, ``steps`` 1).
    ``teacher``: the frozen UNet whose predictions are the targets; None = a copy of ``generator``'s at the start (a
    sequential step with replay passes the original model's, so that the chain's targets do not drift).

    cfg: steps, regime, surgical_blocks, checkpoint_every, the optimiser's keys, and optionally precision ("fp32",
    the default, or "bf16": models/precision.py). Returns (loss log, timings).
    Every ``checkpoint_every`` steps the trainable weights, optimiser and random states go to ``state_path``;
    a rerun continues from there and ends where an uninterrupted run would. ``data`` with several forget
    identities (joint unlearning) needs a method that can take them (``method.joint``).
    """
    if data.forget_groups is not None and not method.joint:
        raise ValueError(f"method {method.name!r} unlearns one identity per run, not {len(data.anchors())} at once: "
                         "leave it out of joint unlearning (config key 'many.joint_sizes'), or chain it one identity "
                         "at a time (many.sequential_length)")
    cfg = run_loop_settings(method.name, cfg)  # reading a setting the schema does not declare for it fails
    generator.requires_grad_(False)
    trainable = select_trainable(generator.unet, cfg["regime"], cfg["surgical_blocks"])
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    if isinstance(method, ClosedFormMethod):
        return _edit(generator, method, data, trainable, rng)
    teacher = (copy.deepcopy(generator.unet) if teacher is None else teacher).eval().requires_grad_(False)
    optimiser = build_optimiser(list(trainable.values()), cfg)
    rows, step, state_path = [], 0, Path(state_path)
    method.start(seed)
    if state_path.is_file():
        state = torch.load(state_path, weights_only=True)
        generator.unet.load_state_dict(state["trainable"], strict=False)
        optimiser.load_state_dict(state["optimiser"])
        rng.bit_generator.state = state["numpy_rng"]
        gen.set_state(state["torch_rng"])
        method.load_state_dict(state.get("method", {}))  # states saved before methods had one hold none
        rows, step = state["rows"], int(state["step"])
        log.info("resumed at step %d from %s", step, state_path)
    # precision has no schema default (absent: fp32), so that cached runs keep their job parameters
    precision = cfg.get("precision", "fp32")
    generator.unet.train()
    started = time.perf_counter()
    with training_precision(precision, generator.unet, teacher):
        for step in tqdm(range(step + 1, cfg["steps"] + 1), initial=step, total=cfg["steps"], desc=method.name,
                         unit="step"):
            tick = time.perf_counter()
            try:
                with forward_autocast(precision, generator.device):
                    objectives = method.objectives(generator, teacher, data, rng, gen)
                row = optimiser.step(objectives)
            except FloatingPointError as err:  # name the step and what to change
                raise FloatingPointError(f"unlearning step {step} of {cfg['steps']}: {err}; lower config key 'lr' "
                                         f"(now {cfg['lr']}) or set 'grad_clip'") from err
            rows.append({"step": step, **row, "seconds": time.perf_counter() - tick})
            if step % cfg["checkpoint_every"] == 0 and step < cfg["steps"]:
                _save_state(state_path, trainable, optimiser, method, rng, gen, rows, step)
    generator.unet.eval()
    table = pd.DataFrame(rows)
    timings = {"steps": cfg["steps"], "precision": precision,
               "trainable_parameters": int(sum(p.numel() for p in trainable.values())),
               "seconds_this_session": time.perf_counter() - started,
               # every step's time, the sessions before a resume included: the job's cost (a median hides the
               # periodic inner-attack rounds of piu_robust and the like)
               "seconds_total": float(table["seconds"].sum()),
               "seconds_per_step": float(table["seconds"].median()) if len(table) else float("nan")}
    return table, timings


def _edit(generator: IdentityGenerator, method: ClosedFormMethod, data: UnlearningData, trainable: dict,
          rng: np.random.Generator) -> tuple[pd.DataFrame, dict]:
    tick = time.perf_counter()
    row = method.edit(generator, data, trainable, rng)
    seconds = time.perf_counter() - tick
    timings = {"steps": 1, "trainable_parameters": int(sum(p.numel() for p in trainable.values())),
               "seconds_this_session": seconds, "seconds_total": seconds, "seconds_per_step": seconds}
    return pd.DataFrame([{"step": 1, **row, "seconds": seconds}]), timings


def _save_state(path: Path, trainable: dict, optimiser, method: UnlearningMethod, rng, gen, rows, step) -> None:
    state = {"trainable": {k: v.detach().clone() for k, v in trainable.items()}, "optimiser": optimiser.state_dict(),
             "method": method.state_dict(), "numpy_rng": rng.bit_generator.state, "torch_rng": gen.get_state(),
             "rows": rows, "step": step}
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def save_changed_parameters(generator: IdentityGenerator, regime: str, surgical_blocks, path: str | Path) -> None:
    """Only the parameters the run could change (its regime), as safetensors."""
    from ..models.layers import trainable_parameter_names

    names = set(trainable_parameter_names(generator.unet, regime, surgical_blocks))
    tensors = {n: p.detach().contiguous() for n, p in generator.unet.named_parameters() if n in names}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp))


def apply_changed_parameters(generator: IdentityGenerator, path: str | Path) -> IdentityGenerator:
    tensors = load_file(str(path))
    missing = set(tensors) - {n for n, _ in generator.unet.named_parameters()}
    if missing:
        raise ValueError(f"{path} holds parameters this UNet lacks (e.g. {sorted(missing)[:3]}); wrong base model?")
    generator.unet.load_state_dict(tensors, strict=False)
    return generator
