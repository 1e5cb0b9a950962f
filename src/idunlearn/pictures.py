"""Figures: nearest-neighbour similarity histogram (PIU Fig. 7), per-identity contact sheets and sample grids
(PIU Figs. 4-5)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from .io import save_figure  # noqa: E402


def plot_nn_histogram(hist: dict, path: str | Path, eps: float | None = None) -> None:
    """Histogram of each sample's nearest-neighbour cosine, with its modes and the DBSCAN threshold (1 - eps)."""
    edges, counts = hist["edges"], hist["counts"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="#4c72b0", edgecolor="white")
    for key, style in (("mode_low", "--"), ("mode_high", "--"), ("valley", ":")):
        if np.isfinite(hist[key]):
            ax.axvline(hist[key], color="k", linestyle=style, label=f"{key.replace('_', ' ')} {hist[key]:.2f}")
    if eps is not None:
        ax.axvline(1 - eps, color="#c44e52", label=f"DBSCAN 1 - eps = {1 - eps:.2f}")
    ax.set_xlabel("cosine similarity to nearest neighbour")
    ax.set_ylabel("samples")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def _bare_axes(ax) -> None:
    """An image cell: no ticks, no frame (axis labels still show, for row names and captions)."""
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def contact_sheet(rows: list[tuple[str, list[str]]], path: str | Path, thumb: int = 64, max_per_row: int = 10) -> None:
    """A labelled grid: one row of thumbnails per (label, image paths)."""
    fig, axes = plt.subplots(len(rows), max_per_row, figsize=(max_per_row * 0.9, len(rows) * 1.1), squeeze=False)
    for r, (label, paths) in enumerate(rows):
        for c in range(max_per_row):
            ax = axes[r, c]
            _bare_axes(ax)
            if c < len(paths):
                with Image.open(paths[c]) as image:
                    image = image.convert("RGB")
                    image.thumbnail((thumb, thumb))
                    ax.imshow(np.asarray(image))
        axes[r, 0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def identity_sheet(selection: dict, labels, manifest, path: str | Path, per_row: int = 10) -> None:
    """Forget-train, forget-validation and anchor images of one experiment, one row each."""
    paths = manifest.set_index("image_id")["path"]
    anchor_images = sorted(labels.loc[labels["identity"] == selection["anchor_identity"], "image_id"])
    rows = [
        (f"forget {selection['forget_identity']}\ntrain", [paths[i] for i in selection["forget_train_images"]]),
        ("forget\nvalidation", [paths[i] for i in selection["forget_val_images"]]),
        (f"anchor {selection['anchor_identity']}\ncos {selection['anchor_cosine']:.2f}"
         + (" (fallback)" if selection["anchor_fallback"] else ""), [paths[i] for i in anchor_images]),
    ]
    contact_sheet(rows, path, max_per_row=per_row)


def sample_grid(rows: list[tuple[str, np.ndarray]], path: str | Path, col_labels: list[str] | None = None,
                captions: list[list[str]] | None = None, cell: float = 1.3) -> None:
    """A labelled grid of generated images in the style of PIU Figs. 4-5.

    ``rows``: (label, images) pairs, images a (k, H, W, 3) uint8 array; shorter rows leave blank cells.
    ``col_labels``: optional titles over the columns. ``captions``: optional text under each image (for instance
    the cosine to the original identity), one list per row with one string per image. ``cell``: inches per image."""
    n_cols = max([len(images) for _, images in rows] + [len(col_labels or [])])
    if captions is not None and [len(c) for c in captions] != [len(images) for _, images in rows]:
        raise ValueError("captions must hold one string per image, row by row")
    for label, images in rows:
        if images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(f"row {label!r}: expected (k, H, W, 3) images, got shape {images.shape}")
    # inches: a caption line under each row, a row-label margin on the left, a column-title margin on top
    row_height = cell + (0.2 if captions is not None else 0.0)
    fig, axes = plt.subplots(len(rows), n_cols, figsize=(n_cols * cell + 0.8, len(rows) * row_height + 0.3),
                             squeeze=False)
    for r, (label, images) in enumerate(rows):
        for c in range(n_cols):
            ax = axes[r, c]
            _bare_axes(ax)
            if c < len(images):
                ax.imshow(images[c])
                if captions is not None:
                    ax.set_xlabel(captions[r][c], fontsize=7)
        axes[r, 0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
    for c, title in enumerate(col_labels or []):
        axes[0, c].set_title(title, fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=150)
    plt.close(fig)


def _samples_of(images_npz, samples, kind: str, per_row: int) -> tuple[np.ndarray, list[str]]:
    """The first ``per_row`` samples of ``kind`` (forget or retain) of one evaluation (its images.npz and
    samples.parquet) with captions: each sample's cosine to its own identity."""
    import pandas as pd

    scored = pd.read_parquet(samples)
    mask = (scored["kind"] == kind).to_numpy()
    cos = scored.loc[mask, "own_cosine"].to_numpy()[:per_row]
    return np.load(images_npz)["samples"][mask][:per_row], [f"{c:.2f}" for c in cos]


def before_after_grids(before_npz, before_samples, after_npz, after_samples, run: str, forget_path, retain_path,
                       per_row: int = 8) -> None:
    """PIU Fig. 4 (forget: original, anchor and unlearned rows) and Fig. 5 (retain: before and after rows), same
    conditions and initial noise in each column; captions give the cosine to the sample's own identity."""
    f_before, c_before = _samples_of(before_npz, before_samples, "forget", per_row)
    f_after, c_after = _samples_of(after_npz, after_samples, "forget", per_row)
    anchor = np.load(before_npz)["anchor"][:per_row]
    sample_grid([("original", f_before), ("anchor", anchor), (run, f_after)], forget_path,
                captions=[c_before, [""] * len(anchor), c_after])
    r_before, rc_before = _samples_of(before_npz, before_samples, "retain", per_row)
    r_after, rc_after = _samples_of(after_npz, after_samples, "retain", per_row)
    sample_grid([("before", r_before), (run, r_after)], retain_path, captions=[rc_before, rc_after])


def compared_grid(evaluations: list[tuple[str, str, str]], kind: str, path, per_row: int = 8) -> None:
    """One row per evaluation (label, images.npz, samples.parquet) of the same identity, conditions and initial
    noise: the original, a rebuilt generator and the never-trained reference side by side, ``kind`` samples."""
    rows = [(label, *_samples_of(npz, samples, kind, per_row)) for label, npz, samples in evaluations]
    sample_grid([(label, images) for label, images, _ in rows], path, captions=[c for _, _, c in rows])


def rebuild_curve(curve, path) -> None:
    """The rebuild's compute-robustness curve (tables/rebuild_curve.csv): forget and retain ISM of each rebuilt
    generator against its share of retraining's compute, one line per run (alpha), with `retrain`'s forget ISM
    (+ 0.05, the target) and 0.95 x PIU's retain ISM (the target) as bars."""
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), sharex=True)
    for (run, part), marker in zip(curve.groupby("run"), "osd^v"):
        part = part.sort_values("fraction_of_retrain")
        alpha = part["alpha"].iloc[0]
        for ax, column in zip(axes, ("forget_ism", "retain_ism")):
            ax.plot(part["fraction_of_retrain"], part[column], marker=marker, label=f"{run} (alpha {alpha:g})")
    axes[0].axhline(curve["forget_ism_retrain"].iloc[0] + 0.05, color="grey", ls="--", label="retrain + 0.05")
    axes[1].axhline(0.95 * curve["retain_ism_piu"].iloc[0], color="grey", ls="--", label="0.95 x PIU")
    for ax, title in zip(axes, ("forget ISM (lower removes more)", "retain-validation ISM")):
        ax.set_xlabel("compute, share of retraining")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=150)
    plt.close(fig)
