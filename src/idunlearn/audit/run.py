"""One audit job: generate the probe samples of one forget identity from one generator state, score them, and
reduce them (with the evaluation's own samples) to tidy audit rows.

Row columns: probe, setting, metric, value, ci_low, ci_high, n. Shares carry exact binomial (Clopper-Pearson)
intervals over the samples or conditions they count; means carry Student-t intervals over samples.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..evaluation.samples import generate_samples, score_samples
from ..evaluation.statistics import mean_ci
from ..faces.analyser import FaceAnalyser
from ..models.generator import IdentityGenerator
from ..runlog import logs_duration
from .probes import ProbeSet
from .verification import clopper_pearson, leak_at_k, verified

ROW_COLUMNS = ["probe", "setting", "metric", "value", "ci_low", "ci_high", "n"]


@logs_duration("probe samples (leak, photo, neighbourhood)")
def score_probes(generator: IdentityGenerator, analyser: FaceAnalyser, probes: ProbeSet, centroids: pd.DataFrame,
                 cfg: dict) -> tuple[pd.DataFrame, np.ndarray]:
    """Generate and score every probe sample (``cfg``: the evaluation's sampler settings). Returns (scored, images)."""
    images = generate_samples(generator, probes.embeddings, probes.table["seed"], cfg["steps"], cfg["guidance"],
                              cfg["batch_size"])
    return score_samples(probes.table, images, analyser, centroids, anchor_identity=None), images


def share_row(probe: str, setting: str, metric: str, flags) -> dict:
    flags = np.asarray(flags, bool)
    low, high = clopper_pearson(int(flags.sum()), len(flags))
    return {"probe": probe, "setting": setting, "metric": metric, "value": float(flags.mean()) if len(flags) else
            float("nan"), "ci_low": low, "ci_high": high, "n": len(flags)}


def mean_row(probe: str, setting: str, metric: str, values) -> dict:
    values = np.asarray(values, np.float64)
    mean, half = mean_ci(values)
    return {"probe": probe, "setting": setting, "metric": metric, "value": mean, "ci_low": mean - half,
            "ci_high": mean + half, "n": len(values)}


def probe_rows(scored: pd.DataFrame, tau: float, ks) -> list[dict]:
    """FA (share verified as the forget identity) and ISM per probe setting; Leak@k; the worst photo."""
    is_verified = verified(scored, tau)
    rows = []
    for (probe, setting), part in scored.groupby(["probe", "setting"], sort=True):
        flags = is_verified[part.index]
        rows += [share_row(probe, setting, "fa", flags), mean_row(probe, setting, "ism", part["own_cosine"])]
    leak = scored["probe"] == "leak"
    if leak.any():
        part = scored[leak]
        n_conditions = part["condition"].nunique()
        for k, value in leak_at_k(part, is_verified[leak.to_numpy()], ks).items():
            low, high = clopper_pearson(int(round(value * n_conditions)), n_conditions)
            rows.append({"probe": "leak", "setting": f"k={k}", "metric": "leak", "value": value, "ci_low": low,
                         "ci_high": high, "n": n_conditions})
    photo = scored["probe"] == "photo"
    if photo.any():
        per_photo = pd.Series(is_verified[photo.to_numpy()], index=scored.index[photo]).groupby(
            scored.loc[photo, "condition"]).mean()
        worst = per_photo.idxmax()
        rows.append({"probe": "photo", "setting": f"worst:{worst}", "metric": "fa", "value": float(per_photo.max()),
                     "ci_low": float("nan"), "ci_high": float("nan"), "n": int(len(per_photo))})
    return rows


def evaluation_rows(samples: pd.DataFrame, tau: float) -> list[dict]:
    """Calibrated verification of the evaluation's own samples: FA of the forget samples (verified as the forget
    identity), the verification rate of the retain samples (verified as their own identity), the forget ISM (the
    attack's control bound reads it from the original model) and the retain ISM (PIU eq. 7 over the retain samples:
    the audit's retain target compares runs by it)."""
    is_verified = verified(samples, tau)
    forget = (samples["kind"] == "forget").to_numpy()
    return [share_row("evaluation", kind, "fa" if kind == "forget" else "verified", is_verified[mask])
            for kind, mask in (("forget", forget), ("retain", ~forget))] + [
        mean_row("evaluation", kind, "ism", samples.loc[mask, "own_cosine"])
        for kind, mask in (("forget", forget), ("retain", ~forget))]


def locality_rows(before: pd.DataFrame, after: pd.DataFrame, centroids: pd.DataFrame, forget: int) -> list[dict]:
    """Per retain-validation identity of the evaluation: the ISM change (after - before, same conditions and noise)
    and its centroid's cosine to the forget centroid (collateral on look-alikes against strangers)."""
    cents = dict(zip(centroids["identity"], np.stack(centroids["centroid"].to_numpy()).astype(np.float64)))
    centre = cents[forget] / np.linalg.norm(cents[forget])
    rows = []
    keep_b, keep_a = before[before["kind"] == "retain"], after[after["kind"] == "retain"]
    paired = keep_b.set_index("sample_id")["own_cosine"].to_frame("before").join(
        keep_a.set_index("sample_id")["own_cosine"].rename("after"), how="inner")
    paired["identity"] = keep_b.set_index("sample_id").loc[paired.index, "target_identity"]
    for identity, part in paired.groupby("identity", sort=True):
        cosine = float(cents[identity] @ centre / np.linalg.norm(cents[identity]))
        rows.append({**mean_row("locality", str(identity), "ism_delta", part["after"] - part["before"]),
                     "cosine": cosine})
    return rows


def audit_rows(scored: pd.DataFrame, evaluation: pd.DataFrame, before: pd.DataFrame | None,
               centroids: pd.DataFrame, forget: int, tau: float, ks, extra: list[dict] = ()) -> pd.DataFrame:
    """All rows of one audit job; ``before`` (the original model's evaluation samples) is None for the original
    model itself, which has no locality rows; ``extra``: rows of further probes (relearning)."""
    rows = probe_rows(scored, tau, ks) + evaluation_rows(evaluation, tau) + list(extra)
    if before is not None:
        rows += locality_rows(before, evaluation, centroids, forget)
    frame = pd.DataFrame.from_records(rows)
    if "cosine" not in frame:
        frame["cosine"] = np.nan
    return frame[ROW_COLUMNS + ["cosine"]]
