"""The PIU step benchmark on the tiny preset (CPU, seconds): sane numbers and a complete JSON record.

No timing assertions: the numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

import idunlearn.benchmarks as benchmarks
from idunlearn.bench_cli import main
from idunlearn.benchmarks import (
    OPTIMISER_COMPARISON, _plain_attention, _setup, benchmark_optimisers, benchmark_optimisers_preset, benchmark_piu,
    benchmark_preset, default_run_settings, kernel_kind,
)
from idunlearn.config import resolve_run_settings
from idunlearn.models.arc2face import tiny_arc2face
from idunlearn.models.mini import build_mini_generator
from idunlearn.unlearning import build_method
from idunlearn.unlearning.optimisers import build_optimiser

# a UNet far smaller than the tiny preset's, 16 px so that training steps at batch 1 can group-norm its deepest maps
SMALL_UNET = {"image_size": 16, "text_width": 32, "text_heads": 2, "block_out_channels": [32, 32, 32, 32],
              "layers_per_block": 1}


def test_tiny_preset_through_the_cli_writes_a_sane_record(tmp_path):
    output = main(["--preset", "tiny", "--steps", "2", "--device", "cpu", "--output", str(tmp_path / "piu.json")])
    result = json.loads(output.read_text())
    assert result["preset"] == "tiny" and result["timed_steps"] == len(result["seconds_per_step_all"]) == 2
    assert result["seconds_per_step"] > 0
    assert result["projected_seconds_per_identity"] == pytest.approx(result["seconds_per_step"] * 400)
    assert result["flops_per_step"] > 0 and result["achieved_tflops"] > 0 and result["reference_matmul_tflops"] > 0
    assert result["peak_memory_bytes"] > 0
    assert 0 < result["trainable_parameters"] < result["unet_parameters"]
    assert {"torch", "device_name", "cpu_count"} <= set(result["machine"]) and result["machine"]["device"] == "cpu"
    assert result["date"] and result["command"] and result["arguments"]["preset"] == "tiny"


def test_bf16_autocast_keeps_fp32_master_weights_and_counts_the_same_flops():
    fp32 = benchmark_piu(tiny_arc2face(), 1, 2, 2, device="cpu", dtype="fp32", warmup=0)
    generator = tiny_arc2face()
    bf16 = benchmark_piu(generator, 1, 2, 2, device="cpu", dtype="bf16", warmup=0)
    assert bf16["seconds_per_step"] > 0 and bf16["flops_per_step"] == fp32["flops_per_step"] > 0
    assert all(p.dtype == torch.float32 for p in generator.unet.parameters())


def test_unknown_dtype_is_rejected():
    with pytest.raises(ValueError, match="bf16"):
        benchmark_piu(tiny_arc2face(), 1, 1, 1, device="cpu", dtype="fp16")



def test_offline_preset_runs_the_shipped_mini_generator_with_embeddings_it_can_take():
    # the mini encoder is 256 wide: the benchmark's random embeddings must not be wider
    result = benchmark_preset("offline", 1, "cpu", forget_batch=1, retain_batch=1, warmup=0)
    assert result["preset"] == "offline" and result["projected_steps"] == 200 and result["flops_per_step"] > 0


def test_phase_two_tracking_through_the_cli(tmp_path):
    from idunlearn.__main__ import main as idunlearn_main

    output = tmp_path / "phase_two.json"
    idunlearn_main(["benchmark-phase-two", "--steps", "10", "--batch", "1", "--betas", "1", "0.1",
                    "--output", str(output)])
    rows = json.loads(output.read_text())["rows"]
    assert [row["beta"] for row in rows] == [1.0, 0.1] and len({row["epsilon"] for row in rows}) == 1
    for row in rows:  # the distance and violation are those of the run's own end and bound
        assert row["spacing"] > 0 and len(row["f1_by_tenth"]) == len(row["original_f1_by_tenth"]) == 10
        assert row["spacings_from_bound"] == pytest.approx(abs(row["f1_end"] - row["epsilon"]) / row["spacing"])
        assert row["violation"] == pytest.approx(max(row["f1_end"] - row["epsilon"], 0.0))
        # first_step bounds f1 itself: both distances are one
        assert row["bounded"] == "forget_loss" and row["spacings_from_f1_bound"] == pytest.approx(
            row["spacings_from_bound"])
        if row["first_step_at_bound"] is None:  # never at the bound: f1 stayed above epsilon on every batch
            assert row["f1_end"] > row["epsilon"]
        else:
            assert 1 <= row["first_step_at_bound"] <= 10 and 0 <= row["eta_zero_share_after"] <= 1
    # f1 at the end is the mean of the last tenth of the steps (the last step here)
    assert rows[0]["f1_end"] == pytest.approx(rows[0]["f1_by_tenth"][-1])


@pytest.mark.parametrize("name, kind", [
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention forward"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention backward"),
    ("aten::mkldnn_convolution", "convolution forward"),
    ("aten::convolution_backward", "convolution backward"),
    ("aten::addmm", "matrix products"),
    ("aten::mm", "matrix products"),
    ("aten::mul", "other"),
    ("aten::mm_backward_out", "other"),  # the matrix-product names match whole, not as a prefix
    ("aten::_to_copy", "casts and copies"),
    ("aten::native_group_norm", "other"),
])
def test_profiler_op_names_fall_into_their_kernel_kind(name, kind):
    assert kernel_kind(name) == kind


def test_profiled_step_splits_into_kinds_that_add_up_and_see_attention_and_convolution():
    result = benchmark_piu(tiny_arc2face(), 1, 2, 2, device="cpu", warmup=0, projected_steps=10, profile_steps=2)
    profile = result["profile"]
    seconds = profile["seconds_per_step"]
    assert sum(seconds.values()) == pytest.approx(profile["profiled_seconds_per_step"])
    assert sum(profile["share"].values()) == pytest.approx(1.0)
    # the tiny UNet has convolutions and attention: both kinds must be found, forward and backward
    for kind in ("attention forward", "attention backward", "convolution forward", "convolution backward",
                 "matrix products"):
        assert seconds[kind] > 0, kind
    assert profile["projected_seconds_per_identity"]["other"] == pytest.approx(seconds["other"] * 10)


def test_profile_is_refused_off_the_cpu():
    with pytest.raises(ValueError, match="device cpu"):
        benchmark_piu(tiny_arc2face(), 1, 1, 1, device="meta", warmup=0, profile_steps=1)


# --- optimiser benchmark: FLOPs from small batches, extrapolated ----------------------------------------------------

class _LargestTensor(TorchDispatchMode):
    """Bytes of the largest tensor any op returns while active."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sizes = [t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.bytes = max([self.bytes, *sizes])
        return out


def test_optimiser_flops_at_the_paper_batch_need_no_more_memory_than_at_one_plus_one(monkeypatch):
    """The paper preset's batches (32 + 32) on a small UNet: the FLOP counting (the only place with explicit
    attention, whose scores outgrew a 140 GB GPU at the paper batch) must hold no larger tensor than at 1 + 1."""
    largest = []

    class CountingWithProbe(FlopCounterMode):  # what the benchmark counts under, with a probe on every op
        def __enter__(self):
            self.probe = _LargestTensor()
            result = super().__enter__()
            self.probe.__enter__()
            return result

        def __exit__(self, *args):
            self.probe.__exit__(*args)
            largest.append(self.probe.bytes)
            return super().__exit__(*args)

    monkeypatch.setattr(benchmarks, "FlopCounterMode", CountingWithProbe)
    monkeypatch.setitem(benchmarks.PRESETS, "paper", {**benchmarks.PRESETS["paper"],
                                                      "build": lambda seed: build_mini_generator(SMALL_UNET)})
    peaks, counted_steps = {}, {}
    for batch in (None, 1):  # None: the preset's 32 + 32
        largest.clear()
        record = benchmark_optimisers_preset("paper", 1, "cpu", optimisers=("weighted_sum",), warmup=0,
                                             forget_batch=batch, retain_batch=batch)
        assert record["forget_batch"] == record["retain_batch"] == (batch or 32)
        assert record["optimisers"]["weighted_sum"]["flops_per_step"] > 0
        peaks[batch], counted_steps[batch] = max(largest), len(largest)
    assert peaks[None] <= peaks[1]
    assert counted_steps == {None: 3, 1: 3}  # batches (1, 1), (2, 1), (1, 2) whatever the batch


def _first_step_flops_at_full_batch(generator, optimiser: str, forget_batch: int, retain_batch: int) -> int:
    """FlopCounterMode (explicit attention) on one optimiser's first step run at the whole batch itself."""
    _, cfg, data, teacher, params, autocast = _setup(generator, 1, forget_batch, retain_batch, "surgical", "cpu",
                                                     "fp32", 0, None, 0)
    generator.unet.train()
    method = build_method(cfg["method"], cfg)
    with _plain_attention(generator.unet, teacher), FlopCounterMode(display=False) as counter:
        with autocast():
            objectives = method.objectives(generator, teacher, data, np.random.default_rng(0),
                                           torch.Generator().manual_seed(0))
        build_optimiser(params, resolve_run_settings({**default_run_settings(), "optimiser": optimiser})).step(
            objectives)
    return counter.get_total_flops()


def test_extrapolated_optimiser_flops_equal_a_count_at_the_whole_batch():
    torch.manual_seed(0)
    generator = build_mini_generator(SMALL_UNET)
    record = benchmark_optimisers(copy.deepcopy(generator), 1, 3, 2, device="cpu", warmup=0)["optimisers"]
    for name in OPTIMISER_COMPARISON:
        counted = _first_step_flops_at_full_batch(copy.deepcopy(generator), name, 3, 2)
        assert record[name]["flops_per_step"] == counted > 0, name
        per_sample = record[name]["flops_per_sample"]
        assert per_sample["forget"] > 0 and per_sample["retain"] > 0
    # EUPMU's extra student forward is on the retain batch only
    assert record["eupmu"]["flops_per_sample"]["retain"] > record["weighted_sum"]["flops_per_sample"]["retain"]
    assert record["eupmu"]["flops_per_sample"]["forget"] == record["weighted_sum"]["flops_per_sample"]["forget"]
