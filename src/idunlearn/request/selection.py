"""A forget request's experiment: is the person in the training data, the forget condition, the retain identity
split and the anchor (PIU eq. 6), and the dataset tables with the requester added.

In or out of the training data (the identity stage's rule): a dataset identity is the requester when the cosine
distance between its centroid and the request centroid is within the DBSCAN radius ``identities.eps``, the radius
that joins two images into one identity. The calibrated verification threshold (audit) is not used: it is set on
image pairs, and centroids, being averages, sit closer to each other than images do (on ORL, several people's nearest
other centroid is above it). Matched identities are the requester: they leave the retain sets and the anchor
candidates, and the request centroid takes their place in the centroid table (the nearest one's id is the forget
identity). A person who is not in the data gets a new identity id. Either way the forget condition is the request:
its photos are the forget-train images, and the evaluation draws its forget conditions from the same photos (a
request has no photos to hold out: all of them are to be forgotten).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..identities import centroid_matrix, identity_centroids
from ..selection import retain_identity_split, select_anchor

REQUEST_PREFIX = "request_"  # request photos' image ids in the joined tables, apart from the dataset's
_REQUEST_ANCHOR = 11  # the anchor draw's stream, apart from selection.py's streams


def request_image_ids(photos: pd.DataFrame) -> list[str]:
    """The requester's photos as image ids of the joined tables."""
    return [REQUEST_PREFIX + i for i in photos.loc[photos["used"], "image_id"]]


def request_selection(photos: pd.DataFrame, centroids: pd.DataFrame, selection_cfg: dict, eps: float, seed: int,
                      anchor_tau: float | None = None) -> dict:
    """The request's experiment in the shape of a study selection (``selection.Selection`` fields), plus
    ``in_training_data``, ``matched_identities`` (identity -> cosine), ``nearest_identity``, ``nearest_cosine`` and
    the request ``centroid``. ``photos``: ``photos.find_requester``; ``anchor_tau``: the run's own tau, if any."""
    used = photos[photos["used"]]
    emb = np.stack(used["embedding"].to_numpy()).astype(np.float64)
    centroid = np.asarray(identity_centroids(emb, np.zeros(len(emb), int))["centroid"][0], np.float64)
    ids = centroids["identity"].to_numpy().astype(int)
    cosines = centroid_matrix(centroids) @ centroid
    matched = cosines >= 1.0 - eps  # within the DBSCAN radius (cosine distance <= eps)
    nearest = int(np.argmax(cosines))
    forget = int(ids[nearest]) if matched.any() else int(ids.max()) + 1
    retain_train, retain_val = retain_identity_split(ids[~matched], selection_cfg["retain_train_fraction"], seed)
    tau, tol = anchor_tau if anchor_tau is not None else selection_cfg["anchor"]["tau"], selection_cfg["anchor"]["tol"]
    lookup = dict(zip(ids, centroid_matrix(centroids)))
    anchor, cosine, fallback, band = select_anchor(centroid, retain_train, np.stack([lookup[j] for j in retain_train]),
                                                   tau, tol, np.random.default_rng([seed, _REQUEST_ANCHOR]))
    images = request_image_ids(photos)
    return {"forget_identity": forget, "forget_train_images": images, "forget_val_images": images,
            "anchor_identity": anchor, "anchor_cosine": cosine, "anchor_fallback": fallback,
            "anchor_band_size": band, "tau": tau, "tol": tol, "seed": seed,
            "retain_train_identities": [int(j) for j in retain_train],
            "retain_val_identities": [int(j) for j in retain_val],
            "in_training_data": bool(matched.any()),
            "matched_identities": {str(int(i)): float(c) for i, c in zip(ids[matched], cosines[matched])},
            "nearest_identity": int(ids[nearest]), "nearest_cosine": float(cosines[nearest]),
            "match_min_cosine": 1.0 - eps, "centroid": centroid.astype(np.float32).tolist()}


@dataclass
class RequestWorld:
    """The dataset's tables with the requester's photos joined in (``request_world``)."""

    manifest: pd.DataFrame
    faces: pd.DataFrame
    labels: pd.DataFrame
    centroids: pd.DataFrame


def request_world(selection: dict, photos: pd.DataFrame, manifest: pd.DataFrame, faces: pd.DataFrame,
                  labels: pd.DataFrame, centroids: pd.DataFrame) -> RequestWorld:
    """The dataset tables as the unlearning, evaluation and audit code reads them, with the requester's photos as
    the forget identity's images and the request centroid as its centroid (matched identities' centroids removed, so
    that no nearer twin of the requester takes the predictions)."""
    used = photos[photos["used"]].assign(image_id=lambda f: REQUEST_PREFIX + f["image_id"])
    forget = selection["forget_identity"]
    matched = [int(i) for i in selection["matched_identities"]]
    request_centroid = pd.DataFrame([{"identity": forget, "size": len(used), "centroid": selection["centroid"]}])
    return RequestWorld(
        manifest=pd.concat([manifest, used[["image_id", "path", "sha256"]].assign(source="request")],
                           ignore_index=True),
        faces=pd.concat([faces, used[faces.columns]], ignore_index=True),
        labels=pd.concat([labels, pd.DataFrame({"image_id": used["image_id"], "identity": forget})],
                         ignore_index=True),
        centroids=pd.concat([centroids[~centroids["identity"].isin(matched)], request_centroid], ignore_index=True),
    )
