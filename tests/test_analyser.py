import numpy as np
import pytest
from PIL import Image

from idunlearn.data import acquire_folder
from idunlearn.faces.align import ARCFACE_TEMPLATE_112, align_face, similarity_transform
from idunlearn.faces.analyser import load_rgb

from badfiles import StubAnalyser, write_bad_files


def test_similarity_transform_recovers_a_known_transform():
    rng = np.random.default_rng(0)
    src = rng.uniform(0, 100, (5, 2))
    angle, scale, shift = 0.3, 1.7, np.array([5.0, -3.0])
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    dst = scale * src @ rot.T + shift
    m = similarity_transform(src, dst)
    np.testing.assert_allclose(m[:, :2], scale * rot, atol=1e-9)
    np.testing.assert_allclose(m[:, 2], shift, atol=1e-9)


def test_align_is_identity_on_template_landmarks():
    image = np.random.default_rng(1).integers(0, 255, (112, 112, 3), dtype=np.uint8)
    # identity warp up to bilinear rounding of a 1e-15 shift
    assert np.abs(align_face(image, ARCFACE_TEMPLATE_112).astype(int) - image).max() <= 1


def test_align_undoes_a_shift_and_scale():
    base = np.random.default_rng(2).integers(0, 255, (112, 112, 3), dtype=np.uint8)
    big = np.asarray(Image.fromarray(base).resize((224, 224), Image.NEAREST))
    canvas = np.zeros((300, 300, 3), np.uint8)
    canvas[40:264, 30:254] = big
    out = align_face(canvas, ARCFACE_TEMPLATE_112 * 2 + [30, 40])
    # bilinear sampling of a nearest-upsampled image: interior pixels match the original closely
    assert np.abs(out[8:-8, 8:-8].astype(int) - base[8:-8, 8:-8]).mean() < 25


def test_cmyk_and_grey_images_load_as_rgb(tmp_path):
    Image.new("CMYK", (20, 10), (0, 255, 255, 0)).save(tmp_path / "c.jpg")
    Image.new("L", (20, 10), 128).save(tmp_path / "g.pgm")
    assert load_rgb(tmp_path / "c.jpg").shape == (10, 20, 3)
    assert load_rgb(tmp_path / "g.pgm").shape == (10, 20, 3)


def test_bad_files_become_status_rows(tmp_path):
    expected = write_bad_files(tmp_path / "bad")
    face = np.zeros((120, 120, 3), np.uint8)
    face[20:100, 20:100] = (255, 0, 255)
    Image.fromarray(face).save(tmp_path / "bad" / "face.png")
    small = np.zeros((120, 120, 3), np.uint8)
    small[50:60, 50:60] = (255, 0, 255)
    Image.fromarray(small).save(tmp_path / "bad" / "tiny_face.png")
    expected.update({"face.png": {"ok"}, "tiny_face.png": {"too_small"}})
    manifest = acquire_folder(tmp_path / "bad")
    table = StubAnalyser(min_image_size=16, min_face_size=20).analyse(
        zip(manifest["image_id"], manifest["path"]), batch_size=2, progress=False)
    got = dict(zip(table["image_id"], table["status"]))
    assert set(got) == set(expected)
    for image_id, statuses in expected.items():
        assert got[image_id] in statuses, (image_id, got[image_id])
    ok = table[table["status"] == "ok"].iloc[0]
    assert np.linalg.norm(ok["embedding"]) == pytest.approx(1.0, abs=1e-6) and len(ok["landmarks"]) == 10


def test_zero_embedding_is_flagged(tmp_path):
    class ZeroAnalyser(StubAnalyser):
        def embed(self, faces):
            return np.zeros((len(faces), 3))

    face = np.zeros((120, 120, 3), np.uint8)
    face[20:100, 20:100] = (255, 0, 255)
    Image.fromarray(face).save(tmp_path / "face.png")
    table = ZeroAnalyser().analyse([("face", tmp_path / "face.png")], progress=False)
    assert table["status"].tolist() == ["bad_embedding"] and table["embedding"].isna().all()
