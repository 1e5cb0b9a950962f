"""Forgetting audit, parts 1-3: calibrated verification, Leak@k, probe conditions, the rows a job reports."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO

from idunlearn.audit.probes import probe_set
from idunlearn.audit.relearning import recovery, relearn
from idunlearn.audit.run import audit_rows, probe_rows
from idunlearn.audit.tables import audit_markdown, audit_summary, audit_table
from idunlearn.audit.verification import calibrate, clopper_pearson, leak_at_k, threshold_at_far, verified
from idunlearn.conditions import great_circle
from idunlearn.config import ConfigError, load_config, validate_config
from idunlearn.identities import identity_centroids
from idunlearn.models.arc2face import tiny_arc2face
from idunlearn.models.layers import trainable_parameter_names

DIM = 32


def world(n_identities: int = 30, per_identity: int = 8, spread: float = 0.6, seed: int = 0, dim: int = DIM):
    """Unit embeddings scattered around random identity centres: (embeddings, labels)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_identities, dim))
    emb = np.repeat(centres, per_identity, axis=0) + spread * rng.standard_normal((n_identities * per_identity, dim))
    return emb / np.linalg.norm(emb, axis=1, keepdims=True), np.repeat(np.arange(n_identities), per_identity)


def test_threshold_at_far_by_hand():
    scores = np.linspace(0.0, 0.9, 10)  # 0.0, 0.1, ..., 0.9
    tau = threshold_at_far(scores, 0.1)  # one accept allowed: just above 0.8
    assert 0.8 < tau <= 0.9 and np.mean(scores >= tau) == pytest.approx(0.1)
    assert np.mean(scores >= threshold_at_far(scores, 0.05)) == 0.0  # floor(0.5) = 0 accepts


def test_calibrated_threshold_holds_its_far_on_held_out_pairs_and_is_the_smallest():
    # many identities in a wide space, as real recognizers are: pair cosines of held-out identities then follow
    # those of the calibration identities (with few identities, which identities are held out dominates)
    emb, labels = world(n_identities=80, dim=128)
    record = calibrate(emb, labels, far=0.01, heldout_fraction=0.5, seed=3)
    assert record["far_calibration"] <= 0.01
    assert not set(record["calibration_identities"]) & set(record["heldout_identities"])
    # held out: at most 1% plus three binomial standard errors
    n = record["n_pairs_heldout"]
    assert record["far_heldout"] <= 0.01 + 3 * math.sqrt(0.01 * 0.99 / n)
    # smallest: the next impostor score below tau would let more than 1% through
    cal = np.isin(labels, record["calibration_identities"])
    e, lab = emb[cal], labels[cal]
    i, j = np.triu_indices(len(e), 1)
    impostor = (e[i] * e[j]).sum(1)[lab[i] != lab[j]]
    below = impostor[impostor < record["tau"]].max()
    assert np.mean(impostor >= below) > 0.01


def test_clopper_pearson_by_hand():
    # 0 of n: upper bound 1 - (alpha/2)^(1/n); n of n: lower bound (alpha/2)^(1/n)
    assert clopper_pearson(0, 10) == pytest.approx((0.0, 1 - 0.025 ** 0.1))
    assert clopper_pearson(10, 10) == pytest.approx((0.025 ** 0.1, 1.0))


def test_verified_needs_detection_threshold_and_nearest_centroid():
    samples = pd.DataFrame({"detected": [True, True, True, False], "own_cosine": [0.6, 0.3, 0.6, 0.9],
                            "predicted_identity": [1, 1, 2, 1], "target_identity": [1, 1, 1, 1]})
    assert verified(samples, 0.5).tolist() == [True, False, False, False]


def test_leak_at_k_by_hand_and_monotone():
    samples = pd.DataFrame({"condition": ["a"] * 4 + ["b"] * 4, "seed_index": [0, 1, 2, 3] * 2})
    flags = np.array([False, False, True, False, False, False, False, False])
    assert leak_at_k(samples, flags, [1, 2, 3, 4]) == {1: 0.0, 2: 0.0, 3: 0.5, 4: 0.5}
    rng = np.random.default_rng(0)
    many = pd.DataFrame({"condition": np.repeat(np.arange(20), 8), "seed_index": np.tile(np.arange(8), 20)})
    for _ in range(20):
        leak = leak_at_k(many, rng.random(160) < 0.1, [1, 4, 8])
        assert leak[1] <= leak[4] <= leak[8]
    with pytest.raises(ValueError, match="Leak@8"):
        leak_at_k(samples, flags, [8])


def test_great_circle_sits_at_the_stated_cosines():
    rng = np.random.default_rng(1)
    centre, direction = rng.standard_normal(DIM), rng.standard_normal(DIM)
    cosines = [1.0, 0.95, 0.9, 0.8, 0.7, 0.5, 0.3, -0.2]
    points = great_circle(centre, direction, cosines).astype(np.float64)
    assert np.linalg.norm(points, axis=1) == pytest.approx(np.ones(len(cosines)), abs=1e-6)
    assert points @ (centre / np.linalg.norm(centre)) == pytest.approx(cosines, abs=1e-6)
    with pytest.raises(ValueError, match="parallel"):
        great_circle(centre, 3 * centre, [0.5])


def experiment(seed: int = 0):
    """faces / centroids / selection of a small world whose forget identity is 0."""
    emb, labels = world(n_identities=8, per_identity=6, seed=seed)
    ids = [f"img_{i:03d}" for i in range(len(emb))]
    faces = pd.DataFrame({"image_id": ids, "status": "ok", "embedding": list(emb)})
    centroids = identity_centroids(emb, labels)
    selection = {"forget_identity": 0, "forget_train_images": ids[:4], "forget_val_images": ids[4:6],
                 "retain_val_identities": [5, 6, 7]}
    return faces, centroids, selection


PROBES = {"leak": {"conditions": 3, "seeds": 4, "ks": [1, 4]}, "photo": {"seeds": 2},
          "neighbourhood": {"cosines": [1.0, 0.9, 0.5], "retain_directions": 2, "random_directions": 1, "seeds": 1}}


def test_probe_set_conditions_seeds_and_cosines():
    faces, centroids, selection = experiment()
    probes = probe_set(selection, faces, centroids, PROBES, seed=42)
    table = probes.table
    assert table.groupby("probe").size().to_dict() == {"leak": 12, "photo": 12, "neighbourhood": 1 + 3 * 2}
    assert table["seed"].is_unique and (table["target_identity"] == 0).all()
    hood = table[table["probe"] == "neighbourhood"]
    assert hood["cosine"].to_numpy() == pytest.approx(hood["setting"].astype(float).to_numpy(), abs=1e-6)
    again = probe_set(selection, faces, centroids, PROBES, seed=42)
    assert again.table.equals(table) and np.array_equal(again.embeddings, probes.embeddings)
    with pytest.raises(ValueError, match="audit.probes"):
        probe_set(selection, faces, centroids, {"nope": {}}, seed=42)
    with pytest.raises(ValueError, match="audit.probes.leak.ks"):
        probe_set(selection, faces, centroids, {"leak": {"conditions": 1, "seeds": 2, "ks": [4]}}, seed=42)


def scored_by(model, probes, centroids):
    """Probe samples as a stand-in generator + recognizer would score them: ``model`` maps a condition to the
    embedding of the face it draws."""
    cents = np.stack(centroids["centroid"].to_numpy()).astype(np.float64)
    out = np.stack([model(c.astype(np.float64)) for c in probes.embeddings])
    out = out / np.linalg.norm(out, axis=1, keepdims=True)
    table = probes.table.copy()
    table["detected"] = True
    table["own_cosine"] = out @ cents[0]
    table["predicted_identity"] = centroids["identity"].to_numpy()[(out @ cents.T).argmax(1)]
    return table


def test_neighbourhood_probe_flags_a_model_that_hides_only_the_centroid():
    faces, centroids, selection = experiment()
    probes = probe_set(selection, faces, centroids, PROBES, seed=42)
    centre = np.asarray(centroids["centroid"].iloc[0], np.float64)
    stranger = np.asarray(centroids["centroid"].iloc[5], np.float64)

    def hides(condition):  # forgets the centroid itself, still draws the person for every nearby condition
        cos = condition @ centre / np.linalg.norm(condition)
        return centre if 0.8 <= cos < 0.999 else stranger

    rows = pd.DataFrame(probe_rows(scored_by(hides, probes, centroids), tau=0.5, ks=[1, 4]))
    fa = rows[(rows["probe"] == "neighbourhood") & (rows["metric"] == "fa")].set_index("setting")["value"]
    assert fa["1"] == 0.0 and fa["0.9"] == 1.0 and fa["0.5"] == 0.0


def test_audit_rows_tables_and_markdown():
    faces, centroids, selection = experiment()
    probes = probe_set(selection, faces, centroids, PROBES, seed=42)
    scored = scored_by(lambda c: c, probes, centroids)  # draws exactly the condition's identity
    evaluation = pd.DataFrame({"sample_id": ["forget_000", "retain_000", "retain_001"],
                               "kind": ["forget", "retain", "retain"], "target_identity": [0, 5, 6],
                               "detected": True, "own_cosine": [0.9, 0.8, 0.7], "predicted_identity": [0, 5, 6]})
    after = evaluation.assign(own_cosine=[0.1, 0.7, 0.7], predicted_identity=[3, 5, 6])
    before_rows = audit_rows(scored, evaluation, None, centroids, 0, tau=0.5, ks=[1, 4])
    after_rows = audit_rows(scored, after, evaluation, centroids, 0, tau=0.5, ks=[1, 4])
    locality = after_rows[after_rows["probe"] == "locality"].set_index("setting")
    assert locality.loc["5", "value"] == pytest.approx(-0.1) and locality.loc["6", "value"] == pytest.approx(0.0)
    assert locality.loc["5", "cosine"] == pytest.approx(
        np.dot(centroids["centroid"].iloc[5], centroids["centroid"].iloc[0]), abs=1e-6)
    table = audit_table([("original", 0, before_rows), ("piu", 0, after_rows)])
    summary = audit_summary(table, seed=0).set_index(["run", "probe", "setting", "metric"])
    assert summary.loc[("original", "evaluation", "forget", "fa"), "mean"] == 1.0
    assert summary.loc[("piu", "evaluation", "forget", "fa"), "mean"] == 0.0
    assert summary.loc[("original", "evaluation", "retain", "ism"), "mean"] == pytest.approx(0.75)  # (0.8 + 0.7) / 2
    assert summary.loc[("piu", "evaluation", "retain", "ism"), "mean"] == pytest.approx(0.7)
    text = audit_markdown(summary.reset_index(), {"tau": 0.5, "far_target": 0.01, "far_heldout": 0.008})
    assert text.index("| original |") < text.index("| piu |") and "| Leak@1 | Leak@4 |" in text
    assert "attack success |" not in text  # the light audit (no attack probe) shows no attack columns
    attacked = pd.concat([summary.reset_index(), pd.DataFrame([{"run": "piu", "probe": "attack", "setting": "best",
                          "metric": m, "mean": 0.5, "ci_low": 0.4, "ci_high": 0.6, "n_identities": 1}
                          for m in ("fa", "ism")])])
    assert "| attack success | attack ISM |" in audit_markdown(attacked, {"tau": 0.5, "far_target": 0.01,
                                                                          "far_heldout": 0.008})


def test_unknown_probe_or_malformed_setting_stops_at_config_validation():
    with pytest.raises(ConfigError, match=r"audit\.probes.*'photos' was unexpected"):
        validate_config({"audit": {"probes": {"photos": {}}}})
    with pytest.raises(ConfigError, match=r"audit\.probes\.leak\.seeds"):
        validate_config({"audit": {"probes": {"leak": {"seeds": 0}}}})


def test_recovery_by_hand():
    assert recovery(0.5, 0.1, 0.7) == pytest.approx(0.4 / 0.6)
    assert recovery(0.1, 0.1, 0.7) == 0.0 and math.isnan(recovery(0.3, 0.7, 0.7))


def test_relearning_measures_the_given_model_at_k0_and_trains_only_its_regime():
    generator = tiny_arc2face()
    original = {n: p.detach().clone() for n, p in generator.unet.named_parameters()}
    probe = (torch.randn(2, *generator.latent_shape, generator=torch.Generator().manual_seed(0)),
             torch.tensor([10, 500]), generator.conditions(torch.randn(2, 512)).detach())

    def measure(g):  # any deterministic function of the weights
        with torch.no_grad():
            return {"ism": float(g.predict_noise(*probe).mean()), "fa": 0.0}

    at_start = measure(generator)["ism"]
    rng = np.random.default_rng(0)
    latents, embeddings = torch.randn(4, *generator.latent_shape), rng.standard_normal((4, 512)).astype(np.float32)
    cfg = {"regime": "all_cross_attention", "batch": 2, "lr": 1e-3}
    records = relearn(generator, latents, embeddings, [3, 0], cfg, seed=0, measure=measure)
    assert [r["k"] for r in records] == [0, 3]
    assert records[0]["ism"] == at_start  # k = 0 is the model as given: recovery exactly 0
    assert recovery(records[0]["ism"], records[0]["ism"], 1.0) == 0.0
    changed = {n for n, p in generator.unet.named_parameters() if not torch.equal(p, original[n])}
    assert changed and changed <= set(trainable_parameter_names(generator.unet, "all_cross_attention"))
    again = tiny_arc2face()
    assert relearn(again, latents, embeddings, [0, 3], cfg, seed=0, measure=measure) == records  # seeded


def test_ball_projection_keeps_inside_points_and_lands_on_the_boundary():
    from idunlearn.unlearning.adversarial import project_to_ball

    rng = np.random.default_rng(2)
    centre = torch.nn.functional.normalize(torch.as_tensor(rng.standard_normal(DIM), dtype=torch.float32), dim=0)
    inside = centre + 0.1 * torch.as_tensor(rng.standard_normal(DIM), dtype=torch.float32)
    torch.testing.assert_close(project_to_ball(inside, centre, 0.5), inside / inside.norm())
    outside = torch.as_tensor(rng.standard_normal(DIM), dtype=torch.float32)
    projected = project_to_ball(outside, centre, 0.8)
    assert float(projected.norm()) == pytest.approx(1.0, abs=1e-6)
    assert float(projected @ centre) == pytest.approx(0.8, abs=1e-6)


def test_attack_is_seeded_starts_at_the_centroid_and_respects_its_ball():
    from idunlearn.audit.attack import attack_condition

    latents = torch.randn(3, *tiny_arc2face().latent_shape, generator=torch.Generator().manual_seed(0))
    centroid = np.random.default_rng(0).standard_normal(512)
    cfg = {"restarts": 2, "steps": 0, "checkpoints": 2, "lr": 0.1, "batch": 2, "t_low": 100, "t_high": 900,
           "min_cosine": None, "recognizer_weight": 0.0}
    unmoved = attack_condition(tiny_arc2face(), latents, centroid, {**cfg, "restarts": 1}, seed=0)
    assert unmoved["restart"] == 0 and unmoved["cosine"] == pytest.approx(1.0, abs=1e-6)
    ball = {**cfg, "steps": 3, "min_cosine": 0.9}
    first = attack_condition(tiny_arc2face(), latents, centroid, ball, seed=0)
    assert first["cosine"] >= 0.9 - 1e-6 and len(first["restart_losses"]) == 2
    # checkpoints along each path, never its start; the winner is the candidate with the lowest evaluation loss
    assert [(c["restart"], c["step"]) for c in first["candidates"]] == [(0, 2), (0, 3), (1, 2), (1, 3)]
    assert first["loss"] == min(c["loss"] for c in first["candidates"])
    assert all(c["cosine"] >= 0.9 - 1e-6 for c in first["candidates"])
    again = attack_condition(tiny_arc2face(), latents, centroid, ball, seed=0)
    assert np.array_equal(first["embedding"], again["embedding"]) and first["loss"] == again["loss"]


def test_attack_control_bound():
    from idunlearn.audit.tables import attack_control_lines

    def summary(attacked: float) -> pd.DataFrame:
        return pd.DataFrame({"run": "original", "probe": ["attack", "evaluation"], "setting": ["best", "forget"],
                             "metric": "ism", "mean": [attacked, 0.7], "ci_low": np.nan, "ci_high": np.nan,
                             "n_identities": 3})

    assert "passes" in attack_control_lines(summary(0.64))[1]  # 0.914 x 0.7
    assert "FAILS" in attack_control_lines(summary(0.62))[1]  # 0.886 x 0.7
    assert attack_control_lines(summary(0.62).iloc[1:]) == []  # no attack run: nothing to say

    # identity by identity: 7 reaches 0.70 of 0.70 (passes), 37 reaches 0.58 of 0.73 (0.79 x: below the bound)
    table = pd.DataFrame({"run": "original", "identity": [7, 7, 37, 37], "probe": ["attack", "evaluation"] * 2,
                          "setting": ["best", "forget"] * 2, "metric": "ism", "value": [0.70, 0.70, 0.58, 0.73]})
    line = attack_control_lines(summary(0.64), table)[1]
    assert "passes on 1 of 2; below the bound on 37" in line
    assert "passes on 2 of 2." in attack_control_lines(summary(0.64), table.assign(value=0.7))[1]


def test_an_absent_probe_is_off_and_no_probes_key_enables_all():
    # the default config lists the light probes only: the attack, relearning and trajectory probes (minutes per
    # identity) must stay off in `make run`, not be filled in from the schema (they were until 2026-12-02)
    light = load_config(REPO / "config" / "config.yaml")["audit"]["probes"]
    assert sorted(light) == ["leak", "neighbourhood", "photo"]
    assert light["leak"]["seeds"] == 8  # a present probe still gets its settings' defaults
    everything = validate_config({})["audit"]["probes"]
    assert sorted(everything) == ["attack", "leak", "neighbourhood", "photo", "relearning", "trajectory"]
    assert everything["attack"]["restarts"] == 3
