"""Bad inputs beyond bad image files (those are in test_analyser.py and test_workflow.py): identities with one image,
NaN embeddings, no anchor candidate, missing model files, a changed-parameters file of another model, and a config
key of the wrong type through Snakemake. Each must fail with a message that names the thing and says what to do, or
be handled (documented behaviour), never crash somewhere later."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from idunlearn.assets import AssetError
from idunlearn.config import ConfigError, validate_config
from idunlearn.evaluation.samples import evaluation_set
from idunlearn.experiment import unlearning_data
from idunlearn.faces.offline import OfflineFaceAnalyser
from idunlearn.identities import identity_centroids, l2_normalise
from idunlearn.models.mini import build_mini_generator
from idunlearn.selection import select_anchor, select_experiments, split_count
from idunlearn.unlearning.runner import apply_changed_parameters, save_changed_parameters

from badfiles import StubAnalyser
from tiny_world import TINY


def _world(sizes: list[int], dim: int = 16, seed: int = 0):
    """faces table, labels and centroids of identities with the given numbers of images."""
    rng = np.random.default_rng(seed)
    rows, ids = [], []
    for ident, n in enumerate(sizes):
        centre = rng.standard_normal(dim)
        for k in range(n):
            e = centre + 0.1 * rng.standard_normal(dim)
            rows.append({"image_id": f"img_{ident:03d}_{k:02d}", "status": "ok",
                         "embedding": (e / np.linalg.norm(e)).astype(np.float32).tolist()})
            ids.append(ident)
    faces = pd.DataFrame(rows)
    labels = pd.DataFrame({"image_id": faces["image_id"], "identity": ids})
    return faces, labels, identity_centroids(np.stack(faces["embedding"]), np.array(ids))


def _selection_cfg(**over):
    return validate_config({"selection": {"n_forget": 2, "anchor": {"tau": 0.2, "tol": 0.05}, **over}})["selection"]


# --- identities with one image ------------------------------------------------------------------------------------

def test_one_image_identities_are_never_forgotten_but_serve_as_retain_and_anchor_identities():
    # every other identity has a single image (DBSCAN noise points become such singletons)
    faces, labels, cents = _world([10, 1, 8, 1, 9, 1, 7, 1, 10, 1] * 3)
    singletons = set(cents.loc[cents["size"] == 1, "identity"])
    for s in (sel.to_dict() for sel in select_experiments(labels, cents, _selection_cfg(), seed=3)):
        assert s["forget_identity"] not in singletons
        assert singletons & set(s["retain_train_identities"]) and singletons & set(s["retain_val_identities"])
        # the experiment's data and evaluation conditions build with one-image identities among them
        data = unlearning_data(s, faces, labels, cents)
        assert np.isfinite(data.retain_train).all()
        assert len(data.retain_centroids) == len(s["retain_train_identities"]) - 1
        eval_set = evaluation_set(s, faces, labels, n_forget=3, n_retain=12, seed=0)
        assert set(eval_set.table["target_identity"].iloc[3:]) == set(s["retain_val_identities"])
        assert np.isfinite(eval_set.embeddings).all()
    # a singleton as the only anchor candidate is still an anchor (its centroid is its one embedding)
    single = cents.set_index("identity").loc[1, "centroid"]
    anchor, cosine, fallback, _ = select_anchor(np.asarray(cents.loc[0, "centroid"]), np.array([1]),
                                                np.asarray([single]), 0.2, 0.01, np.random.default_rng(0))
    assert anchor == 1 and np.isfinite(cosine)


def test_a_world_of_one_image_identities_names_the_setting_to_change():
    _, labels, cents = _world([1] * 12)
    with pytest.raises(ValueError, match=r"at least 4 images.*lower selection\.min_forget_images"):
        select_experiments(labels, cents, _selection_cfg(), seed=0)
    with pytest.raises(ConfigError, match=r"selection\.min_forget_images.*minimum of 2"):
        validate_config({"selection": {"min_forget_images": 1}})  # a one-image forget identity cannot be split
    with pytest.raises(ValueError, match="cannot split 1 item"):
        split_count(1, 0.65)


# --- NaN embeddings -----------------------------------------------------------------------------------------------

def _face_png(path):
    face = np.zeros((120, 120, 3), np.uint8)
    face[20:100, 20:100] = (255, 0, 255)
    Image.fromarray(face).save(path)
    return path


def test_nan_embedding_from_the_recognizer_becomes_a_status_row(tmp_path):
    class NaNAnalyser(StubAnalyser):
        def embed(self, faces):
            out = np.asarray(super().embed(faces), np.float64)
            out[0, 1] = np.nan  # one NaN component in the first face of the batch
            return out

    paths = [("nan", _face_png(tmp_path / "a.png")), ("fine", _face_png(tmp_path / "b.png"))]
    table = NaNAnalyser().analyse(paths, batch_size=2, progress=False).set_index("image_id")
    assert table.loc["nan", "status"] == "bad_embedding" and table.loc["nan", "embedding"] is None
    assert "non-finite" in table.loc["nan", "message"]
    assert table.loc["fine", "status"] == "ok"


def test_nan_embedding_cannot_become_a_centroid():
    emb = np.array([[1.0, 0.0], [np.nan, 0.0]])
    with pytest.raises(ValueError, match="zero, NaN or infinite"):
        l2_normalise(emb)
    with pytest.raises(ValueError, match="zero, NaN or infinite"):
        identity_centroids(emb, np.array([0, 0]))


# --- anchors ------------------------------------------------------------------------------------------------------

def test_no_anchor_candidate_is_a_clear_error():
    # the empty *band* falls back to the nearest identity (test_selection.py); no candidate at all cannot
    with pytest.raises(ValueError, match="no retain-train identity is available as an anchor"):
        select_anchor(np.array([1.0, 0.0]), np.array([], int), np.zeros((0, 2)), 0.2, 0.01, np.random.default_rng(0))


# --- missing or wrong model files ---------------------------------------------------------------------------------

def test_missing_offline_face_models_are_named_with_what_to_do(tmp_path, offline_models_dir):
    with pytest.raises(AssetError, match=r"MTCNN pnet\.tflite not found at .*run the workflow's asset stage"):
        OfflineFaceAnalyser.from_dir(tmp_path)
    for name in ("pnet.tflite", "rnet.tflite", "onet.tflite"):  # detector present, recognizer missing
        (tmp_path / name).write_bytes((offline_models_dir / name).read_bytes())
    with pytest.raises(AssetError, match=r"MobileFaceNet\.tflite not found"):
        OfflineFaceAnalyser.from_dir(tmp_path)


def test_changed_parameters_of_another_model_are_refused(tmp_path):
    torch.manual_seed(0)
    other = build_mini_generator({**TINY, "layers_per_block": 2})
    save_changed_parameters(other, "full", [], tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match=r"other\.safetensors holds parameters this UNet lacks.*wrong base model"):
        apply_changed_parameters(build_mini_generator(TINY), tmp_path / "other.safetensors")


# --- a config key of the wrong type, through Snakemake --------------------------------------------------------------

@pytest.mark.e2e
def test_wrong_type_config_key_stops_snakemake_naming_the_key(tmp_path):
    from workflow_harness import prepare_workdir, snakemake

    cfg = prepare_workdir(tmp_path, {"unlearning": {"runs": {"piu": {"steps": "many"}}}})
    proc = snakemake(tmp_path, "--dry-run", configfile=cfg, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config key 'unlearning.runs.piu.steps': 'many' is not of type 'integer'" in text, text[-3000:]
    assert not (tmp_path / "results").exists()  # stopped before any job


@pytest.mark.e2e
def test_audit_reference_that_is_not_audited_stops_snakemake_naming_the_key(tmp_path):
    from workflow_harness import prepare_workdir, snakemake

    cfg = prepare_workdir(tmp_path, {"audit": {"compare_to": "esd"}})  # config.yaml audits piu only
    proc = snakemake(tmp_path, "--dry-run", configfile=cfg, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config key 'audit.compare_to': 'esd' is not audited" in text, text[-3000:]


@pytest.mark.e2e
@pytest.mark.parametrize("pair", [["piu", "esd"], ["piu", "piu"]])  # esd is not audited; a run against itself
def test_audit_pair_that_is_not_two_audited_runs_stops_snakemake_naming_the_key(tmp_path, pair):
    from workflow_harness import prepare_workdir, snakemake

    cfg = prepare_workdir(tmp_path, {"audit": {"pairs": [pair]}})  # config.yaml audits piu only
    proc = snakemake(tmp_path, "--dry-run", configfile=cfg, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"config key 'audit.pairs': {pair!r} must name two different audited runs" in text, text[-3000:]
    assert not (tmp_path / "results").exists()  # stopped before any job
