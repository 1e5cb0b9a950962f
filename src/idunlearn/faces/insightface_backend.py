"""Paper-setup face analyser: insightface antelopev2 SCRFD detector + Arc2Face's ``arcface.onnx`` recognizer.

Arc2Face replaces antelopev2's ``glintr100.onnx`` with its own ``arcface.onnx``; the analyser returns L2-normalised
512-d embeddings of one face per image, chosen by ``face_choice``: the PIU reimplementation's centre-weighted choice
at det_size 256 and threshold 0.2 (edgarcancinoe/piu-unlearning, src/piu_unlearning/models/arcface.py; the paper
config), or Arc2Face README's largest face at 640 and 0.5 (the schema defaults).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Sequence

import numpy as np

from ..assets import AssetError
from ..io import atomic_path
from .analyser import Detection, FaceAnalyser

# Hub sources, pinned to commits so a re-run fetches the same bytes.
ARC2FACE_REPO = "FoivosPar/Arc2Face"
ARC2FACE_REVISION = "321709b2e9697ea2a5bd06c8a51b340592333e1e"
DETECTOR_REPO = "DIAMONIK7777/antelopev2"
DETECTOR_REVISION = "ba0c3e10f4548361eb9a63265d87ce1140ab5a05"
DETECTOR_FILE = "scrfd_10g_bnkps.onnx"
RECOGNIZER_FILE = "arcface.onnx"

_SOURCES = {
    DETECTOR_FILE: (DETECTOR_REPO, DETECTOR_REVISION),
    RECOGNIZER_FILE: (ARC2FACE_REPO, ARC2FACE_REVISION),
}


class InsightFaceAnalyser(FaceAnalyser):
    """SCRFD detection + ArcFace recognition through insightface's model classes.

    ``detector`` behaves like ``insightface.model_zoo.SCRFD`` (``prepare``, ``detect``) and ``recognizer`` like
    ``ArcFaceONNX`` (``get_feat``); both take BGR images, as everything in insightface does.
    """

    name = "insightface-antelopev2-arc2face"
    embedding_dim = 512

    def __init__(
        self,
        detector,
        recognizer,
        det_size: Sequence[int] = (640, 640),
        det_thresh: float = 0.5,
        min_image_size: int = 16,
        min_face_size: float = 20.0,
        face_choice: str = "largest",
    ):
        super().__init__(min_image_size=min_image_size, min_face_size=min_face_size, face_choice=face_choice)
        self.detector = detector
        self.recognizer = recognizer
        self.det_size = tuple(int(v) for v in det_size)
        self.det_thresh = float(det_thresh)
        # As FaceAnalysis.prepare does. ctx_id only acts when negative (it forces CPU); the providers were
        # chosen when the sessions were built.
        detector.prepare(0, input_size=self.det_size, det_thresh=self.det_thresh)

    @classmethod
    def from_dir(
        cls,
        models_dir: str | Path,
        det_size: Sequence[int] = (640, 640),
        det_thresh: float = 0.5,
        providers: Sequence[str] | None = None,
        min_image_size: int = 16,
        min_face_size: float = 20.0,
        face_choice: str = "largest",
    ) -> "InsightFaceAnalyser":
        """Load ``scrfd_10g_bnkps.onnx`` and ``arcface.onnx`` from ``models_dir`` (``providers`` None:
        ``onnx_providers()``, the GPU when the job has one)."""
        models_dir = Path(models_dir)
        missing = [name for name in _SOURCES if not (models_dir / name).is_file()]
        if missing:
            sources = "; ".join(f"{name} from hub repo {_SOURCES[name][0]} at revision {_SOURCES[name][1]}"
                                for name in missing)
            raise AssetError(
                f"face model file(s) {', '.join(missing)} not found in {models_dir}. Fetch them with "
                f"idunlearn.faces.insightface_backend.download_paper_face_models({str(models_dir)!r}) on a machine "
                f"that reaches huggingface.co, or place them there by hand: {sources}."
            )
        providers = onnx_providers() if providers is None else list(providers)
        detector = _load_model(models_dir / DETECTOR_FILE, "detection", providers)
        if not detector.use_kps:
            raise AssetError(f"{models_dir / DETECTOR_FILE} predicts no landmarks; alignment needs the _kps SCRFD model.")
        recognizer = _load_model(models_dir / RECOGNIZER_FILE, "recognition", providers)
        return cls(detector, recognizer, det_size=det_size, det_thresh=det_thresh,
                   min_image_size=min_image_size, min_face_size=min_face_size, face_choice=face_choice)

    def detect(self, image: np.ndarray) -> list[Detection]:
        # max_num=0 keeps every face; the base class picks one itself (face_choice).
        boxes, kpss = self.detector.detect(np.ascontiguousarray(image[:, :, ::-1]), max_num=0)
        return [
            Detection(box=np.asarray(row[:4], np.float64), score=float(row[4]), landmarks=np.asarray(kps, np.float64))
            for row, kps in zip(boxes, kpss)
        ]

    def embed(self, faces: np.ndarray) -> np.ndarray:
        bgr = [np.ascontiguousarray(face[:, :, ::-1]) for face in faces]
        feats = np.asarray(self.recognizer.get_feat(bgr), np.float64).reshape(len(bgr), -1)
        # A zero vector stays zero (and is reported as bad_embedding by the base class) instead of becoming NaN.
        norms = np.maximum(np.linalg.norm(feats, axis=1, keepdims=True), 1e-12)
        return (feats / norms).astype(np.float32)


def onnx_providers(cuda_available: bool | None = None) -> list[str]:
    """onnxruntime execution providers for this job: CUDA first when the job has a GPU and this onnxruntime build
    offers the CUDA provider (onnxruntime-gpu), else the CPU alone. The CPU stays last as the fallback for operators
    the CUDA provider lacks, as the PIU reimplementation passes them."""
    import onnxruntime

    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    if cuda_available and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def _load_model(path: Path, task: str, providers: Sequence[str]):
    from insightface import model_zoo

    # insightface routes a file to a model class by its input/output shapes; a wrong file lands elsewhere.
    model = model_zoo.get_model(str(path), providers=list(providers))
    if getattr(model, "taskname", None) != task:
        raise AssetError(f"{path} is not a face {task} model (insightface read it as {type(model).__name__}); "
                         "replace it with the file from the pinned hub revision.")
    return model


def download_paper_face_models(models_dir: str | Path, token: str | None = None) -> list[Path]:
    """Fetch ``scrfd_10g_bnkps.onnx`` and Arc2Face's ``arcface.onnx`` at the pinned revisions through the Hugging
    Face cache (HF_HOME / HF_HUB_CACHE), and copy them into ``models_dir``.

    A file already in the cache at the pinned revision is used without a network call (HF_HUB_OFFLINE=1 works);
    a ``local_dir`` download would look at ``models_dir`` only and miss a cache copied from another machine.
    """
    from huggingface_hub import hf_hub_download

    models_dir = Path(models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for filename, (repo, revision) in _SOURCES.items():
        try:
            cached = Path(hf_hub_download(repo_id=repo, filename=filename, revision=revision, token=token))
        # huggingface_hub's errors differ across versions and transports (requests, httpx); keep the cause chained.
        except Exception as exc:
            raise AssetError(
                f"could not download {filename} from hub repo {repo} at revision {revision} "
                f"({type(exc).__name__}: {exc}). Run this on a machine that reaches huggingface.co, or download the "
                f"file by hand and place it at {models_dir / filename}."
            ) from exc
        with atomic_path(models_dir / filename) as tmp:
            shutil.copyfile(cached, tmp)
        paths.append(models_dir / filename)
    return paths
