"""Five-point similarity alignment to the 112x112 ArcFace template."""

from __future__ import annotations

import numpy as np
from PIL import Image

ALIGNED_SIZE = 112  # side of the aligned face every recognizer (ArcFace, MobileFaceNet) and eDifFIQA reads

# Five-point template of ArcFace/insightface for 112x112 crops: eyes, nose tip, mouth corners (x, y).
ARCFACE_TEMPLATE_112 = np.array(
    [[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366], [41.5493, 92.3655], [70.7299, 92.2041]],
    dtype=np.float64,
)


def similarity_transform(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """2x3 matrix of the least-squares similarity (rotation, uniform scale, shift) taking src points to dst.

    Umeyama (1991), eq. 40-42, without reflection.
    """
    src, dst = np.asarray(src, np.float64), np.asarray(dst, np.float64)
    mu_s, mu_d = src.mean(0), dst.mean(0)
    s_c, d_c = src - mu_s, dst - mu_d
    cov = d_c.T @ s_c / len(src)
    u, sig, vt = np.linalg.svd(cov)
    sign = np.eye(2)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        sign[1, 1] = -1.0
    rot = u @ sign @ vt
    var_s = (s_c**2).sum() / len(src)
    scale = np.trace(np.diag(sig) @ sign) / var_s
    matrix = np.zeros((2, 3))
    matrix[:, :2] = scale * rot
    matrix[:, 2] = mu_d - scale * rot @ mu_s
    return matrix


def align_face(image: np.ndarray, landmarks: np.ndarray, size: int = ALIGNED_SIZE) -> np.ndarray:
    """Warp ``image`` (HxWx3 uint8) so its five landmarks land on the ArcFace template scaled to ``size``."""
    template = ARCFACE_TEMPLATE_112 * (size / ALIGNED_SIZE)
    forward = similarity_transform(np.asarray(landmarks, np.float64).reshape(5, 2), template)
    inverse = np.linalg.inv(np.vstack([forward, [0.0, 0.0, 1.0]]))[:2]  # PIL maps output pixels to input pixels
    # PIL addresses pixels by their corners, cv2/insightface by their centres: t' = t - L (0.5, 0.5) + 0.5
    inverse[:, 2] = inverse[:, 2] - inverse[:, :2] @ np.array([0.5, 0.5]) + 0.5
    warped = Image.fromarray(image).transform((size, size), Image.AFFINE, inverse.reshape(-1).tolist(), Image.BILINEAR)
    return np.asarray(warped)
