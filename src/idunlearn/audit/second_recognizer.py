"""Independent second recognizer (forgetting audit, part 7): every sample the audit verifies with the first
recognizer is verified again with a recognizer that no unlearning method and no attack uses (``faces.dlib_descriptor``),
against its own centroids of the real identities and its own threshold at the same false-accept rate. A method
that only fooled the first recognizer (WID trains through it; the attack may pull through it) shows FA under the
first recognizer that the second does not confirm.

The real images are prepared exactly like generated ones (``experiment.real_pixels`` at the generator's resolution
and crop policy, then the generator's output convention), so real and generated faces reach the descriptor alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..evaluation.generation import to_uint8_images
from ..evaluation.identity import identity_similarity, nearest_centroid
from ..experiment import real_pixels
from ..faces.dlib_descriptor import DlibDescriptor
from ..identities import centroid_matrix
from ..models.generator import IdentityGenerator, unit_rgb
from ..runlog import logs_duration
from .run import mean_row, share_row
from .verification import verified


def reference_descriptors(descriptor: DlibDescriptor, generator: IdentityGenerator, manifest: pd.DataFrame,
                          faces: pd.DataFrame, labels: pd.DataFrame, batch_size: int = 64) -> pd.DataFrame:
    """Descriptors of every embedded real face, prepared like a generated image: image_id, identity, detected,
    embedding (zeros where the descriptor found no face)."""
    ids = faces.loc[faces["status"] == "ok", "image_id"].tolist()
    parts = []
    for start in range(0, len(ids), batch_size):
        chunk = ids[start:start + batch_size]
        emb, detected = descriptor.embed(to_uint8_images(unit_rgb(real_pixels(generator, manifest, faces, chunk))))
        parts.append(pd.DataFrame({"image_id": chunk, "detected": detected, "embedding": list(emb)}))
    table = pd.concat(parts, ignore_index=True)
    table["identity"] = labels.set_index("image_id").loc[table["image_id"], "identity"].to_numpy()
    return table


def reference_centroids(reference: pd.DataFrame) -> pd.DataFrame:
    """Per identity: the normalised mean descriptor of its detected real faces (as the first recognizer's centroids,
    PIU eq. 7's c_i) and how many faces it rests on."""
    found = reference[reference["detected"]]
    rows = []
    for identity, part in found.groupby("identity", sort=True):
        mean = np.stack(part["embedding"].to_numpy()).mean(0)
        rows.append({"identity": identity, "centroid": mean / np.linalg.norm(mean), "size": len(part)})
    return pd.DataFrame(rows)


@dataclass
class SecondRecognizer:
    """The descriptor with its centroids and threshold tau (at the audit's false-accept rate)."""

    descriptor: DlibDescriptor
    centroids: pd.DataFrame
    tau: float

    def score(self, target_identities, images: np.ndarray) -> pd.DataFrame:
        """Per image: detected, cosine to the target identity's centroid, nearest centroid (the columns
        ``verification.verified`` reads)."""
        emb, detected = self.descriptor.embed(images)
        ids, cents = self.centroids["identity"].to_numpy(), centroid_matrix(self.centroids)
        targets = np.asarray(target_identities)
        index = pd.Index(ids).get_indexer(targets)
        if (index < 0).any():
            missing = sorted(int(t) for t in set(targets[index < 0]))
            raise ValueError(f"the second recognizer has no centroid for identities {missing}: none of their real "
                             "faces was described; use audit.second_recognizer.mode 'aligned' for face crops or "
                             "check the images")
        own = cents[index]
        return pd.DataFrame({"target_identity": targets, "detected": detected,
                             "own_cosine": identity_similarity(emb, own, detected),
                             "predicted_identity": nearest_centroid(emb, ids, cents, detected)})

    def rows(self, probe: str, setting: str, target_identities, images: np.ndarray) -> list[dict]:
        """FA (share verified as the target identity) and ISM under the second recognizer: metrics ``fa_second``
        and ``ism_second`` beside the first recognizer's ``fa`` and ``ism`` of the same samples."""
        scored = self.score(target_identities, images)
        return [share_row(probe, setting, "fa_second", verified(scored, self.tau)),
                mean_row(probe, setting, "ism_second", scored["own_cosine"])]


@logs_duration("second recognizer (probes)")
def second_probe_rows(second: SecondRecognizer, scored: pd.DataFrame, images: np.ndarray) -> list[dict]:
    """``fa_second`` and ``ism_second`` per probe setting of the probe samples (``scored`` rows in ``images``
    order; the Leak@k, photo and neighbourhood probes)."""
    rows = []
    for (probe, setting), part in scored.reset_index(drop=True).groupby(["probe", "setting"], sort=True):
        rows += second.rows(probe, setting, part["target_identity"], images[part.index.to_numpy()])
    return rows


@logs_duration("second recognizer (evaluation samples)")
def second_evaluation_rows(second: SecondRecognizer, samples: pd.DataFrame, arrays) -> list[dict]:
    """The evaluation's own forget samples (its samples table and images.npz arrays) under the second recognizer."""
    forget = samples[samples["kind"] == "forget"]
    order = pd.Index(np.asarray(arrays["sample_ids"], str)).get_indexer(forget["sample_id"].astype(str))
    if (order < 0).any():
        raise ValueError("the evaluation's images.npz lacks some of its forget samples; rerun evaluate for this job")
    return second.rows("evaluation", "forget", forget["target_identity"], np.asarray(arrays["samples"])[order])
