"""The demo request folder of the offline world (config/request.yaml): photos of one ORL person, a photo of someone
else, a broken file and a picture without a face, so that every branch of the requester rule shows in the report."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
from PIL import Image

from ..io import atomic_path


def write_demo_folder(orl: pd.DataFrame, folder: str | Path, person: int, photos: int, other_person: int) -> list[str]:
    """Write the demo into ``folder`` from the ORL manifest ``orl`` (true identities s1..s40): the first ``photos``
    shots of ``person`` and the first of ``other_person`` as PNG, a JPEG cut in half, and a flat grey image.
    Returns the file names."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = orl.sort_values("image_id").groupby("true_identity")["path"].apply(list)
    for key, count in ((f"s{person}", photos), (f"s{other_person}", 1)):
        if key not in paths.index or len(paths[key]) < count:
            raise ValueError(f"config key 'request.demo': ORL has no {count} photos of person {key}")
    files = {f"person_{i + 1:02d}.png": Image.open(p) for i, p in enumerate(paths[f"s{person}"][:photos])}
    files["someone_else.png"] = Image.open(paths[f"s{other_person}"][0])
    size = files["someone_else.png"].size
    files["no_face.png"] = Image.new("L", size, 128)  # a flat grey picture: nothing to detect
    for name, image in files.items():
        with atomic_path(folder / name) as tmp:
            image.save(tmp, format="PNG")
    with atomic_path(folder / "broken.jpg") as tmp:  # a JPEG cut off half way, as an interrupted upload leaves it
        whole = io.BytesIO()
        Image.open(paths[f"s{person}"][photos % len(paths[f"s{person}"])]).save(whole, format="JPEG")
        tmp.write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
    return sorted([*files, "broken.jpg"])
