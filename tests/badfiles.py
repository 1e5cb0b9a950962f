"""A folder of bad inputs for the face stage: each must become a status row, never a crash."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image


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
