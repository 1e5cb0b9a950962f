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

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..identities import centroid_matrix, identity_centroids
from ..selection import retain_identity_split, select_anchor
from .photos import RequestError

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
    return request_selections({"": photos}, centroids, selection_cfg, eps, seed, anchor_tau)[0]


def request_selections(people: dict[str, pd.DataFrame], centroids: pd.DataFrame, selection_cfg: dict, eps: float,
                       seed: int, anchor_tau: float | None = None) -> list[dict]:
    """``request_selection`` of each person of a request (name -> ``photos.find_requester`` table; the photos'
    image ids unique across people), in order. They share one retain identity split, which leaves out every
    person's matched identities, so no requester is retained or an anchor; each person's anchor is drawn from its own
    stream (the first person's is a one-person request's). Two people who are one person by the identity stage's
    rule (their request centroids, or a dataset identity both match) stop the request naming both."""
    matrix, ids = centroid_matrix(centroids), centroids["identity"].to_numpy().astype(int)
    names = list(people)
    request_centroids = []
    for name in names:
        used = people[name][people[name]["used"]]
        emb = np.stack(used["embedding"].to_numpy()).astype(np.float64)
        request_centroids.append(np.asarray(identity_centroids(emb, np.zeros(len(emb), int))["centroid"][0],
                                            np.float64))
    cosines = [matrix @ c for c in request_centroids]
    matched = [c >= 1.0 - eps for c in cosines]  # within the DBSCAN radius (cosine distance <= eps)
    for (a, ca, ma), (b, cb, mb) in itertools.combinations(zip(names, request_centroids, matched), 2):
        shared = ids[ma & mb]
        if float(ca @ cb) >= 1.0 - eps or len(shared):
            raise RequestError(f"forget request: the folders of {a!r} and {b!r} show the same person by the "
                               f"identity stage's rule (request centroids at cosine {float(ca @ cb):.3f}, at least "
                               f"{1.0 - eps:.2f} is one person; dataset identities both match: {shared.tolist()}); "
                               "put each person's photos in one folder")
    out_of_data = iter(range(int(ids.max()) + 1, int(ids.max()) + 1 + len(names)))
    anyone = np.any(matched, axis=0)
    retain_train, retain_val = retain_identity_split(ids[~anyone], selection_cfg["retain_train_fraction"], seed)
    tau, tol = anchor_tau if anchor_tau is not None else selection_cfg["anchor"]["tau"], selection_cfg["anchor"]["tol"]
    lookup = dict(zip(ids, matrix))
    selections = []
    for k, (name, centroid, cos, mine) in enumerate(zip(names, request_centroids, cosines, matched)):
        nearest = int(np.argmax(cos))
        forget = int(ids[nearest]) if mine.any() else next(out_of_data)
        stream = [seed, _REQUEST_ANCHOR] + ([k] if k else [])
        anchor, cosine, fallback, band = select_anchor(centroid, retain_train,
                                                       np.stack([lookup[j] for j in retain_train]), tau, tol,
                                                       np.random.default_rng(stream))
        images = request_image_ids(people[name])
        selections.append({
            "forget_identity": forget, "forget_train_images": images, "forget_val_images": images,
            "anchor_identity": anchor, "anchor_cosine": cosine, "anchor_fallback": fallback,
            "anchor_band_size": band, "tau": tau, "tol": tol, "seed": seed,
            "retain_train_identities": [int(j) for j in retain_train],
            "retain_val_identities": [int(j) for j in retain_val],
            "in_training_data": bool(mine.any()),
            "matched_identities": {str(int(i)): float(c) for i, c in zip(ids[mine], cos[mine])},
            "nearest_identity": int(ids[nearest]), "nearest_cosine": float(cos[nearest]),
            "match_min_cosine": 1.0 - eps, "centroid": centroid.astype(np.float32).tolist()})
    return selections


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


def request_worlds(selections: list[dict], people: list[pd.DataFrame], manifest: pd.DataFrame, faces: pd.DataFrame,
                   labels: pd.DataFrame, centroids: pd.DataFrame) -> RequestWorld:
    """``request_world`` with every person of a request joined in, one after another (``request_selections``)."""
    world = RequestWorld(manifest, faces, labels, centroids)
    for selection, photos in zip(selections, people, strict=True):
        world = request_world(selection, photos, world.manifest, world.faces, world.labels, world.centroids)
    return world
