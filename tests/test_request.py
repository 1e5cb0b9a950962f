"""Forget requests (idunlearn.request): the requester rule over a folder's photos, in or out of the training data,
the request's tables for the study's unlearning code, requests for several people, and the report. The workflow end to end: test_pipeline.py."""

from __future__ import annotations

import json
import re
import shlex

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from badfiles import StubAnalyser, write_bad_files
from conftest import REPO
from idunlearn.config import validate_config
from idunlearn.experiment import unlearning_data
from idunlearn.faces.analyser import ImageLoadError, load_rgb
from idunlearn.identities import identity_centroids
from idunlearn.request.demo import write_demo_folder
from idunlearn.request.photos import RequestError, embed_photos, find_requester, status_table
from idunlearn.request.report import request_report, to_markdown, to_rst
from idunlearn.request.selection import request_selection, request_selections, request_world, request_worlds
from workflow_harness import QUICK, prepare_workdir, snakemake

EPS, MIN_SAMPLES = 0.35, 2


def _photos(groups: dict[str, np.ndarray]) -> pd.DataFrame:
    """A photos table (embed_photos' columns) of ok photos: file name -> unit embedding."""
    names = list(groups)
    emb = [(v / np.linalg.norm(v)).astype(np.float32).tolist() for v in groups.values()]
    return pd.DataFrame({"image_id": names, "path": [f"/photos/{n}" for n in names],
                         "sha256": [f"{i:064x}" for i in range(len(names))], "status": "ok", "message": "",
                         "det_score": 0.99, "box": None, "landmarks": None, "embedding": emb})


def _people(counts: list[int], dim: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """counts[p] photos of person p: far apart centres (cosine ~0), photos within cosine ~0.99 of theirs."""
    rng = np.random.default_rng(seed)
    centres = np.eye(dim)[: len(counts)] * 10
    return {f"p{p}_{k}.png": centres[p] + rng.standard_normal(dim) * 0.3 for p, n in enumerate(counts)
            for k in range(n)}


def test_bad_files_are_status_rows_and_the_faces_are_the_requester(tmp_path):
    expected = write_bad_files(tmp_path / "request")
    face = np.zeros((120, 120, 3), np.uint8)
    face[20:100, 20:100] = (255, 0, 255)  # the stub analyser's face
    for k in range(3):
        Image.fromarray(face).save(tmp_path / "request" / f"me_{k}.png")
    photos = find_requester(embed_photos(tmp_path / "request", StubAnalyser()), EPS, MIN_SAMPLES, min_photos=3)
    rows = status_table(photos).set_index("file")
    assert sorted(rows.index[rows["used"]]) == ["me_0.png", "me_1.png", "me_2.png"]
    for name, statuses in expected.items():
        assert rows.loc[name, "status"] in statuses and not rows.loc[name, "used"]
        assert rows.loc[name, "reason"].startswith(rows.loc[name, "status"] + ": ")  # the analyser's message too
    assert rows.loc["truncated.jpg", "sha256"] and len(rows) == len(expected) + 3


def test_too_few_usable_photos_stop_with_every_file_named(tmp_path):
    expected = write_bad_files(tmp_path / "request")
    face = np.zeros((120, 120, 3), np.uint8)
    face[20:100, 20:100] = (255, 0, 255)
    for k in range(2):
        Image.fromarray(face).save(tmp_path / "request" / f"me_{k}.png")
    with pytest.raises(RequestError, match="only 2 usable photo") as err:
        find_requester(embed_photos(tmp_path / "request", StubAnalyser()), EPS, MIN_SAMPLES, min_photos=3)
    message = str(err.value)
    for name in [*expected, "me_0.png", "me_1.png"]:
        assert f"  {name}: " in message
    assert "truncated.jpg: unreadable" in message and "request.min_photos" in message and "What to do" in message


def test_a_photo_of_someone_else_is_rejected_not_fatal():
    photos = find_requester(_photos(_people([5, 1])), EPS, MIN_SAMPLES, min_photos=3)
    assert photos.set_index("image_id")["used"].to_dict() == {**{f"p0_{k}.png": True for k in range(5)},
                                                             "p1_0.png": False}
    assert photos.set_index("image_id").loc["p1_0.png", "reason"].startswith(
        "not the same person as the other 5 photos")


@pytest.mark.parametrize("counts", [[3, 3], [2, 2, 1]])
def test_no_clear_majority_stops_naming_who_is_who(counts):
    with pytest.raises(RequestError, match="no one person") as err:
        find_requester(_photos(_people(counts)), EPS, MIN_SAMPLES, min_photos=2)
    assert "p0_0.png: ok (person 1 of" in str(err.value) and "p1_0.png: ok (person 2 of" in str(err.value)


def _dataset(n_ids: int = 12, dim: int = 16, seed: int = 1):
    """A dataset of n_ids identities, 4 images each, centres at random directions."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_ids, dim))
    emb = np.concatenate([c + 0.1 * rng.standard_normal((4, dim)) for c in centres])
    ids = np.repeat(np.arange(n_ids), 4)
    images = [f"img_{i:02d}_{k}" for i in range(n_ids) for k in range(4)]
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    faces = pd.DataFrame({"image_id": images, "status": "ok", "message": "", "det_score": 0.99, "box": None,
                          "landmarks": None, "embedding": list(unit.astype(np.float32))})
    labels = pd.DataFrame({"image_id": images, "identity": ids})
    manifest = pd.DataFrame({"image_id": images, "path": images, "sha256": "0"})
    return centres, manifest, faces, labels, identity_centroids(emb, ids)


def _requester(centre: np.ndarray, n: int = 5, seed: int = 2) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    photos = _photos({f"me_{k}.png": centre + 0.1 * rng.standard_normal(len(centre)) for k in range(n)})
    return find_requester(photos, EPS, MIN_SAMPLES, min_photos=3)


def _anchor_by_hand(selection: dict, centroids: pd.DataFrame) -> set[int]:
    """The identities eq. 6 may pick: retain-train identities within tol of tau, else the one nearest to tau."""
    cents = centroids.set_index("identity")["centroid"]
    mu = np.asarray(selection["centroid"], np.float64)
    cos = {j: float(np.dot(cents[j], mu) / np.linalg.norm(cents[j])) for j in selection["retain_train_identities"]}
    band = {j for j, c in cos.items() if abs(c - selection["tau"]) < selection["tol"]}
    return band or {min(cos, key=lambda j: abs(cos[j] - selection["tau"]))}


@pytest.mark.parametrize("in_data", [True, False])
def test_person_in_or_out_of_the_training_data(in_data):
    centres, manifest, faces, labels, centroids = _dataset()
    person = 4
    if not in_data:  # the same person, whose identity the dataset does not hold
        keep = labels["identity"] != person
        faces, labels, manifest = faces[keep.to_numpy()], labels[keep], manifest[keep.to_numpy()]
        centroids = centroids[centroids["identity"] != person].reset_index(drop=True)
    cfg = validate_config({"selection": {"anchor": {"tau": 0.2, "tol": 0.1}}})["selection"]
    photos = _requester(centres[person])
    selection = request_selection(photos, centroids, cfg, EPS, seed=3)
    assert selection["in_training_data"] is in_data
    assert selection["forget_identity"] == (person if in_data else 12)
    assert (list(selection["matched_identities"]) == ["4"]) is in_data
    assert (selection["nearest_cosine"] >= 1 - EPS) is in_data
    pool = set(selection["retain_train_identities"]) | set(selection["retain_val_identities"])
    assert pool == set(range(12)) - {person}
    assert selection["anchor_identity"] in _anchor_by_hand(selection, centroids)
    assert selection["forget_train_images"] == [f"request_me_{k}.png" for k in range(5)]
    world = request_world(selection, photos, manifest, faces, labels, centroids)
    assert sorted(world.centroids["identity"]) == sorted(pool | {selection["forget_identity"]})
    request_centroid = world.centroids.set_index("identity").loc[selection["forget_identity"], "centroid"]
    np.testing.assert_allclose(request_centroid, selection["centroid"])
    data = unlearning_data(selection, world.faces, world.labels, world.centroids)
    np.testing.assert_allclose(data.forget_train, np.stack(photos["embedding"]), rtol=1e-6)
    assert len(data.retain_train) == 4 * len(selection["retain_train_identities"])


def test_report_names_rejected_files_reasons_and_both_hashes():
    photos = _requester(np.eye(16)[0] * 10)
    rejected = pd.DataFrame([{"image_id": "broken.jpg", "path": "/x", "sha256": "ab" * 32, "status": "unreadable",
                              "message": "OSError: truncated", "used": False, "reason": "unreadable: OSError: truncated"},
                             {"image_id": "them.png", "path": "/y", "sha256": "cd" * 32, "status": "ok",
                              "message": "", "used": False, "reason": "not the same person as the other 5 photos"}])
    status = status_table(pd.concat([photos, rejected], ignore_index=True))
    _, _, _, _, centroids = _dataset()
    selection = request_selection(photos, centroids, validate_config({})["selection"], EPS, seed=3)
    metrics = {"ism_forget": 0.7, "detection_rate_forget": 1.0, "ism_retain": 0.7, "srk_identity": 1.0,
               "kd_retain": 10.0, "quality_retain": 0.9}
    rows = pd.DataFrame([{"probe": "evaluation", "setting": "forget", "metric": "fa", "value": 0.5, "ci_low": 0.2,
                          "ci_high": 0.8, "n": 4, "cosine": np.nan},
                         {"probe": "leak", "setting": "mixture", "metric": "fa", "value": 1.0, "ci_low": 0.3,
                          "ci_high": 1.0, "n": 2, "cosine": np.nan},
                         {"probe": "leak", "setting": "k=2", "metric": "leak", "value": 1.0, "ci_low": np.nan,
                          "ci_high": np.nan, "n": 1, "cosine": np.nan}])
    after = {**metrics, "ism_forget": 0.1}
    manifest = {"base_unet_sha256": "1" * 64, "result_unet_sha256": "2" * 64, "hash": "sha256 over the weights"}
    run = validate_config({})["unlearning"]["defaults"]
    sections = request_report("demo", "data/request_demo", status, selection, "piu", run, (metrics, after),
                              (rows, rows), {"tau": 0.42, "far_target": 0.01}, manifest)
    markdown = to_markdown(sections)
    assert "`broken.jpg`: unreadable: OSError: truncated" in markdown
    assert "`them.png`: not the same person as the other 5 photos" in markdown
    assert "1" * 64 in markdown and "2" * 64 in markdown
    assert "| forget ISM (to the request centroid) | 0.700 | 0.100 |" in markdown
    assert "| Leak@2 | 1.00 | 1.00 |" in markdown and "| FA, evaluation forget samples | 0.50 (0.20-0.80) |" in markdown
    assert "not in the training data" in markdown and "5 of the 7 files" in markdown
    rst = to_rst(sections)
    assert ".. csv-table::" in rst and '"broken.jpg", "unreadable", "no"' in rst and "1" * 64 in rst


def test_demo_folder_holds_the_person_someone_else_a_broken_jpeg_and_a_flat_picture(orl_manifest, tmp_path):
    files = write_demo_folder(orl_manifest, tmp_path / "demo", person=5, photos=3, other_person=12)
    assert files == ["broken.jpg", "no_face.png", "person_01.png", "person_02.png", "person_03.png",
                     "someone_else.png"]
    shots = orl_manifest.set_index("image_id")["path"]
    np.testing.assert_array_equal(load_rgb(tmp_path / "demo" / "person_02.png"), load_rgb(shots["orl_s05_02"]))
    np.testing.assert_array_equal(load_rgb(tmp_path / "demo" / "someone_else.png"), load_rgb(shots["orl_s12_01"]))
    assert np.ptp(load_rgb(tmp_path / "demo" / "no_face.png")) == 0
    with pytest.raises(ImageLoadError):
        load_rgb(tmp_path / "demo" / "broken.jpg")


def test_a_folder_of_a_request_for_several_people_that_holds_two_people_is_rejected_naming_the_files():
    photos = _photos(_people([5, 1]))
    # alone, the stray photo is dropped; in a request for several people it sends the folder back
    assert find_requester(photos, EPS, MIN_SAMPLES, min_photos=3)["used"].sum() == 5
    with pytest.raises(RequestError, match="holds 2 people") as err:
        find_requester(photos, EPS, MIN_SAMPLES, min_photos=3, one_person=True)
    message = str(err.value)
    assert "p1_0.png: ok (person 2 of 2, not the requester)" in message
    assert all(f"p0_{k}.png: ok (the requester)" in message for k in range(5))
    assert find_requester(_photos(_people([4])), EPS, MIN_SAMPLES, 3, one_person=True)["used"].all()


def _named(photos: pd.DataFrame, person: str) -> pd.DataFrame:
    return photos.assign(image_id=person + "/" + photos["image_id"])


def test_several_people_share_one_retain_split_without_any_of_them_and_one_person_is_the_plain_request():
    centres, manifest, faces, labels, centroids = _dataset()
    cfg = validate_config({"selection": {"anchor": {"tau": 0.2, "tol": 0.1}}})["selection"]
    alice, bob = _named(_requester(centres[4]), "alice"), _named(_requester(centres[7], seed=5), "bob")
    outsider = _named(_requester(np.eye(16)[3] * 10, seed=6), "carol")  # in no dataset identity
    selections = request_selections({"alice": alice, "bob": bob, "carol": outsider}, centroids, cfg, EPS, seed=3)
    assert [s["forget_identity"] for s in selections] == [4, 7, 12]
    assert [s["in_training_data"] for s in selections] == [True, True, False]
    pool = set(selections[0]["retain_train_identities"]) | set(selections[0]["retain_val_identities"])
    assert pool == set(range(12)) - {4, 7}
    for s in selections:
        assert s["retain_train_identities"] == selections[0]["retain_train_identities"]
        assert s["anchor_identity"] in _anchor_by_hand(s, centroids)
    assert selections[1]["forget_train_images"] == [f"request_bob/me_{k}.png" for k in range(5)]
    # the first person's draws are a one-person request's, and one person is exactly that request
    alone = request_selection(alice, centroids, cfg, EPS, seed=3)
    assert request_selections({"alice": alice}, centroids, cfg, EPS, seed=3) == [alone]
    assert alone["anchor_identity"] == selections[0]["anchor_identity"]
    world = request_worlds(selections, [alice, bob, outsider], manifest, faces, labels, centroids)
    assert sorted(world.centroids["identity"]) == sorted(pool | {4, 7, 12})
    data = unlearning_data(selections, world.faces, world.labels, world.centroids)
    assert data.forget_groups.tolist() == [0] * 5 + [1] * 5 + [2] * 5


def test_two_folders_of_one_person_stop_the_request_naming_both():
    centres, _, _, _, centroids = _dataset()
    cfg = validate_config({})["selection"]
    people = {"alice": _named(_requester(centres[4]), "alice"), "again": _named(_requester(centres[4], seed=9),
                                                                                  "again")}
    with pytest.raises(RequestError, match="folders of 'alice' and 'again' show the same person") as err:
        request_selections(people, centroids, cfg, EPS, seed=3)
    assert "dataset identities both match: [4]" in str(err.value)


def test_the_documented_command_for_your_own_photos_reads_your_folder(tmp_path):
    """docs/requests.md's first command, its placeholder folder replaced by a real one (a space in its name): the
    dry run's request_photos job reads that folder and the request's outputs go to results/request/<name>/."""
    command = re.search(r"```sh\n(.*?)\n```", (REPO / "docs" / "requests.md").read_text(), re.S)[1]
    words = shlex.split(command)
    assert words[:3] == [".venv/bin/snakemake", "--cores", "2"] and words[3] == "--config", words
    key, _, value = words[4].partition("=")
    request = yaml.safe_load(value)
    assert key == "request" and request["folder"] == "<path/to/your/photos>", words[4]
    photos = tmp_path / "my photos"
    photos.mkdir()
    Image.new("RGB", (64, 64)).save(photos / "me.jpg")
    workdir = tmp_path / "work"
    prepare_workdir(workdir, {"generator": QUICK["generator"]})  # the shipped generator, found from the work folder
    proc = snakemake(workdir, "--dry-run", "--config", f"request={json.dumps({**request, 'folder': str(photos)})}")
    job = next(block for block in re.split(r"\n(?=rule )", proc.stdout) if block.startswith("rule request_photos:"))
    assert re.search(r"input: " + re.escape(str(photos)) + ",", job), job
    out = workdir / "results" / "request" / request["name"]
    assert f"output: {out / 'photos.parquet'}" in job
    assert str(out / "report.md") in proc.stdout and str(out / "export" / "manifest.json") in proc.stdout
