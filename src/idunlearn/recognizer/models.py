"""The classifier f(x) = h(Phi(x; psi); omega) of GSUO Section 3: a small CNN feature extractor Phi and a linear head h.

CPU-sized on purpose (about 0.1-0.3 M parameters): convolution blocks (3x3 conv, ReLU, 2x2 max-pool) and a fully
connected layer give the feature Phi (after ReLU); the head is one linear layer. No batch normalisation, so that an
unlearning step on a handful of forget images cannot shift running statistics behind the optimiser's back.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..io import atomic_path


class RecognizerNet(nn.Module):
    def __init__(self, n_classes: int, image_size: int, channels=(16, 32, 64), feature_dim: int = 128,
                 in_channels: int = 1):
        super().__init__()
        layers, c_in, size = [], in_channels, image_size
        for c in channels:
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            c_in, size = c, size // 2
        if size < 1:
            raise ValueError(f"image size {image_size} is too small for {len(channels)} pooling blocks "
                             "(config key 'recognizer.model.channels')")
        self.backbone = nn.Sequential(*layers, nn.Flatten(), nn.Linear(c_in * size * size, feature_dim), nn.ReLU())
        self.head = nn.Linear(feature_dim, n_classes)
        self.config = {"n_classes": int(n_classes), "image_size": int(image_size),
                       "channels": [int(c) for c in channels], "feature_dim": int(feature_dim),
                       "in_channels": int(in_channels)}

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Phi(x; psi)."""
        return self.backbone(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def build_model(n_classes: int, image_size: int, cfg: dict, seed: int) -> RecognizerNet:
    """A freshly initialised classifier; the initial weights depend only on ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return RecognizerNet(n_classes, image_size, tuple(cfg["channels"]), cfg["feature_dim"])


def save_model(model: RecognizerNet, path: str | Path, metadata: dict | None = None) -> None:
    import json

    from safetensors.torch import save_file

    meta = {"config": json.dumps(model.config), **{k: json.dumps(v) for k, v in (metadata or {}).items()}}
    with atomic_path(path) as tmp:
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(tmp), metadata=meta)


def load_model(path: str | Path) -> tuple[RecognizerNet, dict]:
    """The model and its metadata (decoded JSON values) from a safetensors file written by ``save_model``."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), "pt") as handle:
        meta = {k: json.loads(v) for k, v in (handle.metadata() or {}).items()}
    cfg = meta.pop("config")
    model = RecognizerNet(cfg["n_classes"], cfg["image_size"], tuple(cfg["channels"]), cfg["feature_dim"],
                          cfg["in_channels"])
    model.load_state_dict(load_file(str(path)))
    return model, meta


def derive_seed(*parts: int) -> int:
    """A 63-bit torch seed from integer parts (config seed, purpose tag, ...)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0] >> np.uint64(1))
