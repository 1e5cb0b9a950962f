"""The mini Arc2Face: Arc2Face's structure scaled to a CPU (offline world).

A small CLIP text encoder whose `id` slot takes the 192-d offline embedding zero-padded to its width, and a small
pixel-space UNet2DConditionModel conditioned on identity only through cross-attention (as Arc2Face; a timestep-
embedding path would give identity a route that cross-attention unlearning cannot reach).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from diffusers import UNet2DConditionModel
from safetensors.torch import load_file, save_file
from transformers import CLIPTextConfig, CLIPTextModel

from ..io import atomic_path
from .conditioning import EMPTY_PROMPT_IDS, EOS, ID_PROMPT_IDS, SEQUENCE_LENGTH, BOS, IdentityTextEncoder
from .generator import IdentityGenerator

# The mini encoder's vocabulary is just the template's tokens: keeps the shipped checkpoint small.
MINI_TOKEN_MAP = {clip_id: i for i, clip_id in enumerate(sorted(set(ID_PROMPT_IDS + EMPTY_PROMPT_IDS)))}

DEFAULT_ARCHITECTURE = {
    "image_size": 32,
    "channels": 1,  # ORL is greyscale
    "text_width": 256,
    "text_layers": 2,
    "text_heads": 4,
    "block_out_channels": [64, 128, 128, 128],
    "layers_per_block": 2,
    "attention_head_dim": 8,
    # SD1.5's pattern scaled down: no attention at the highest resolution (cost) nor at the lowest level
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "scheduler": {"num_train_timesteps": 1000, "beta_schedule": "squaredcos_cap_v2", "prediction_type": "epsilon"},
}


def build_mini_generator(arch: dict | None = None) -> IdentityGenerator:
    arch = {**DEFAULT_ARCHITECTURE, **(arch or {})}
    text = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(MINI_TOKEN_MAP), hidden_size=arch["text_width"], num_hidden_layers=arch["text_layers"],
        num_attention_heads=arch["text_heads"], intermediate_size=2 * arch["text_width"],
        max_position_embeddings=SEQUENCE_LENGTH, bos_token_id=MINI_TOKEN_MAP[BOS], eos_token_id=MINI_TOKEN_MAP[EOS],
        pad_token_id=MINI_TOKEN_MAP[EOS]))
    unet = UNet2DConditionModel(
        sample_size=arch["image_size"], in_channels=arch["channels"], out_channels=arch["channels"],
        block_out_channels=tuple(arch["block_out_channels"]), layers_per_block=arch["layers_per_block"],
        down_block_types=tuple(arch["down_block_types"]), up_block_types=tuple(arch["up_block_types"]),
        cross_attention_dim=arch["text_width"], attention_head_dim=arch["attention_head_dim"])
    generator = IdentityGenerator(IdentityTextEncoder(text, MINI_TOKEN_MAP), unet, arch["scheduler"])
    generator.architecture = arch
    return generator


def save_mini_generator(generator: IdentityGenerator, folder: str | Path, metadata: dict) -> None:
    """``model.safetensors`` (UNet + encoder weights, float16 so the shipped file stays under 25 MB) and
    ``config.json`` (architecture + how it was trained). Loading casts back to float32."""
    folder = Path(folder)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in generator.state_dict().items()}
    with atomic_path(folder / "model.safetensors") as tmp:
        save_file(state, str(tmp))
    with atomic_path(folder / "config.json") as tmp:
        tmp.write_text(json.dumps({"architecture": generator.architecture, **metadata}, indent=2) + "\n")


def excluded_identities(folder: str | Path) -> list[int] | None:
    """The identities a mini generator never read (its config.json's ``excluded_identities``: the never-trained
    reference's), or None for a generator trained on everyone."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"mini generator checkpoint incomplete: {path} is missing")
    excluded = json.loads(path.read_text()).get("excluded_identities")
    return None if excluded is None else [int(i) for i in excluded]


def load_mini_generator(folder: str | Path, device: str = "cpu") -> IdentityGenerator:
    folder = Path(folder)
    for name in ("model.safetensors", "config.json"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"mini generator checkpoint incomplete: {folder / name} is missing; "
                                    "run the train_generator rule or restore the shipped checkpoint")
    config = json.loads((folder / "config.json").read_text())
    generator = build_mini_generator(config["architecture"])
    generator.load_state_dict({k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()})
    return generator.to(device).eval()
