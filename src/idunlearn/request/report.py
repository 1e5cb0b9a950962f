"""The one-page forgetting report of a request, as Markdown (report.md) and reStructuredText (the HTML report's
landing page): who, which photos (and which not, and why), the anchor, what was forgotten (FA, Leak@k, ISM before and
after), what it cost everyone else, and the shipped model's hashes."""

from __future__ import annotations

import numpy as np
import pandas as pd

Table = list[list[str]]  # header row first
Section = tuple[str, list]  # heading, blocks (a paragraph string or a Table)


def _share(rows: pd.DataFrame, probe: str, setting: str, metric: str) -> str:
    """One audit row's value with its interval, '-' when the probe did not run."""
    row = rows[(rows["probe"] == probe) & (rows["setting"] == setting) & (rows["metric"] == metric)]
    if row.empty:
        return "-"
    value, low, high = row.iloc[0][["value", "ci_low", "ci_high"]]
    return f"{value:.2f}" if np.isnan(low) else f"{value:.2f} ({low:.2f}-{high:.2f})"


def _who(selection: dict, photos: pd.DataFrame, folder: str) -> str:
    n_used = int(photos["used"].sum())
    person = f"The person in {n_used} of the {len(photos)} files of `{folder}`"
    if selection["in_training_data"]:
        matched = ", ".join(f"{i} (cosine {c:.3f})" for i, c in selection["matched_identities"].items())
        return (f"{person}: in the training data as identity {selection['forget_identity']} (dataset identities "
                f"whose centroid is within the identity stage's radius of the request centroid, cosine at least "
                f"{selection['match_min_cosine']:.2f}: {matched}). They left the retain sets and the anchor "
                "candidates; the request centroid takes their place.")
    return (f"{person}: not in the training data (the nearest dataset identity, {selection['nearest_identity']}, "
            f"is at cosine {selection['nearest_cosine']:.3f} to the request centroid, below the identity stage's "
            f"{selection['match_min_cosine']:.2f}). The request centroid is the forget condition, as identity "
            f"{selection['forget_identity']} of the request's tables.")


def request_report(name: str, folder: str, photos: pd.DataFrame, selection: dict, run_name: str, run: dict,
                   metrics: tuple[dict, dict], rows: tuple[pd.DataFrame, pd.DataFrame], verification: dict,
                   manifest: dict) -> list[Section]:
    """The report's sections. ``photos``: the status table (photos.status_table); ``metrics``, ``rows``: the
    evaluation metrics and audit rows of the (original, unlearned) model; ``manifest``: the export's hashes."""
    rejected = photos[~photos["used"]]
    photo_table = [["file", "status", "used", "why not", "sha256"]] + [
        [r.file, r.status, "yes" if r.used else "no", r.reason or "", r.sha256[:16]] for r in photos.itertuples()]
    rejected_text = ("Rejected: " + "; ".join(f"`{r.file}`: {r.reason}" for r in rejected.itertuples()) + "."
                     if len(rejected) else "Every file was used.")
    anchor = (f"Anchor (PIU eq. 6): identity {selection['anchor_identity']}, cosine {selection['anchor_cosine']:.3f} "
              f"to the request centroid, "
              + (f"nearest to tau {selection['tau']} (the band tau +- {selection['tol']} is empty: fallback)"
                 if selection["anchor_fallback"] else
                 f"drawn uniformly from the identities within {selection['tol']} of tau {selection['tau']} "
                 f"({selection['anchor_band_size']})")
              + f", among the {len(selection['retain_train_identities'])} retain-train identities.")
    before, after = metrics
    ks = sorted(int(s[2:]) for s in rows[0].loc[rows[0]["probe"] == "leak", "setting"] if s.startswith("k="))
    forget_table = [["", "original model", "unlearned model"],
                    ["FA, evaluation forget samples", *(_share(r, "evaluation", "forget", "fa") for r in rows)],
                    *[[f"Leak@{k}", *(_share(r, "leak", f"k={k}", "leak") for r in rows)] for k in ks],
                    ["photo FA (each request photo alone)", *(_share(r, "photo", "val", "fa") for r in rows)],
                    ["forget ISM (to the request centroid)", *(f"{m['ism_forget']:.3f}" for m in metrics)],
                    ["forget face-detection rate", *(f"{m['detection_rate_forget']:.2f}" for m in metrics)]]
    locality = rows[1][rows[1]["probe"] == "locality"]
    worst = locality.loc[locality["value"].idxmin()] if len(locality) else None
    retain_table = [["", "original model", "unlearned model"],
                    ["retain ISM (retain-validation identities)", *(f"{m['ism_retain']:.3f}" for m in metrics)],
                    ["retain samples verified", *(_share(r, "evaluation", "retain", "verified") for r in rows)],
                    ["SRK (PIU eq. 10)", *(f"{m['srk_identity']:.2f}" for m in metrics)],
                    ["KD to real retain-validation images", *(f"{m['kd_retain']:.2f}" for m in metrics)],
                    ["retain face quality", *(f"{m['quality_retain']:.3f}" for m in metrics)]]
    retain_text = (f"Retain ISM changed by {after['ism_retain'] - before['ism_retain']:+.3f}"
                   + (f"; the largest drop of one retain-validation identity was {worst['value']:+.3f} (identity "
                      f"{worst['setting']}, centroid at cosine {worst['cosine']:.2f} to the request's)"
                      if worst is not None else "") + ".")
    steps = run.get("steps")
    model_text = (f"Run `{run_name}` (method {run['method']}, {steps} steps, regime {run['regime']}). "
                  f"Base UNet sha256 `{manifest['base_unet_sha256']}`; result sha256 "
                  f"`{manifest['result_unet_sha256']}` (over the weights: {manifest['hash']}). Files: `unet/` "
                  "(diffusers folder), `delta.safetensors` (the changed parameters, applied to the base by "
                  "`python -m idunlearn apply-delta`), `manifest.json`.")
    verification_text = (f"A sample is verified as the person when a face is found, its cosine to the request "
                         f"centroid is at least tau {verification['tau']:.3f} (false-accept rate "
                         f"{verification['far_target']:.0%} on impostor pairs of the dataset's real images) and no "
                         "other centroid is nearer. FA: share of samples verified; Leak@k: share of conditions "
                         "(mixtures of the request photos) with any of k seeds verified; 95% Clopper-Pearson "
                         "intervals.")
    return [(f"Forget request `{name}`", [_who(selection, photos, folder)]),
            ("Photos", [photo_table, rejected_text]),
            ("Anchor", [anchor]),
            ("What was forgotten", [forget_table, verification_text]),
            ("What it cost everyone else", [retain_table, retain_text]),
            ("The model", [model_text])]


def to_markdown(sections: list[Section]) -> str:
    lines = []
    for level, (heading, blocks) in enumerate(sections):
        lines += [("# " if level == 0 else "## ") + heading, ""]
        for block in blocks:
            if isinstance(block, str):
                lines += [block, ""]
            else:
                cells = [[str(c).replace("|", "\\|") for c in row] for row in block]
                lines += ["| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(cells[0])]
                lines += ["| " + " | ".join(row) + " |" for row in cells[1:]] + [""]
    return "\n".join(lines)


def to_rst(sections: list[Section]) -> str:
    """The same sections in reStructuredText, headings one level below the report's page title."""
    lines = []
    for level, (heading, blocks) in enumerate(sections):
        text = heading.replace("`", "")
        lines += [text, ("-" if level == 0 else "~") * len(text), ""]
        for block in blocks:
            if isinstance(block, str):
                lines += [block.replace("`", "``"), ""]
            else:
                lines += [".. csv-table::", "   :header-rows: 1", ""]
                lines += ["   " + ", ".join('"' + str(c).replace('"', '""') + '"' for c in row) for row in block]
                lines += [""]
    return "\n".join(lines)
