import numpy as np
import pytest
from PIL import Image

from idunlearn.pictures import sample_grid


def _images(k, value, size=32):
    return np.full((k, size, size, 3), value, dtype=np.uint8)


def _grid_size(path, n_rows, n_cols, with_captions):
    rows = [(f"row {r}", _images(n_cols if r else n_cols - 1, 40 * r)) for r in range(n_rows)]
    captions = [[f"cos {0.1 * c:.2f}" for c in range(len(images))] for _, images in rows] if with_captions else None
    sample_grid(rows, path, col_labels=[f"seed {c}" for c in range(n_cols)], captions=captions)
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.load()
        return image.size


def test_sample_grid_writes_png_with_rows_by_cols_aspect(tmp_path):
    wide_w, wide_h = _grid_size(tmp_path / "forget.png", n_rows=3, n_cols=8, with_captions=True)
    tall_w, tall_h = _grid_size(tmp_path / "retain.png", n_rows=6, n_cols=2, with_captions=False)
    # figure size follows the grid (plus a row-label margin), so width / height tracks n_cols / n_rows
    assert wide_w / wide_h == pytest.approx(8 / 3, rel=0.2)
    assert tall_w / tall_h == pytest.approx(2 / 6, rel=0.35)
    assert wide_w > wide_h and tall_h > tall_w
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, no temporary left behind


def test_sample_grid_rejects_mismatched_captions_and_bad_images(tmp_path):
    with pytest.raises(ValueError):
        sample_grid([("original", _images(2, 0))], tmp_path / "a.png", captions=[["only one"]])
    with pytest.raises(ValueError):
        sample_grid([("gray", np.zeros((2, 32, 32), np.uint8))], tmp_path / "b.png")
