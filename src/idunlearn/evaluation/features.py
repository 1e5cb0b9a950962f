"""Image features for the kernel distance: DINOv2 ViT-L/14 CLS (paper) or offline substitutes.

Every extractor takes whole images (N, H, W, 3) uint8 at the generator's resolution, generated and reference alike,
and brings them to its own input size (``whole_frames``): no detection, no alignment."""

from __future__ import annotations

import numpy as np
import torch

from ..faces.analyser import FaceAnalyser
from ..faces.mobilefacenet import MobileFaceNet


def whole_frames(images: np.ndarray, size: int, antialias: bool = False) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, 3, size, size) float RGB in [0, 255], the whole image bicubic-resized (with
    ``antialias``, low-pass filtered first when shrinking, as PIL's resize is)."""
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float()
    if x.shape[-2:] != (size, size):
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="bicubic", align_corners=False,
                                            antialias=antialias)
    return x.clamp(0, 255)


class RecognizerFeatures:
    """The face analyser's identity embedding of the whole image at the aligned-face size, without detection. It
    measures identity-space drift, not realism: kept as an option, not the offline default."""

    def __init__(self, analyser: FaceAnalyser):
        self.analyser = analyser
        self.name = f"{analyser.name} embedding (offline KD substitute)"

    def __call__(self, images: np.ndarray) -> np.ndarray:
        faces = whole_frames(images, self.analyser.aligned_size).round().to(torch.uint8).permute(0, 2, 3, 1)
        return np.asarray(self.analyser.embed(faces.numpy()), np.float64)


class MobileFaceNetMapFeatures:
    """Offline default (no DINOv2, CLIP or Inception weights ship in any registry package): MobileFaceNet's
    mid-level feature maps (``MID_LEVEL_TENSOR``, 128 x 14 x 14 at the 112 px input), mean- and std-pooled over
    space into 256 numbers. Mid-level maps of a face network code local structure (edges, texture, noise, blur,
    compression artefacts) before the later layers discard it on the way to an identity-invariant embedding, so
    the kernel distance on them responds to realism rather than to who the face is (the identity embedding's KD
    stays near zero whatever the images look like). Measured on ORL faces at the mini generator's 32 px
    (tests/test_kd_features.py): KD to a real reference grows monotonically with Gaussian noise, blur and JPEG
    loss, and two halves of the same real set stay within 1-6% of the mildest of them (JPEG quality 90)."""

    name = "mobilefacenet mid-level maps, mean+std pooled (offline KD substitute for DINOv2)"

    def __init__(self, recognizer: MobileFaceNet, batch_size: int = 32):
        self.recognizer, self.batch_size = recognizer.eval(), batch_size

    @torch.inference_mode()
    def __call__(self, images: np.ndarray) -> np.ndarray:
        device = next(self.recognizer.parameters()).device
        out = []
        for i in range(0, len(images), self.batch_size):
            x = whole_frames(images[i:i + self.batch_size], self.recognizer.input_size).to(device)
            maps = self.recognizer.mid_level_maps(x)
            # per-channel spatial mean and standard deviation (mean + std pooling)
            out.append(torch.cat([maps.mean((2, 3)), maps.std((2, 3))], 1).double().cpu())
        return torch.cat(out).numpy()


DINOV2_REPO = "facebook/dinov2-large"
# A commit of facebook/dinov2-large pinned in public code (not checked here: no hub); a run records what it loaded.
DINOV2_REVISION = "47b73eefe95e8d44ec3623f8890bd894b6ea2d6c"


class DinoV2Features:
    """DINOv2 ViT-L/14 CLS token (1024-d) as the KD reference code computes it (layer6ai-labs/dgm-eval,
    dgm_eval/models/dinov2.py): the whole image resized to 224x224 bicubic with antialiasing (torchvision's Resize on
    a PIL image), ImageNet normalisation, the CLS token after the final layer norm, not L2-normalised."""

    name = "dinov2-vitl14 CLS"
    MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    SIZE = 224

    def __init__(self, model: torch.nn.Module, device: str | torch.device = "cpu", batch_size: int = 32):
        self.model, self.device, self.batch_size = model.to(device).eval(), torch.device(device), batch_size

    @classmethod
    def from_hub(cls, repo: str = DINOV2_REPO, revision: str | None = None, **kwargs) -> "DinoV2Features":
        """The model at ``revision`` (None: the pinned DINOV2_REVISION) through the Hugging Face cache."""
        from transformers import AutoModel

        from ..assets import AssetError

        revision = revision or DINOV2_REVISION
        try:
            model = AutoModel.from_pretrained(repo, revision=revision)
        # hub errors differ across huggingface_hub versions and transports
        except Exception as exc:
            raise AssetError(f"could not load DINOv2 from hub repo {repo} at revision {revision} "
                             f"({type(exc).__name__}: {exc}). On a machine that reaches huggingface.co run "
                             f"`hf download {repo} config.json model.safetensors --revision {revision}` (docs/paper-setup.md) and copy the cache folder "
                             "here (HF_HOME).") from exc
        return cls(model, **kwargs)

    @torch.no_grad()
    def __call__(self, images: np.ndarray) -> np.ndarray:
        mean = torch.tensor(self.MEAN, device=self.device).view(1, 3, 1, 1)
        std = torch.tensor(self.STD, device=self.device).view(1, 3, 1, 1)
        out = []
        for i in range(0, len(images), self.batch_size):
            x = whole_frames(images[i:i + self.batch_size], self.SIZE, antialias=True).to(self.device) / 255
            # last_hidden_state is after Dinov2Model's final layer norm; row 0 is the CLS token
            out.append(self.model(pixel_values=(x - mean) / std).last_hidden_state[:, 0].float().cpu())
        return torch.cat(out).numpy().astype(np.float64)
