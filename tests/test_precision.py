import copy

import numpy as np
import pytest
import torch
from diffusers.models.attention_processor import Attention, AttnProcessor2_0

from idunlearn.models.mini import build_mini_generator
from idunlearn.models.precision import Float32Attention, forward_autocast, training_precision
from idunlearn.unlearning import build_method
from idunlearn.unlearning.runner import unlearn

from test_piu import RUN
from tiny_world import TINY, tiny_data


def _attention_and_inputs():
    torch.manual_seed(0)
    attn = Attention(query_dim=32, cross_attention_dim=16, heads=4, dim_head=8)
    return attn, torch.randn(3, 20, 32), torch.randn(3, 7, 16)


def test_fp32_attention_under_bf16_autocast_equals_plain_fp32_attention():
    attn, hidden, context = _attention_and_inputs()
    with torch.no_grad():
        reference = attn(hidden, context)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = attn(hidden, context)  # the module's own processor: autocast runs its projections in bf16
            attn.set_processor(Float32Attention(AttnProcessor2_0()))
            kept = attn(hidden, context)
    assert mixed.dtype == torch.bfloat16 and not torch.allclose(mixed.float(), reference, atol=1e-4)
    assert kept.dtype == torch.float32
    torch.testing.assert_close(kept, reference)


def test_training_precision_installs_fp32_attention_for_bf16_only_and_restores_the_processors():
    gen = build_mini_generator(TINY)
    before = {name: type(p) for name, p in gen.unet.attn_processors.items()}
    with training_precision("fp32", gen.unet):
        assert {name: type(p) for name, p in gen.unet.attn_processors.items()} == before
    with training_precision("bf16", gen.unet):
        assert before and all(isinstance(p, Float32Attention) for p in gen.unet.attn_processors.values())
    assert {name: type(p) for name, p in gen.unet.attn_processors.items()} == before
    assert isinstance(forward_autocast("bf16", torch.device("cpu")), torch.autocast)
    with pytest.raises(ValueError, match="precision 'fp16' is unknown.*run setting 'precision'"):
        forward_autocast("fp16", torch.device("cpu"))


def test_bf16_run_keeps_fp32_weights_and_follows_the_fp32_run(tmp_path):
    torch.manual_seed(0)
    base, data = build_mini_generator(TINY), tiny_data()
    runs = {}
    for precision, seed in (("fp32", 5), ("bf16", 5), ("fp32", 6)):
        gen = copy.deepcopy(base)
        log, timings = unlearn(gen, build_method("piu", RUN), data, {**RUN, "precision": precision},
                               tmp_path / f"{precision}_{seed}.pt", seed=seed)
        runs[precision, seed] = (gen, log["forget_loss"].to_numpy(), timings)
    (_, loss32, t32), (bf16, loss16, t16) = runs["fp32", 5], runs["bf16", 5]
    assert (t32["precision"], t16["precision"]) == ("fp32", "bf16")
    assert all(p.dtype == torch.float32 for p in bf16.unet.parameters())
    # The forget loss here is the mean square of a small difference of two predictions of a random tiny model
    # (~1e-3), so bf16 rounding moves it by 10-40% depending on the CPU's bf16 kernels (AMX or AVX-512 BF16). The
    # scale to compare with is that of other batches: the bf16 run on the same batches must stay far nearer to the
    # fp32 run (mean |log ratio| per step) than the fp32 run of another seed is, and must not be bit-identical.
    def log_distance(a, b):
        return float(np.mean(np.abs(np.log(a / b))))

    assert log_distance(loss16, loss32) < 0.5 * log_distance(runs["fp32", 6][1], loss32)
    assert not np.array_equal(loss16, loss32)
    # the run's processors are back after training
    assert not any(isinstance(p, Float32Attention) for p in bf16.unet.attn_processors.values())
