"""Cost of one PIU step: seconds, projected seconds per identity, peak memory and achieved TFLOP/s.

The measured step is the project's own: PIU's objectives (unlearning/piu.py) and the weighted-sum AdamW update
(unlearning/optimisers.py), on the trainable set of a regime (models/layers.py), as runner.unlearn runs them.
``benchmark_optimisers`` compares the optimisers (weighted sum, EUPMU, EUPMU-fast, explicit surgery,
epsilon-constrained) on the same PIU steps: seconds per step, backward passes per step and peak memory.
``profile_breakdown`` splits a step's time into kinds of kernel (attention, convolution, matrix products, ...), so
that what bounds a step on a machine can be read off, not guessed.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import os
import platform
import re
import resource
import statistics
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from diffusers.models.attention_processor import AttnProcessor
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from .config import resolve_run_settings, run_setting_specs
from .models.arc2face import random_arc2face, tiny_arc2face
from .models.generator import IdentityGenerator
from .models.mini import load_mini_generator
from .models.layers import select_trainable
from .models.precision import PRECISIONS, forward_autocast, training_precision
from .unlearning import build_method
from .unlearning.base import UnlearningData
from .unlearning.optimisers import OPTIMISERS, build_optimiser

DTYPES = PRECISIONS  # a benchmark's dtype is the run setting ``precision`` it measures

# paper: random-weight Arc2Face at 64x64 latents; tiny: an Arc2Face-shaped model that runs on a CPU in seconds;
# offline: the shipped mini Arc2Face (the repository's data/shipped/mini-arc2face, the CLI runs from the repository
# root) at the default run's batch and steps.
SHIPPED_MINI = Path("data/shipped/mini-arc2face")


def shipped_mini_generator(seed: int = 0) -> IdentityGenerator:
    """The offline world's generator as the default run loads it (``seed`` unused: the weights are the shipped ones)."""
    return load_mini_generator(SHIPPED_MINI)


PRESETS = {
    "paper": {"build": random_arc2face, "forget_batch": 32, "retain_batch": 32, "projected_steps": 400},
    "tiny": {"build": tiny_arc2face, "forget_batch": 4, "retain_batch": 4, "projected_steps": 400},
    "offline": {"build": shipped_mini_generator, "forget_batch": 8, "retain_batch": 8, "projected_steps": 200},
}


def default_run_settings() -> dict:
    """The unlearning defaults of the config schema (PIU paper recipe: lambda 10, eta 1, AdamW 1e-4, ...); settings
    without a default stay absent, as in a workflow run."""
    return {key: spec["default"] for key, spec in run_setting_specs().items() if "default" in spec}


def random_unlearning_data(dim: int = 512, n_forget: int = 10, n_retain: int = 200, seed: int = 0) -> UnlearningData:
    """Random L2-normalised identity embeddings standing in for a selected experiment."""
    rng = np.random.default_rng(seed)

    def unit(*shape):
        x = rng.standard_normal(shape).astype(np.float32)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    return UnlearningData(forget_train=unit(n_forget, dim), retain_train=unit(n_retain, dim), anchor_centroid=unit(dim))


def machine_info(device: str | torch.device) -> dict:
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = _cpu_model() or platform.processor() or platform.machine()
    return {"device": str(device), "device_name": name, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "float32_matmul_precision": torch.get_float32_matmul_precision(), "python": platform.python_version(),
            "platform": platform.platform()}


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as handle:
            return next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), None)
    except OSError:
        return None


def matmul_tflops(device: str | torch.device, size: int = 2048, repeats: int = 5) -> float:
    """Achieved fp32 TFLOP/s of a dense size x size matrix product on ``device``: the ceiling a step's achieved
    TFLOP/s can be compared with (convolutions and attention at the mini model's small sizes reach less)."""
    device = torch.device(device)
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    a @ b  # warm-up
    _synchronize(device)
    tick = time.perf_counter()
    for _ in range(repeats):
        a @ b
    _synchronize(device)
    return 2 * size ** 3 * repeats / (time.perf_counter() - tick) / 1e12


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _plain_attention(*unets):
    """diffusers' AttnProcessor (explicit matmuls) instead of SDPA, whose CPU kernel FlopCounterMode counts as 0."""
    saved = [unet.attn_processors for unet in unets]
    for unet in unets:
        unet.set_attn_processor(AttnProcessor())
    try:
        yield
    finally:
        for unet, processors in zip(unets, saved):
            unet.set_attn_processor(processors)


def flop_count(run, *unets) -> int:
    """FLOPs of ``run()`` by FlopCounterMode, with explicit attention matmuls in ``unets`` (CPU SDPA counts 0)."""
    with _plain_attention(*unets), FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


def _setup(generator: IdentityGenerator, steps: int, forget_batch: int, retain_batch: int, regime: str,
           device: str | torch.device, dtype: str, warmup: int, settings: dict | None, seed: int):
    """What both benchmarks share, as in runner.unlearn: checked arguments, run settings, random data on the
    device, a frozen teacher copy, the regime's trainable parameters, and the autocast context for ``dtype``
    (as runner.unlearn at run setting ``precision``; bf16 also needs ``training_precision`` around the steps)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is unknown: use one of {', '.join(DTYPES)}")
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0 (got steps={steps}, warmup={warmup})")
    device = torch.device(device)
    cfg = resolve_run_settings({**default_run_settings(), **(settings or {}), "regime": regime,
                                "forget_batch": forget_batch, "retain_batch": retain_batch})
    generator.to(device)
    # embeddings no wider than the encoder (the mini encoder is 256 wide); the encoder zero-pads them to its width
    data = random_unlearning_data(dim=min(512, generator.encoder.width), n_forget=10, n_retain=200, seed=seed)
    generator.requires_grad_(False)
    teacher = copy.deepcopy(generator.unet).eval()
    params = list(select_trainable(generator.unet, regime, cfg["surgical_blocks"]).values())
    return device, cfg, data, teacher, params, partial(forward_autocast, dtype, device)


def _linear_flops(step, forget_batch: int, retain_batch: int, *unets) -> dict:
    """FLOPs of ``step(forget_batch, retain_batch)`` without a step at that batch: FlopCounterMode on steps at batches
    (1, 1), (2, 1) and (1, 2), extrapolated linearly (a step's work is per forget sample, per retain sample, plus a
    fixed part such as the optimiser update). The counted steps use explicit attention (SDPA's CPU kernel counts as
    0), whose score matrices at the paper batch (64 samples x 4096 latent tokens) outgrow a 140 GB GPU."""

    def counted(n_forget: int, n_retain: int) -> int:
        return flop_count(lambda: step(n_forget, n_retain))

    with _plain_attention(*unets):  # once around the three counts
        base = counted(1, 1)
        per_forget, per_retain = counted(2, 1) - base, counted(1, 2) - base
    return {"flops_per_step": int(base + (forget_batch - 1) * per_forget + (retain_batch - 1) * per_retain),
            "flops_per_sample": {"base_1_1": int(base), "forget": int(per_forget), "retain": int(per_retain)}}


# kinds of kernel a step's time is split into, as regular expressions on profiler op names (first match wins; the
# rest is "other": pointwise ops, norms, autograd bookkeeping, Python and profiler overhead)
KERNEL_KINDS = (
    ("attention backward", r"scaled_dot_product.*backward"),
    ("attention forward", r"scaled_dot_product"),
    ("convolution backward", r"convolution_backward"),
    ("convolution forward", r"convolution|conv2d"),
    ("matrix products", r"^aten::(mm|addmm|bmm|baddbmm)$"),
    ("casts and copies", r"^aten::(copy_|_to_copy|clone)$"),
)


def kernel_kind(op_name: str) -> str:
    """The kind of kernel a profiler op name belongs to (KERNEL_KINDS), or "other"."""
    return next((kind for kind, pattern in KERNEL_KINDS if re.search(pattern, op_name)), "other")


def profile_breakdown(step, steps: int, projected_steps: int) -> dict:
    """Run ``step()`` ``steps`` times under torch.profiler and split the CPU time by kernel kind, per step and
    projected to ``projected_steps``: each op's self time counts once, so the kinds add up to the profiled total
    (the profiler's own overhead lands in "other")."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    seconds = dict.fromkeys([kind for kind, _ in KERNEL_KINDS] + ["other"], 0.0)
    for event in prof.key_averages():
        seconds[kernel_kind(event.key)] += event.self_cpu_time_total / 1e6 / steps
    total = sum(seconds.values())
    return {"profiled_steps": steps, "seconds_per_step": seconds, "profiled_seconds_per_step": total,
            "share": {kind: value / total for kind, value in seconds.items()},
            "projected_seconds_per_identity": {kind: value * projected_steps for kind, value in seconds.items()}}


def benchmark_piu(generator: IdentityGenerator, steps: int, forget_batch: int, retain_batch: int,
                  regime: str = "surgical", device: str | torch.device = "cuda", dtype: str = "fp32",
                  compile: bool = False, *, warmup: int = 1, projected_steps: int = 400,
                  settings: dict | None = None, seed: int = 0, profile_steps: int = 0) -> dict:
    """Time ``steps`` PIU steps (after ``warmup`` untimed ones) on ``generator``, which is trained in place.

    dtype "bf16": as the run setting precision bf16 (models/precision.py: bf16 autocast around the forward passes,
    attention in fp32, parameters and AdamW state fp32). ``settings``: PIU and
    optimiser settings (default: the config schema's unlearning defaults). FLOPs come from FlopCounterMode on
    steps at batches (1, 1), (2, 1) and (1, 2), extrapolated linearly (``_linear_flops``); text-encoder SDPA
    attention is not counted on CPU (<1% of a step).
    ``profile_steps`` > 0: that many more steps under the profiler, their time split by kernel kind
    (``profile_breakdown``), with each kind's seconds projected to ``projected_steps``.
    """
    if profile_steps and torch.device(device).type != "cpu":  # the CPU profiler does not see GPU kernels' time
        raise ValueError(f"profile_steps splits CPU time only: run it with device cpu, not {device}")
    device, cfg, data, teacher, params, autocast = _setup(generator, steps, forget_batch, retain_batch, regime,
                                                          device, dtype, warmup, settings, seed)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    optimiser = build_optimiser(params, cfg)
    generator.unet.train()

    def step(n_forget: int, n_retain: int) -> None:
        method = build_method(cfg["method"], {**cfg, "forget_batch": n_forget, "retain_batch": n_retain})
        with autocast():
            objectives = method.objectives(generator, teacher, data, rng, gen)
        optimiser.step(objectives)

    flops = _linear_flops(step, forget_batch, retain_batch, generator.unet, teacher)

    seconds = []
    with training_precision(dtype, generator.unet, teacher):
        if compile:
            generator.unet.compile()  # in place: parameter names (and so the trainable set) are unchanged
            teacher.compile()
        for _ in range(warmup):
            step(forget_batch, retain_batch)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(steps):
            _synchronize(device)
            tick = time.perf_counter()
            step(forget_batch, retain_batch)
            _synchronize(device)
            seconds.append(time.perf_counter() - tick)
        breakdown = (profile_breakdown(partial(step, forget_batch, retain_batch), profile_steps, projected_steps)
                     if profile_steps else None)
    generator.unet.eval()

    if device.type == "cuda":
        peak, peak_source = torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated, timed steps"
    else:  # Linux reports kilobytes; the peak covers the whole process (model building included)
        peak, peak_source = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "ru_maxrss, process lifetime"
    per_step = statistics.median(seconds)
    return {
        "regime": regime, "forget_batch": forget_batch, "retain_batch": retain_batch, "dtype": dtype,
        "compile": compile, "warmup_steps": warmup, "timed_steps": steps, "seconds_per_step": per_step,
        "seconds_per_step_all": seconds, "projected_steps": projected_steps,
        "projected_seconds_per_identity": per_step * projected_steps, "peak_memory_bytes": int(peak),
        "peak_memory_source": peak_source, **flops,
        "achieved_tflops": flops["flops_per_step"] / per_step / 1e12, "reference_matmul_tflops": matmul_tflops(device),
        "unet_parameters": sum(p.numel() for p in generator.unet.parameters()),
        "trainable_parameters": sum(p.numel() for p in params),
        "settings": {k: cfg[k] for k in ("method", "optimiser", "eta", "lambda", "lr", "weight_decay")},
        "machine": machine_info(device), "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        **({"profile": breakdown} if breakdown else {}),
    }


def benchmark_preset(preset: str, steps: int, device: str | torch.device = "cuda", dtype: str = "fp32",
                     compile: bool = False, *, warmup: int = 1, forget_batch: int | None = None,
                     retain_batch: int | None = None, regime: str = "surgical", projected_steps: int | None = None,
                     seed: int = 0, profile_steps: int = 0) -> dict:
    """Build a preset's random-weight generator and benchmark it; the preset's batches unless given."""
    spec = _preset(preset)
    result = benchmark_piu(spec["build"](seed=seed), steps, forget_batch or spec["forget_batch"],
                           retain_batch or spec["retain_batch"], regime, device, dtype, compile, warmup=warmup,
                           projected_steps=projected_steps or spec["projected_steps"], seed=seed,
                           profile_steps=profile_steps)
    return {"preset": preset, **result}


def _preset(preset: str) -> dict:
    try:
        return PRESETS[preset]
    except KeyError:
        raise ValueError(f"benchmark preset {preset!r} is unknown: use one of {', '.join(PRESETS)}") from None


# the comparison: PIU's weighted sum, EUPMU, EUPMU-fast, explicit surgery and epsilon-constrained
OPTIMISER_COMPARISON = ("weighted_sum", "eupmu", "eupmu_fast", "unilateral_surgery", "epsilon_constrained")


class _MemoryProbe:
    """Peak memory of one step: CUDA allocator statistics, or on Linux the process's peak RSS reset per step."""

    def __init__(self, device: torch.device):
        self.device = device
        if device.type == "cuda":
            self.source = "torch.cuda.max_memory_allocated per step"
        elif os.path.exists("/proc/self/clear_refs"):
            self.source = "peak RSS per step (VmHWM reset through /proc/self/clear_refs); approximate"
        else:
            self.source = "unavailable"

    def start(self) -> int | None:
        """Reset the peak; return the memory in use now."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return torch.cuda.memory_allocated(self.device)
        if self.source == "unavailable":
            return None
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # resets VmHWM to the current RSS
        return self._status("VmRSS")

    def peak(self) -> int | None:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        return None if self.source == "unavailable" else self._status("VmHWM")

    @staticmethod
    def _status(field: str) -> int:
        with open("/proc/self/status") as handle:
            line = next(line for line in handle if line.startswith(field + ":"))
        return int(line.split()[1]) * 1024  # kB


def benchmark_optimisers(generator: IdentityGenerator, steps: int, forget_batch: int, retain_batch: int,
                         optimisers: tuple[str, ...] = OPTIMISER_COMPARISON, regime: str = "surgical",
                         device: str | torch.device = "cuda", dtype: str = "fp32", *, warmup: int = 1,
                         settings: dict | None = None, seed: int = 0) -> dict:
    """Cost per step of each optimiser on the same model, batches and steps, in one process.

    Every optimiser starts from ``generator``'s weights and draws the same batches (its own random streams from
    ``seed``); the optimisers take turns step by step, each round starting with the next one, so that changing load
    on the machine hits them alike. Between turns each optimiser's trainable weights wait in a copy; swapping them
    and clearing gradients is not timed; each optimiser's first step is untimed. FLOPs per step, a load-independent
    measure of the extra work, are those of each optimiser's first step from the initial weights, counted at small
    batches and extrapolated (``_linear_flops``, as ``benchmark_piu``). The generator's weights are restored at the
    end. Reported per optimiser: median seconds per step, FLOPs per step (with the per-sample parts) and their
    ratios to ``weighted_sum``, backward and extra forward passes per step (as the optimiser counts them), the peak
    memory of a step and its rise over the memory in use before the step.
    """
    unknown = [name for name in optimisers if name not in OPTIMISERS]
    if unknown or not optimisers:
        raise ValueError(f"optimisers {unknown} are unknown: use some of {', '.join(OPTIMISERS)}")
    device, cfg, data, teacher, params, autocast = _setup(generator, steps, forget_batch, retain_batch, regime,
                                                          device, dtype, warmup, settings, seed)
    initial = [p.detach().clone() for p in params]
    method = build_method(cfg["method"], cfg)
    # each optimiser with its own run-dependent defaults (weight decay), unless ``settings`` fixes them
    own = {name: resolve_run_settings({**default_run_settings(), **(settings or {}), "optimiser": name})
           for name in optimisers}
    runs = {name: {"optimiser": build_optimiser(params, own[name]),
                   "weights": [w.clone() for w in initial], "rng": np.random.default_rng(seed),
                   "gen": torch.Generator().manual_seed(seed), "rows": [], "seconds": [], "peak": [], "rise": []}
            for name in optimisers}
    probe = _MemoryProbe(device)
    generator.unet.train()

    def load(weights) -> None:
        with torch.no_grad():
            for param, weight in zip(params, weights):
                param.copy_(weight)
                param.grad = None

    def first_step(name: str, n_forget: int, n_retain: int) -> None:
        """``name``'s first step at this batch: initial weights, a fresh optimiser, streams from ``seed``."""
        load(initial)
        at_batch = build_method(cfg["method"], {**cfg, "forget_batch": n_forget, "retain_batch": n_retain})
        with autocast():
            objectives = at_batch.objectives(generator, teacher, data, np.random.default_rng(seed),
                                             torch.Generator().manual_seed(seed))
        build_optimiser(params, own[name]).step(objectives)

    for name, run in runs.items():
        run.update(_linear_flops(partial(first_step, name), forget_batch, retain_batch, generator.unet, teacher))
    with training_precision(dtype, generator.unet, teacher):
        for turn in range(1 + warmup + steps):  # turn 0 and the warmup turns are untimed
            for name in optimisers[turn % len(optimisers):] + optimisers[:turn % len(optimisers)]:
                run = runs[name]
                load(run["weights"])
                _synchronize(device)
                before = probe.start()
                tick = time.perf_counter()
                with autocast():
                    objectives = method.objectives(generator, teacher, data, run["rng"], run["gen"])
                row = run["optimiser"].step(objectives)
                del objectives
                _synchronize(device)
                seconds, peak = time.perf_counter() - tick, probe.peak()
                with torch.no_grad():
                    for weight, param in zip(run["weights"], params):
                        weight.copy_(param)
                run["rows"].append(row)
                if turn > warmup:
                    run["seconds"].append(seconds)
                    run["peak"].append(peak)
                    run["rise"].append(None if peak is None else peak - before)
    load(initial)
    generator.unet.eval()

    results = {}
    for name, run in runs.items():
        timed = run["rows"][1 + warmup:]
        results[name] = {
            "seconds_per_step": statistics.median(run["seconds"]), "seconds_per_step_all": run["seconds"],
            "flops_per_step": run["flops_per_step"], "flops_per_sample": run["flops_per_sample"],
            "backward_passes_per_step": statistics.mean(r["backward_passes"] for r in timed),
            "extra_forward_passes_per_step": statistics.mean(r.get("extra_forward_passes", 0) for r in timed),
            "peak_memory_bytes": None if run["peak"][0] is None else max(run["peak"]),
            "step_memory_rise_bytes": None if run["rise"][0] is None else max(run["rise"]),
            # identical across optimisers: same weights and batch at the first step
            "first_step_losses": {k: run["rows"][0][k] for k in ("forget_loss", "retain_loss")},
            "last_row": run["rows"][-1]}
    if "weighted_sum" in results:
        reference = results["weighted_sum"]
        for result in results.values():
            result["time_vs_weighted_sum"] = result["seconds_per_step"] / reference["seconds_per_step"]
            result["flops_vs_weighted_sum"] = result["flops_per_step"] / reference["flops_per_step"]
    return {
        "optimisers": results, "regime": regime, "forget_batch": forget_batch, "retain_batch": retain_batch,
        "dtype": dtype, "warmup_steps": warmup, "timed_steps": steps, "memory_source": probe.source,
        "unet_parameters": sum(p.numel() for p in generator.unet.parameters()),
        "trainable_parameters": sum(p.numel() for p in params),
        "settings": {k: v for k, v in cfg.items() if k == "method" or k.startswith(("eupmu_", "epsilon"))},
        "machine": machine_info(device), "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def benchmark_optimisers_preset(preset: str, steps: int, device: str | torch.device = "cuda", dtype: str = "fp32",
                                optimisers: tuple[str, ...] = OPTIMISER_COMPARISON, *, warmup: int = 1,
                                forget_batch: int | None = None, retain_batch: int | None = None,
                                regime: str = "surgical", seed: int = 0) -> dict:
    """Build a preset's random-weight generator and compare the optimisers on it; the preset's batches unless given."""
    spec = _preset(preset)
    result = benchmark_optimisers(spec["build"](seed=seed), steps, forget_batch or spec["forget_batch"],
                                  retain_batch or spec["retain_batch"], tuple(optimisers), regime, device, dtype,
                                  warmup=warmup, seed=seed)
    return {"preset": preset, **result}
