"""Numeric precision of the generator's forward passes during training: fp32, or bf16 with attention in fp32.

"bf16" is mixed precision: the forward passes run under bf16 autocast (convolutions, feed-forward and projection
layers in bf16), every attention module runs in fp32, and parameters, gradients and optimiser state stay fp32. The
attention is kept in fp32 because PyTorch's CPU flash-attention backward is about 5x slower in bf16 than in fp32 on
these sizes (docs/benchmarks.md) and its softmax is the op most sensitive to precision.
"""

from __future__ import annotations

import contextlib

import torch
from diffusers.models.attention_processor import AttnProcessor2_0
from torch import nn

PRECISIONS = ("fp32", "bf16")


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is unknown: use one of {', '.join(PRECISIONS)} "
                         "(run setting 'precision')")
    return precision


class Float32Attention:
    """An attention processor running ``inner`` (default: diffusers' SDPA processor) with autocast off and its
    inputs cast to fp32, so that under bf16 autocast the attention alone stays in fp32."""

    def __init__(self, inner=None):
        self.inner = inner if inner is not None else AttnProcessor2_0()

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, temb: torch.Tensor | None = None, *args, **kwargs):
        with torch.autocast(hidden_states.device.type, enabled=False):
            return self.inner(attn, hidden_states.float(), _float(encoder_hidden_states), _float(attention_mask),
                              _float(temb), *args, **kwargs)


def _float(x: torch.Tensor | None) -> torch.Tensor | None:
    return x.float() if x is not None and x.is_floating_point() else x


@contextlib.contextmanager
def training_precision(precision: str, *unets: nn.Module):
    """For the duration of a run at ``precision``: "bf16" gives every attention module of ``unets`` the fp32
    processor (their own processors come back afterwards); "fp32" changes nothing."""
    if check_precision(precision) == "fp32":
        yield
        return
    saved = [unet.attn_processors for unet in unets]
    for unet, processors in zip(unets, saved):
        unet.set_attn_processor({name: Float32Attention(p) for name, p in processors.items()})
    try:
        yield
    finally:
        for unet, processors in zip(unets, saved):
            unet.set_attn_processor(processors)


def forward_autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context of one training step's forward passes at ``precision`` (inside training_precision)."""
    if check_precision(precision) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
