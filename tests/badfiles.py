"""A folder of bad inputs for the face stage (each must become a status row, never a crash), and a stub analyser
that finds a face only in pure magenta."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from idunlearn.faces.align import ARCFACE_TEMPLATE_112
from idunlearn.faces.analyser import Detection, FaceAnalyser


class StubAnalyser(FaceAnalyser):
    """Finds a 'face' wherever the image is pure magenta; embeds by mean colour."""

    name, embedding_dim = "stub", 3

    def detect(self, image):
        ys, xs = np.nonzero(np.all(image == (255, 0, 255), axis=-1))
        if len(xs) == 0:
            return []
        box = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], float)
        return [Detection(box, 0.99, box[:2] + ARCFACE_TEMPLATE_112 * (box[2] - box[0]) / 112)]

    def embed(self, faces):
        return faces.reshape(len(faces), -1, 3).mean(1) + 1.0


def write_bad_files(folder: Path) -> dict[str, set[str]]:
    """Write the bad files into ``folder``; returns image id -> acceptable statuses."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "empty.jpg").write_bytes(b"")
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, format="JPEG")
    (folder / "truncated.jpg").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    Image.new("RGB", (1, 1), "white").save(folder / "one_pixel.png")
    (folder / "text.jpg").write_text("this is not an image\n")
    from skimage import data as skdata  # a real photograph without a face: a cup of coffee

    Image.fromarray(skdata.coffee()).convert("CMYK").save(folder / "cmyk_no_face.jpg")
    Image.fromarray(skdata.coffee()).save(folder / "no_face.png")
    return {
        "empty.jpg": {"empty_file"},
        "truncated.jpg": {"unreadable"},
        "one_pixel.png": {"too_small"},
        "text.jpg": {"unreadable"},
        "cmyk_no_face.jpg": {"no_face"},
        "no_face.png": {"no_face"},
    }
