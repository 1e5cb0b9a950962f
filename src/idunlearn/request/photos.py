"""The photos of a forget request: every file of the request folder embedded (a bad file is a status row, never a
crash), and the requester found among the usable photos.

The requester rule (the identity stage's DBSCAN, config ``identities``): the usable photos are clustered exactly as
the dataset's images are; the largest cluster is the requester when it holds at least ``min_photos`` photos and more
than half of the usable ones. Photos outside it are rejected ("not the same person as the other N photos"), so a
stray photo of someone else does not stop the request; too few usable photos, or no cluster with a clear majority
(two people in similar numbers), stops it with a message naming every file and its status.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..data import acquire_folder
from ..faces.analyser import FaceAnalyser, FaceStatus, embedding_matrix
from ..identities import cluster_identities

PHOTO_COLUMNS = ["image_id", "path", "sha256", "status", "message", "used", "reason"]


class RequestError(ValueError):
    """The request cannot be served as given; the message names every file, its status and what to do."""


def embed_photos(folder: str | Path, analyser: FaceAnalyser, batch_size: int = 32) -> pd.DataFrame:
    """One row per file below ``folder``: the manifest's image_id, path and sha256 beside the analyser's status,
    message, detection and embedding (``FaceAnalyser.analyse``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RequestError(f"config key 'request.folder': {folder} is not a folder; point it at a folder of photos "
                           "of the person to forget")
    manifest = acquire_folder(folder)
    if manifest.empty:
        raise RequestError(f"config key 'request.folder': {folder} holds no files; put photos of the person there")
    faces = analyser.analyse(zip(manifest["image_id"], manifest["path"]), batch_size=batch_size, progress=False)
    return manifest[["image_id", "path", "sha256"]].merge(faces, on="image_id", validate="one_to_one")


def find_requester(photos: pd.DataFrame, eps: float, min_samples: int, min_photos: int,
                   one_person: bool = False) -> pd.DataFrame:
    """``photos`` (``embed_photos``) with ``used`` (the photo is the requester's) and ``reason`` (why a photo is not
    used): the module docstring's rule. Raises RequestError when no requester can be found, and with ``one_person``
    (a folder of a request for several people) also when any usable photo is not the requester's: a photo of
    someone else there may be another requester's, so the folder is sent back rather than served."""
    out = photos.copy()
    usable = (out["status"] == FaceStatus.OK.value).to_numpy()
    out["used"] = False
    out["reason"] = [f"{status}: {message}" if status != FaceStatus.OK.value else ""
                     for status, message in zip(out["status"], out["message"])]
    if usable.sum() < min_photos:
        raise RequestError(_stop(out, f"only {int(usable.sum())} usable photo(s), at least {min_photos} needed "
                                      "(config key 'request.min_photos')"))
    labels = cluster_identities(embedding_matrix(out), eps, min_samples)
    sizes = np.bincount(labels)
    largest = int(np.argmax(sizes))
    # a clear majority: the largest cluster holds more than half of the usable photos (so no other can tie it)
    if sizes[largest] < min_photos or 2 * sizes[largest] <= usable.sum():
        rows = np.flatnonzero(usable)
        for label in np.unique(labels):
            out.loc[out.index[rows[labels == label]], "reason"] = f"person {label + 1} of {len(sizes)}"
        raise RequestError(_stop(out, f"the {int(usable.sum())} usable photos show {len(sizes)} people by the "
                                      f"identity stage's rule (DBSCAN, identities.eps {eps}), the most frequent in "
                                      f"{int(sizes[largest])} photos: no one person is in at least {min_photos} "
                                      "photos and more than half of them"))
    rows = out.index[np.flatnonzero(usable)]
    mine = labels == largest
    if one_person and not mine.all():
        for label in np.unique(labels):
            out.loc[rows[labels == label], "reason"] = ("the requester" if label == largest else
                                                        f"person {label + 1} of {len(sizes)}, not the requester")
        raise RequestError(_stop(out, f"this folder of a request for several people holds {len(sizes)} people by "
                                      f"the identity stage's rule (DBSCAN, identities.eps {eps}): the requester in "
                                      f"{int(mine.sum())} photos and {int((~mine).sum())} photo(s) of someone else; "
                                      "each person's folder must hold that person alone"))
    out.loc[rows[mine], "used"] = True
    out.loc[rows[~mine], "reason"] = (f"not the same person as the other {int(mine.sum())} photos "
                                      f"(identity stage's DBSCAN rule, identities.eps {eps})")
    return out[PHOTO_COLUMNS + [c for c in out.columns if c not in PHOTO_COLUMNS]]


def _stop(photos: pd.DataFrame, problem: str) -> str:
    lines = [f"  {row.image_id}: {row.status}" + (f" ({row.reason})" if row.reason else "")
             for row in photos.itertuples()]
    return (f"forget request: {problem}. The photos:\n" + "\n".join(lines) + "\nWhat to do: put at least that many "
            "photos of the person to forget in the folder, each showing their face clearly, and remove photos of "
            "anyone else.")


def status_table(photos: pd.DataFrame) -> pd.DataFrame:
    """The per-file table of the report (no embeddings): file, sha256, status, used, reason."""
    return photos[PHOTO_COLUMNS].rename(columns={"image_id": "file"})
