"""Face-quality scores of generated samples: eDifFIQA (paper, ONNX) or the detector's confidence (offline proxy).

Both score one sample per row of the scored-sample table (``detected``, ``landmarks``); a sample without a detected
face has no quality (NaN) and is already counted in the detection rate.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..faces.align import align_face

# eDifFIQA(T) as the OpenCV model zoo publishes it (opencv_zoo models/face_image_quality_assessment_ediffiqa/)
EDIFFIQA_ONNX = "ediffiqa_tiny_jun2024.onnx"


class DetectorScoreQuality:
    """Offline proxy: the face detector's confidence on the sample (no face-quality model ships in any registry
    package). It says "this looks like a face to the detector", not "this face is good for recognition"."""

    name = "detector score (offline proxy, not eDifFIQA)"

    def __call__(self, images: np.ndarray, scored: pd.DataFrame) -> np.ndarray:
        return np.where(scored["detected"], scored["det_score"].astype(float), np.nan)


class EDifFIQAQuality:
    """eDifFIQA (Babnik et al. 2024; PIU Section 4 quality measure) from its ONNX export (eDifFIQA(T) of the OpenCV
    model zoo, ``EDIFFIQA_ONNX``): input the aligned 112x112 RGB face in [-1, 1], NCHW; output one score, higher is
    better. The zoo's export takes one image at a time (input shape [1, 3, 112, 112]): a fixed batch dimension in the
    input shape is the batch size used."""

    def __init__(self, onnx_path: str | Path, batch_size: int = 32, providers: list[str] | None = None):
        import onnxruntime

        from ..faces.insightface_backend import onnx_providers

        path = Path(onnx_path)
        if not path.is_file():
            raise FileNotFoundError(f"evaluation.quality.ediffiqa_onnx: {path} does not exist; download the eDifFIQA "
                                    f"ONNX model (opencv_zoo models/face_image_quality_assessment_ediffiqa/"
                                    f"{EDIFFIQA_ONNX}) there, or set the key to null to use the offline proxy")
        self.session = onnxruntime.InferenceSession(str(path), providers=providers or onnx_providers())
        model_input = self.session.get_inputs()[0]
        self.input_name = model_input.name
        self.name = f"eDifFIQA ({path.name})"
        fixed = model_input.shape[0] if model_input.shape else None
        self.batch_size = fixed if isinstance(fixed, int) and fixed > 0 else batch_size

    def score_faces(self, faces: np.ndarray) -> np.ndarray:
        """(N, 112, 112, 3) uint8 aligned RGB faces -> (N,) quality scores."""
        x = (faces.astype(np.float32) / 127.5 - 1.0).transpose(0, 3, 1, 2)  # [-1, 1], NCHW
        batches = (x[i:i + self.batch_size] for i in range(0, len(x), self.batch_size))
        out = [self.session.run(None, {self.input_name: batch})[0].reshape(len(batch), -1) for batch in batches]
        return np.concatenate(out)[:, 0].astype(np.float64)

    def __call__(self, images: np.ndarray, scored: pd.DataFrame) -> np.ndarray:
        detected = scored["detected"].to_numpy(bool)
        scores = np.full(len(scored), np.nan)
        if detected.any():
            faces = np.stack([align_face(images[i], np.asarray(scored["landmarks"].iloc[i], float).reshape(5, 2))
                              for i in np.flatnonzero(detected)])
            scores[detected] = self.score_faces(faces)
        return scores


def build_quality(cfg: dict):
    """The ``evaluation.quality`` section: eDifFIQA when an ONNX file is given, else the offline proxy."""
    return EDifFIQAQuality(cfg["ediffiqa_onnx"]) if cfg.get("ediffiqa_onnx") else DetectorScoreQuality()
