"""A rank-r LoRA adapter on the cross-attention projections (Hu et al. 2022, eq. 3: h = W x + (alpha / r) B A x), the
held-out relearning attacker's low-rank fine-tuning. The base weights stay frozen and untouched: only A and B train,
B starts at zero so the adapted model starts as the given one."""

from __future__ import annotations

import torch
from torch import nn

from ..models.layers import is_cross_attention

PROJECTIONS = ("to_q", "to_k", "to_v", "to_out.0")  # every linear map of an attention block


class LoRALinear(nn.Module):
    """``base`` (frozen) plus the low-rank update (alpha / rank) B A; A drawn with ``gen``, B zero."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, gen: torch.Generator):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.scale = alpha / rank
        a = torch.randn(rank, base.in_features, generator=gen) / base.in_features ** 0.5
        self.lora_a = nn.Parameter(a.to(base.weight.device, base.weight.dtype))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device,
                                               dtype=base.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scale * (x @ self.lora_a.T @ self.lora_b.T)


def add_cross_attention_lora(unet: nn.Module, rank: int, seed: int, alpha: float | None = None) -> list[nn.Parameter]:
    """Wrap every projection of every cross-attention block of ``unet`` (in place) in a ``LoRALinear`` of ``rank``
    (alpha defaults to the rank: scale 1). Returns the adapter parameters, the only ones that may train."""
    gen = torch.Generator().manual_seed(seed)
    names = [name for name, module in unet.named_modules()
             if isinstance(module, nn.Linear) and is_cross_attention(name) and name.endswith(PROJECTIONS)]
    if not names:
        raise ValueError("LoRA relearning: the UNet has no cross-attention projection (to_q/to_k/to_v/to_out.0 of "
                         "an attn2 block)")
    params = []
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = unet.get_submodule(parent_name)
        adapter = LoRALinear(getattr(parent, child), rank, float(alpha or rank), gen)
        setattr(parent, child, adapter)  # a ModuleList's items are attributes named by their index too
        params += [adapter.lora_a, adapter.lora_b]
    return params
