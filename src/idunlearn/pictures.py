"""Figures: nearest-neighbour similarity histogram (PIU Fig. 7) and per-identity contact sheets."""

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


def contact_sheet(rows: list[tuple[str, list[str]]], path: str | Path, thumb: int = 64, max_per_row: int = 10) -> None:
    """A labelled grid: one row of thumbnails per (label, image paths)."""
    fig, axes = plt.subplots(len(rows), max_per_row, figsize=(max_per_row * 0.9, len(rows) * 1.1), squeeze=False)
    for r, (label, paths) in enumerate(rows):
        for c in range(max_per_row):
            ax = axes[r, c]
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_visible(False)
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
