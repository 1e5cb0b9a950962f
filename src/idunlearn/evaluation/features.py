"""Image features for the kernel distance: DINOv2 ViT-L/14 CLS (paper) or the offline recognizer (substitute)."""

from __future__ import annotations

import numpy as np
import torch

from ..faces.analyser import FaceAnalyser


class RecognizerFeatures:
    """Offline substitute for DINOv2 (no generic image model ships in any registry package): the face analyser's
    embedding of the aligned 112x112 image, without detection. It measures identity-space drift, not realism."""

    def __init__(self, analyser: FaceAnalyser):
        self.analyser = analyser
        self.name = f"{analyser.name} embedding (offline KD substitute)"

    def __call__(self, images: np.ndarray) -> np.ndarray:
        return np.asarray(self.analyser.embed(images), np.float64)


class DinoV2Features:
    """DINOv2 ViT-L/14 CLS token (1024-d) at 224x224 bicubic, ImageNet normalisation, not L2-normalised
    (dgm-eval, as used by the PIU tables)."""

    name = "dinov2-vitl14 CLS"
    MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

    def __init__(self, model: torch.nn.Module, device: str = "cpu", batch_size: int = 32):
        self.model, self.device, self.batch_size = model.to(device).eval(), device, batch_size

    @classmethod
    def from_hub(cls, repo: str = "facebook/dinov2-large", revision: str | None = None, **kwargs) -> "DinoV2Features":
        from transformers import AutoModel

        return cls(AutoModel.from_pretrained(repo, revision=revision), **kwargs)

    @torch.no_grad()
    def __call__(self, images: np.ndarray) -> np.ndarray:
        mean = torch.tensor(self.MEAN).view(1, 3, 1, 1)
        std = torch.tensor(self.STD).view(1, 3, 1, 1)
        out = []
        for i in range(0, len(images), self.batch_size):
            x = torch.from_numpy(images[i:i + self.batch_size]).permute(0, 3, 1, 2).float() / 255
            x = torch.nn.functional.interpolate(x, size=(224, 224), mode="bicubic", align_corners=False)
            x = ((x.clamp(0, 1) - mean) / std).to(self.device)
            out.append(self.model(pixel_values=x).last_hidden_state[:, 0].float().cpu())
        return torch.cat(out).numpy().astype(np.float64)
