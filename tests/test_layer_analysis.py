import copy
import itertools

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from idunlearn.layer_analysis import analysis_samples, layer_separation, plot_layer_separation
from idunlearn.models.layers import cross_attention_layers
from idunlearn.models.mini import build_mini_generator

TINY = {"image_size": 16, "text_width": 64, "text_layers": 1, "block_out_channels": [32, 32, 32, 32],
        "layers_per_block": 1}
LAYER = "down_blocks.2.attentions.0.transformer_blocks.0.attn2"
TIMESTEPS = (750, 999)
SEED = 3


@pytest.fixture(scope="module")
def generator():
    torch.manual_seed(0)
    return build_mini_generator(TINY).eval()


@pytest.fixture(scope="module")
def world():
    """3 identities x 3 samples: embeddings scattered tightly around one random centre per identity."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((3, 48))
    labels = np.repeat(np.arange(3), 3)
    embeddings = centres[labels] + 0.3 * rng.standard_normal((len(labels), 48))
    return torch.tensor(embeddings, dtype=torch.float32), labels


@pytest.fixture(scope="module")
def table(generator, world):
    torch.set_num_threads(1)
    return layer_separation(generator, *world, timesteps=TIMESTEPS, seed=SEED, batch_size=4)


def _means_by_hand(features: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Intra/inter mean cosine by looping over every pair of distinct samples."""
    flat = features.reshape(len(features), -1).astype(np.float64)
    intra, inter = [], []
    for i, j in itertools.permutations(range(len(flat)), 2):
        cos = flat[i] @ flat[j] / (np.linalg.norm(flat[i]) * np.linalg.norm(flat[j]))
        (intra if labels[i] == labels[j] else inter).append(cos)
    return float(np.mean(intra)), float(np.mean(inter))


def test_key_value_and_query_separation_match_a_route_by_hand(generator, world, table):
    embeddings, labels = world
    attn = dict(generator.unet.named_modules())[LAYER]
    with torch.no_grad():
        cond = generator.conditions(embeddings).numpy()
    row = table.set_index("layer").loc[LAYER]
    for name, projection in (("k", attn.to_k), ("v", attn.to_v)):
        intra, inter = _means_by_hand(cond @ projection.weight.detach().numpy().T, labels)
        assert row[f"intra_{name}"] == pytest.approx(intra, abs=1e-5)
        assert row[f"inter_{name}"] == pytest.approx(inter, abs=1e-5)
        assert row[f"s_{name}"] == pytest.approx(intra - inter, abs=1e-5)
    assert row["s_kv"] == pytest.approx((row["s_k"] + row["s_v"]) / 2)

    # queries: the layer's input hidden states times W_q, with one shared noise image as every UNet input
    hidden = []
    handle = attn.register_forward_pre_hook(lambda module, args: hidden.append(args[0].detach()))
    noise = torch.randn(generator.latent_shape, generator=torch.Generator().manual_seed(SEED))
    inter_q = []
    try:
        with torch.no_grad():
            for t in TIMESTEPS:
                generator.predict_noise(noise.expand(len(labels), -1, -1, -1), torch.tensor(t),
                                        torch.tensor(cond))
                queries = hidden.pop().numpy() @ attn.to_q.weight.detach().numpy().T
                inter_q.append(_means_by_hand(queries, labels)[1])
    finally:
        handle.remove()
    assert row["inter_q"] == pytest.approx(np.mean(inter_q), abs=1e-5)
    assert row["s_q"] == pytest.approx(1 - np.mean(inter_q), abs=1e-5)


def test_keys_that_ignore_the_identity_do_not_separate(generator, world):
    blind = copy.deepcopy(generator)
    attn = dict(blind.unet.named_modules())[LAYER]
    # zero weight and a constant bias: every key is the same nonzero vector, so every cosine is exactly 1
    constant = nn.Linear(attn.to_k.in_features, attn.to_k.out_features)
    nn.init.zeros_(constant.weight)
    attn.to_k = constant
    row = layer_separation(blind, *world, timesteps=TIMESTEPS, seed=SEED).set_index("layer").loc[LAYER]
    assert row["intra_k"] == pytest.approx(1) and row["inter_k"] == pytest.approx(1)
    assert row["s_k"] == pytest.approx(0, abs=1e-9)
    assert abs(row["s_v"]) > 1e-4  # the values still see the identity


def test_one_row_per_cross_attention_layer_with_surgical_flags(generator, table):
    assert sorted(table["layer"]) == sorted(cross_attention_layers(generator.unet))
    assert table["label"].tolist() == ["D1", "D2", "M", "U1.0", "U1.1", "U2.0", "U2.1"]
    assert table["resolution"].tolist() == [8, 4, 2, 4, 4, 8, 8]
    surgical = table.set_index("label")["in_surgical_set"]
    assert not surgical["D1"] and surgical.drop("D1").all()
    assert table["s_q"].between(0, 2).all()
    # no identity information reaches the first attn2 layer's hidden states: its queries cannot separate
    assert table["s_q"].iloc[0] == pytest.approx(0, abs=1e-6)
    for name, module in generator.unet.named_modules():
        if name.endswith(("attn2.to_q", "attn2.to_k", "attn2.to_v")):
            assert not module._forward_hooks  # the capture hooks were removed


def test_rejects_inputs_without_pairs_or_with_out_of_range_timesteps(generator, world):
    embeddings, labels = world
    with pytest.raises(ValueError, match="2\\+ identities"):
        layer_separation(generator, embeddings[:3], labels[:3])
    with pytest.raises(ValueError, match="timesteps"):
        layer_separation(generator, embeddings, labels, timesteps=(750, 1000))


def test_analysis_samples_take_equal_faces_from_identities_with_enough():
    sizes = {0: 5, 1: 2, 2: 4, 3: 6}
    labels = pd.DataFrame([{"image_id": f"{i}_{k}", "identity": i} for i, n in sizes.items() for k in range(n)])
    faces = pd.DataFrame({"image_id": labels["image_id"], "status": "ok",
                          "embedding": [np.full(4, float(i)) for i in labels["identity"]]})
    faces.loc[faces["image_id"] == "2_0", "status"] = "no_face"  # identity 2 keeps 3 usable faces
    embeddings, ids = analysis_samples(faces, labels, n_identities=5, images_per_identity=4, seed=0)
    assert sorted(set(ids)) == [0, 3] and np.bincount(ids).tolist() == [4, 0, 0, 4]
    assert embeddings.shape == (8, 4) and (embeddings[:, 0].numpy() == ids).all()


def test_plot_writes_a_figure(table, tmp_path):
    plot_layer_separation(table, tmp_path / "separation.png")
    assert (tmp_path / "separation.png").stat().st_size > 0
