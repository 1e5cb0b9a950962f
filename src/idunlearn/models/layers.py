"""Which UNet parameters an unlearning run may change (PIU Section 3.4): surgical / all cross-attention / full."""

from __future__ import annotations

from torch import nn

# PIU's surgical set on SD1.5/Arc2Face: attn2 of the third down block, the mid block and the first two up blocks.
# On the mini UNet the same names sit at the same relative resolutions (1/4, 1/8, 1/4, 1/2 of the input).
SURGICAL_BLOCKS = ("down_blocks.2.", "mid_block.", "up_blocks.1.", "up_blocks.2.")
REGIMES = ("surgical", "all_cross_attention", "full")


def is_cross_attention(name: str) -> bool:
    return ".attn2." in name


def trainable_parameter_names(unet: nn.Module, regime: str, surgical_blocks=SURGICAL_BLOCKS) -> list[str]:
    names = [n for n, _ in unet.named_parameters()]
    if regime == "full":
        return names
    if regime == "all_cross_attention":
        return [n for n in names if is_cross_attention(n)]
    if regime == "surgical":
        return [n for n in names if is_cross_attention(n) and n.startswith(tuple(surgical_blocks))]
    raise ValueError(f"parameter regime {regime!r} is unknown: use one of {', '.join(REGIMES)}")


def select_trainable(unet: nn.Module, regime: str, surgical_blocks=SURGICAL_BLOCKS) -> dict[str, nn.Parameter]:
    """Freeze every UNet parameter except those of ``regime``; returns the trainable ones by name."""
    names = set(trainable_parameter_names(unet, regime, surgical_blocks))
    if not names:
        raise ValueError(f"regime {regime!r} selects no parameter of this UNet (surgical blocks {surgical_blocks})")
    params = {}
    for name, param in unet.named_parameters():
        param.requires_grad_(name in names)
        if name in names:
            params[name] = param
    return params


def cross_attention_layers(unet: nn.Module) -> list[str]:
    """Module names of every cross-attention (attn2) layer, in forward order (down, mid, up).

    ``named_modules`` lists mid_block last (registration order), so the blocks are reordered here.
    """
    names = [name for name, _ in unet.named_modules() if name.endswith(".attn2")]
    stage = {"down_blocks": 0, "mid_block": 1, "up_blocks": 2}
    return sorted(names, key=lambda n: stage[n.split(".")[0]])
