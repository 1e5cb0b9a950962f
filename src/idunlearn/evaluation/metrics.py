"""Per-run metrics from scored samples (PIU Section 4 and appendix A)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .identity import accuracy, srk
from .kernel import kernel_distance

METRIC_KEYS = ["ism_forget", "ism_retain", "acc_forget", "acc_retain", "srk_identity", "anchor_ism_forget",
               "anchor_ism_retain", "detection_rate_forget", "detection_rate_retain", "kd_forget", "kd_retain",
               "quality_forget", "quality_retain"]


def run_metrics(scored: pd.DataFrame, features: np.ndarray, reference_features: np.ndarray, kd_cfg: dict) -> dict:
    """ISM (eq. 7), AccU / AccR (eqs. 8-9), this identity's own SRK (eq. 10 on its samples only, ``srk_identity``;
    the paper's SRK pools all forget identities: ``statistics.pooled_srk``), anchor ISM, detection rate, kernel
    distance to the retain-validation real images, and face quality (mean of the ``quality`` column over detected
    faces: eDifFIQA or the offline proxy, see quality.py).

    ``features``: KD features of the samples, row-aligned with ``scored``.
    """
    out = {}
    for kind in ("forget", "retain"):
        mask = (scored["kind"] == kind).to_numpy()
        part = scored[mask]
        out[f"ism_{kind}"] = float(part["own_cosine"].mean())  # eq. 7, undetected samples count 0
        out[f"acc_{kind}"] = accuracy(part["predicted_identity"], part["target_identity"])
        out[f"anchor_ism_{kind}"] = float(part["anchor_cosine"].mean())
        out[f"detection_rate_{kind}"] = float(part["detected"].mean())
        out[f"kd_{kind}"] = kernel_distance(features[mask], reference_features, kd_cfg["num_subsets"],
                                            kd_cfg["max_subset_size"], kd_cfg["seed"])
        detected = part.loc[part["detected"], "quality"]
        out[f"quality_{kind}"] = float(detected.mean()) if len(detected) else float("nan")
    out["srk_identity"] = srk(out["acc_retain"], out["acc_forget"])
    return out
