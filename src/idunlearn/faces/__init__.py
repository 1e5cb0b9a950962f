"""Face detection, alignment and embedding behind one interface (the "face analyser")."""

from .analyser import Detection, FaceAnalyser, FaceStatus, load_rgb

__all__ = ["Detection", "FaceAnalyser", "FaceStatus", "load_rgb", "build_face_analyser"]


def build_face_analyser(cfg: dict, models_dir: str) -> FaceAnalyser:
    """The analyser named by ``cfg['backend']`` ('offline' or 'insightface'), with its weights under ``models_dir``."""
    backend = cfg["backend"]
    if backend == "offline":
        from .offline import OfflineFaceAnalyser

        return OfflineFaceAnalyser.from_dir(models_dir, **cfg.get("offline_options", {}))
    if backend == "insightface":
        from .insightface_backend import InsightFaceAnalyser

        return InsightFaceAnalyser.from_dir(models_dir, **cfg.get("insightface_options", {}))
    raise ValueError(f"faces.backend {backend!r} is unknown: use 'offline' or 'insightface'")
