"""The face-analyser interface: detect -> choose one face -> align -> embed, batched, one status row per image."""

from __future__ import annotations

import abc
import enum
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError
from tqdm.auto import tqdm

from .align import ALIGNED_SIZE, align_face


class FaceStatus(str, enum.Enum):
    OK = "ok"
    EMPTY_FILE = "empty_file"
    UNREADABLE = "unreadable"
    TOO_SMALL = "too_small"  # the image, or its largest face, is below the configured size
    NO_FACE = "no_face"
    BAD_EMBEDDING = "bad_embedding"  # the recognizer returned NaN/inf or a zero vector


@dataclass(frozen=True)
class Detection:
    box: np.ndarray  # (4,) x1, y1, x2, y2 in pixels
    score: float
    landmarks: np.ndarray  # (5, 2): left eye, right eye, nose, left mouth corner, right mouth corner

    @property
    def area(self) -> float:
        return float(max(self.box[2] - self.box[0], 0) * max(self.box[3] - self.box[1], 0))

    @property
    def min_side(self) -> float:
        return float(min(self.box[2] - self.box[0], self.box[3] - self.box[1]))


class ImageLoadError(Exception):
    def __init__(self, status: FaceStatus, message: str):
        super().__init__(message)
        self.status = status


def load_rgb(path: str | Path) -> np.ndarray:
    """Read any PIL-readable image (grey, CMYK, palette, RGBA) as HxWx3 uint8 RGB; bad files raise ImageLoadError."""
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise ImageLoadError(FaceStatus.EMPTY_FILE, "file is empty")
        with Image.open(path) as image:
            image.load()  # forces the decode, so truncated files fail here
            return np.asarray(image.convert("RGB"))
    except ImageLoadError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ImageLoadError(FaceStatus.UNREADABLE, f"{type(exc).__name__}: {exc}") from exc


def largest(detections: Sequence[Detection], image_shape: Sequence[int] | None = None) -> Detection | None:
    """The face with the largest box (Arc2Face's README keeps the largest face per image)."""
    return max(detections, key=lambda d: d.area) if detections else None


def centre_weighted(detections: Sequence[Detection], image_shape: Sequence[int]) -> Detection | None:
    """The face with the largest area x (1 - offset)^2, offset = distance of the box centre from the image centre
    over the image diagonal: the PIU reimplementation's choice for the dataset and for scoring
    (edgarcancinoe/piu-unlearning, src/piu_unlearning/models/arcface.py), so a large face at the edge of a generated
    sample loses to the subject in the middle."""
    if not detections:
        return None
    height, width = image_shape[:2]
    diagonal = math.hypot(height, width)

    def score(d: Detection) -> float:
        offset = math.hypot((d.box[0] + d.box[2]) / 2 - width / 2, (d.box[1] + d.box[3]) / 2 - height / 2) / diagonal
        return d.area * (1.0 - offset) ** 2

    return max(detections, key=score)


FACE_CHOICES = {"largest": largest, "centre_weighted": centre_weighted}


class FaceAnalyser(abc.ABC):
    """Detect, align and embed faces. Subclasses provide ``detect`` and ``embed``.

    Input policy: images are given at their own resolution (generated samples as generated). ``working_image``
    says how the analyser looks at one (as given by default; a backend may enlarge small images for its detector);
    detection, the face-size check and alignment happen there, and the reported box and landmarks are in the given
    image's pixel coordinates. The face that ``face_choice`` names (``FACE_CHOICES``) is aligned to the ArcFace
    template at ``aligned_size``.
    """

    name: str
    embedding_dim: int
    aligned_size: int = ALIGNED_SIZE

    def __init__(self, min_image_size: int = 16, min_face_size: float = 20.0, face_choice: str = "largest"):
        if face_choice not in FACE_CHOICES:
            raise ValueError(f"face choice {face_choice!r} is unknown: use one of {sorted(FACE_CHOICES)}")
        self.min_image_size = min_image_size
        self.min_face_size = min_face_size
        self.choose_face = FACE_CHOICES[face_choice]

    @abc.abstractmethod
    def detect(self, image: np.ndarray) -> list[Detection]:
        """All faces in one HxWx3 uint8 RGB image."""

    @abc.abstractmethod
    def embed(self, faces: np.ndarray) -> np.ndarray:
        """Embeddings (N, D) of aligned faces (N, 112, 112, 3) uint8 RGB, L2-normalised."""

    def working_image(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The image that detection and alignment see, and its (x, y) scale over the given one."""
        return image, np.ones(2)

    def align(self, image: np.ndarray, detection: Detection) -> np.ndarray:
        return align_face(image, detection.landmarks, self.aligned_size)

    def analyse(
        self,
        images: Iterable[tuple[str, str | Path | np.ndarray]],
        batch_size: int = 32,
        progress: bool = True,
    ) -> pd.DataFrame:
        """One row per (image_id, path or HxWx3 uint8 array): status, detection score, box, landmarks, embedding.

        A bad image becomes a status row; it never stops the batch.
        """
        images = list(images)
        rows: list[dict] = []
        pending: list[tuple[dict, np.ndarray]] = []
        for image_id, path in tqdm(images, desc=f"faces ({self.name})", unit="img", disable=not progress):
            row = self._detect_one(str(image_id), path)
            if isinstance(row, tuple):
                pending.append(row)
                row = row[0]
            rows.append(row)
            if len(pending) >= batch_size:
                self._embed_pending(pending)
                pending = []
        self._embed_pending(pending)
        return records_to_frame(rows, self.embedding_dim)

    def _detect_one(self, image_id: str, source: str | Path | np.ndarray):
        row = empty_row(image_id)
        try:
            image = source if isinstance(source, np.ndarray) else load_rgb(source)
        except ImageLoadError as exc:
            row.update(status=exc.status.value, message=str(exc))
            return row
        if min(image.shape[:2]) < self.min_image_size:
            row.update(status=FaceStatus.TOO_SMALL.value, message=f"image {image.shape[1]}x{image.shape[0]}")
            return row
        work, scale = self.working_image(image)
        face = self.choose_face(self.detect(work), work.shape)
        if face is None:
            row.update(status=FaceStatus.NO_FACE.value, message="no face detected")
            return row
        # back to the given image's continuous pixel coordinates: (x, y) = (x', y') / (scale_x, scale_y)
        row.update(det_score=float(face.score), box=(np.asarray(face.box, float) / np.tile(scale, 2)).tolist(),
                   landmarks=(np.asarray(face.landmarks, float) / scale).reshape(-1).tolist())
        if face.min_side < self.min_face_size:
            row.update(status=FaceStatus.TOO_SMALL.value, message=f"face {face.min_side:.0f}px")
            return row
        return row, self.align(work, face)

    def _embed_pending(self, pending: list[tuple[dict, np.ndarray]]) -> None:
        if not pending:
            return
        embeddings = self.embed(np.stack([face for _, face in pending]))
        for (row, _), emb in zip(pending, embeddings):
            norm = float(np.linalg.norm(emb)) if np.all(np.isfinite(emb)) else math.nan
            if not np.isfinite(norm) or norm < 1e-6:
                row.update(status=FaceStatus.BAD_EMBEDDING.value, message="non-finite or zero embedding")
                continue
            row.update(status=FaceStatus.OK.value, embedding=(emb / norm).astype(np.float32).tolist())


def empty_row(image_id: str) -> dict:
    return {"image_id": image_id, "status": None, "message": "", "det_score": math.nan,
            "box": None, "landmarks": None, "embedding": None}


def records_to_frame(rows: list[dict], dim: int) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(empty_row("").keys()))
    frame.attrs["embedding_dim"] = dim
    return frame


def ok_embeddings(frame: pd.DataFrame) -> pd.Series:
    """image_id -> embedding of the rows whose faces were embedded."""
    return frame[frame["status"] == FaceStatus.OK.value].set_index("image_id")["embedding"]


def read_embeddings(frame: pd.DataFrame, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, dim) embeddings of an analysed table, zeros where no face was found, and the detected mask."""
    detected = (frame["status"] == FaceStatus.OK.value).to_numpy()
    emb = np.stack([np.asarray(e, np.float64) if d else np.zeros(dim) for e, d in zip(frame["embedding"], detected)])
    return emb, detected


def embedding_matrix(frame: pd.DataFrame) -> np.ndarray:
    """Stack the ``embedding`` column of the ok rows into an (N, D) float32 array."""
    ok = frame[frame["status"] == FaceStatus.OK.value]
    if ok.empty:
        return np.zeros((0, 0), np.float32)
    return np.stack(ok["embedding"].to_numpy()).astype(np.float32)


def aligned_crops(paths: Sequence[str | Path], landmarks: Sequence, size: int = ALIGNED_SIZE) -> np.ndarray:
    """(N, size, size, 3) uint8 crops aligned with stored five-point landmarks (no detection rerun)."""
    return np.stack([align_face(load_rgb(p), np.asarray(l, float).reshape(5, 2), size) for p, l in zip(paths, landmarks)])
