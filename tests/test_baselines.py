"""The baseline methods of PIU appendix C (SISS, UCE, WID) and ESD, on tiny generators."""

import copy

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from idunlearn.experiment import unlearning_data
from idunlearn.faces.align import ARCFACE_TEMPLATE_112
from idunlearn.models.layers import cross_attention_layers, select_trainable, trainable_parameter_names
from idunlearn.models.mini import build_mini_generator
from idunlearn.unlearning import build_method
from idunlearn.conditions import dirichlet_mixtures
from idunlearn.unlearning.conditions import predicted_x0
from idunlearn.unlearning.runner import apply_changed_parameters, save_changed_parameters, unlearn
from idunlearn.unlearning.uce import uce_edit

from tiny_world import TINY, tiny_data, tiny_generator, unit

SURGICAL = ["down_blocks.2.", "mid_block.", "up_blocks.1.", "up_blocks.2."]
BASE = {"optimiser": "weighted_sum", "regime": "all_cross_attention", "surgical_blocks": SURGICAL, "steps": 1,
        "checkpoint_every": 1, "eta": 1.0, "lambda": 1.0, "preserve": True, "forget_batch": 3, "retain_batch": 2,
        "dirichlet_k": 3, "dirichlet_alpha": 1.0, "lr": 1e-3, "betas": [0.9, 0.999], "adam_eps": 1e-8,
        "weight_decay": 0.0, "uce_alpha_erase": 20.0, "uce_alpha_preserve": 1.0, "uce_lambda": 0.7,
        "uce_preserve": 3, "uce_erase_mixtures": 0, "wid_lambda": 0.1}







# --- UCE ------------------------------------------------------------------------------------------------------

def _lstsq_eq34(w, erase, guide, preserve, a_e, a_p, lam):
    """Eq. 34 as one stacked least-squares problem in W^T, solved by torch.linalg.lstsq (not by eq. 35)."""
    rows = torch.cat([a_e ** 0.5 * erase, a_p ** 0.5 * preserve, lam ** 0.5 * torch.eye(w.shape[1])])
    rhs = torch.cat([a_e ** 0.5 * guide @ w.T, a_p ** 0.5 * preserve @ w.T, lam ** 0.5 * w.T])
    return torch.linalg.lstsq(rows.double(), rhs.double()).solution.T


def test_uce_closed_form_is_the_least_squares_solution_of_eq34():
    g = torch.Generator().manual_seed(0)
    w, erase, guide, preserve = (torch.randn(n, 7, generator=g, dtype=torch.float64) for n in (5, 3, 3, 4))
    for a_e, a_p, lam in [(20.0, 1.0, 0.7), (2.5, 0.3, 0.05)]:
        torch.testing.assert_close(uce_edit(w, erase, guide, preserve, a_e, a_p, lam),
                                   _lstsq_eq34(w, erase, guide, preserve, a_e, a_p, lam), rtol=1e-7, atol=1e-7)
    # alpha_e = 0: the solution is the old matrix
    torch.testing.assert_close(uce_edit(w, erase, guide, preserve, 0.0, 1.0, 0.7), w, rtol=1e-12, atol=1e-12)


def test_uce_run_edits_to_k_and_to_v_of_every_cross_attention_as_eq34(tmp_path):
    base, data = tiny_generator(), tiny_data()
    edited = copy.deepcopy(base)
    losses, timings = unlearn(edited, build_method("uce", BASE), data, BASE, tmp_path / "s.pt", seed=4)
    assert len(losses) == 1 and losses["backward_passes"].item() == 0 and timings["steps"] == 1
    assert not (tmp_path / "s.pt").exists()
    old = dict(base.unet.named_parameters())
    changed = {n for n, p in edited.unet.named_parameters() if not torch.equal(p, old[n])}
    kv = {n for n in trainable_parameter_names(base.unet, "all_cross_attention") if n.endswith(("to_k.weight",
                                                                                                 "to_v.weight"))}
    assert changed == kv and len(kv) == 2 * len(cross_attention_layers(base.unet))
    # one layer by the independent route: E = forget-train conditions, guide = anchor, P = anchor + 2 drawn others
    chosen = np.sort(np.random.default_rng(4).choice(5, size=2, replace=False))
    with torch.no_grad():
        mean = lambda e: base.conditions(torch.from_numpy(np.asarray(e, np.float32))).mean(1)  # noqa: E731
        erase, anchor = mean(data.forget_train), mean(data.anchor_centroid[None])
        preserve = mean(np.concatenate([data.anchor_centroid[None], data.retain_centroids[chosen]]))
    name = sorted(kv)[0]
    expected = _lstsq_eq34(old[name].detach().double(), erase.double(), anchor.expand_as(erase).double(),
                           preserve.double(), 20.0, 1.0, 0.7)
    torch.testing.assert_close(dict(edited.unet.named_parameters())[name].detach().double(), expected,
                               rtol=1e-4, atol=1e-5)
    # the run's saved parameters cover the edit
    save_changed_parameters(edited, "all_cross_attention", SURGICAL, tmp_path / "delta.safetensors")
    rebuilt = apply_changed_parameters(copy.deepcopy(base), tmp_path / "delta.safetensors")
    for (n, a), (_, b) in zip(edited.unet.named_parameters(), rebuilt.unet.named_parameters()):
        torch.testing.assert_close(a, b, msg=n)


def test_uce_erase_set_includes_dirichlet_mixtures_of_the_forget_embeddings(tmp_path):
    """PIU appendix C.2.2: E holds the forget embeddings and their linear combinations (uce_erase_mixtures)."""
    base, data = tiny_generator(), tiny_data()
    run = {**BASE, "uce_erase_mixtures": 4}
    erase_emb, groups = build_method("uce", run).erase_embeddings(data, np.random.default_rng(1))
    plain = np.asarray(data.forget_train, np.float32)
    assert len(erase_emb) == len(plain) + 4 and np.array_equal(erase_emb[:len(plain)], plain)
    assert not groups.any()  # one forget identity: every row is guided to its anchor
    # each mixture is a unit vector with non-negative weights over the forget embeddings (least squares recovers them)
    weights = np.linalg.lstsq(plain.T.astype(np.float64), erase_emb[len(plain):].T.astype(np.float64), rcond=None)[0]
    assert np.allclose(np.linalg.norm(erase_emb[len(plain):], axis=1), 1.0, atol=1e-5) and (weights > -1e-5).all()
    edited = copy.deepcopy(base)
    unlearn(edited, build_method("uce", run), data, run, tmp_path / "s.pt", seed=4)
    # the same edit by the independent route: replay the seeded draws (preserve choice, then the mixtures)
    rng = np.random.default_rng(4)
    chosen = np.sort(rng.choice(5, size=2, replace=False))
    erase_rows = np.concatenate([plain, dirichlet_mixtures(plain, 4, rng, 3, 1.0)])
    with torch.no_grad():
        mean = lambda e: base.conditions(torch.from_numpy(np.asarray(e, np.float32))).mean(1)  # noqa: E731
        erase, anchor = mean(erase_rows), mean(data.anchor_centroid[None])
        preserve = mean(np.concatenate([data.anchor_centroid[None], data.retain_centroids[chosen]]))
    name = sorted(n for n in trainable_parameter_names(base.unet, "all_cross_attention") if n.endswith("to_k.weight"))[0]
    old = dict(base.unet.named_parameters())[name].detach().double()
    expected = _lstsq_eq34(old, erase.double(), anchor.expand_as(erase).double(), preserve.double(), 20.0, 1.0, 0.7)
    got = dict(edited.unet.named_parameters())[name].detach().double()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    plain_edit = _lstsq_eq34(old, mean(plain).double(), anchor.expand(len(plain), -1).double(), preserve.double(),
                             20.0, 1.0, 0.7)
    assert not torch.allclose(got, plain_edit, atol=1e-5)  # the mixtures change the edit


def test_uce_with_alpha_erase_zero_leaves_the_weights_unchanged(tmp_path):
    base = tiny_generator()
    edited = copy.deepcopy(base)
    unlearn(edited, build_method("uce", {**BASE, "uce_alpha_erase": 0.0}), tiny_data(), BASE, tmp_path / "s.pt", seed=0)
    for (n, a), (_, b) in zip(base.unet.named_parameters(), edited.unet.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=n)


def test_uce_surgical_regime_edits_only_the_surgical_layers(tmp_path):
    base = tiny_generator()
    edited = copy.deepcopy(base)
    run = {**BASE, "regime": "surgical"}
    unlearn(edited, build_method("uce", run), tiny_data(), run, tmp_path / "s.pt", seed=0)
    old = dict(base.unet.named_parameters())
    changed = {n for n, p in edited.unet.named_parameters() if not torch.equal(p, old[n])}
    assert changed and changed <= set(trainable_parameter_names(base.unet, "surgical", SURGICAL))
    assert not any(n.startswith("down_blocks.1.") for n in changed)


# --- SISS -----------------------------------------------------------------------------------------------------

def test_siss_objectives_are_the_denoising_losses_forget_negated():
    gen, data = tiny_generator(), tiny_data(latents=True)
    obj = build_method("siss", BASE).objectives(gen, None, data, np.random.default_rng(3),
                                                torch.Generator().manual_seed(3))
    # replay the draws: forget rows, retain rows (numpy); noise and t of the forget batch, then of the retain batch
    rng, tgen, sched = np.random.default_rng(3), torch.Generator().manual_seed(3), gen.training_scheduler()
    rows_f, rows_r = rng.integers(5, size=3), rng.integers(12, size=2)
    losses = []
    with torch.no_grad():
        for rows, x0, emb in [(rows_f, data.forget_latents, data.forget_train),
                              (rows_r, data.retain_latents, data.retain_train)]:
            noise = torch.randn((len(rows), 1, 8, 8), generator=tgen)
            t = torch.randint(1000, (len(rows),), generator=tgen)
            eps = gen.unet(sched.add_noise(x0[rows], noise, t), t, gen.conditions(torch.from_numpy(emb[rows]))).sample
            losses.append(((eps - noise) ** 2).mean().item())  # ||eps - eps_theta(z_t, t, c)||^2, PIU eq. 25
    assert obj.forget.item() == pytest.approx(-losses[0], rel=1e-5)  # ascended: minimised as its negative
    assert obj.retain.item() == pytest.approx(losses[1], rel=1e-5)
    assert obj.retain_again().item() == pytest.approx(losses[1], rel=1e-5)
    obj.forget.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in gen.unet.parameters())


def test_siss_without_image_latents_names_what_is_missing():
    with pytest.raises(ValueError, match="forget_latents"):
        build_method("siss", BASE).objectives(tiny_generator(), None, tiny_data(), np.random.default_rng(0),
                                              torch.Generator().manual_seed(0))


# --- WID ------------------------------------------------------------------------------------------------------

class TinyRecognizer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 8, stride=8), torch.nn.Flatten(),
                                       torch.nn.Linear(4 * 14 * 14, 6))

    def forward(self, images):
        assert images.shape[1:] == (3, 112, 112) and images.min() >= 0 and images.max() <= 255
        return self.net(images / 255)


def test_predicted_x0_inverts_the_forward_process():
    sched = tiny_generator().training_scheduler()
    x0, noise, t = torch.randn(4, 1, 8, 8), torch.randn(4, 1, 8, 8), torch.tensor([0, 10, 500, 900])
    torch.testing.assert_close(predicted_x0(sched, sched.add_noise(x0, noise, t), t, noise), x0, rtol=1e-3, atol=1e-3)


def test_wid_forget_term_is_eq44_on_anchor_images_and_its_identity_loss_reaches_the_trainable_weights():
    gen, data = tiny_generator(), tiny_data(latents=True)
    data.recognizer = TinyRecognizer().requires_grad_(False)
    teacher = copy.deepcopy(gen.unet)
    trainable = select_trainable(gen.unet, "surgical", SURGICAL)
    run = {**BASE, "eta": 0.0, "wid_lambda": 0.0}

    def objective(wid_lambda):
        return build_method("wid", {**run, "wid_lambda": wid_lambda}).objectives(
            gen, teacher, data, np.random.default_rng(2), torch.Generator().manual_seed(2)).forget

    # eq. 44 by hand: anchor images noised, student under the forget mixtures vs frozen model under the anchor
    rng, tgen, sched = np.random.default_rng(2), torch.Generator().manual_seed(2), gen.training_scheduler()
    x0 = data.anchor_latents[rng.integers(3, size=3)]
    c_f = gen.conditions(torch.from_numpy(dirichlet_mixtures(data.forget_train, 3, rng)))
    c_a = gen.conditions(torch.from_numpy(np.repeat(data.anchor_centroid[None], 3, 0)))
    noise, t = torch.randn((3, 1, 8, 8), generator=tgen), torch.randint(1000, (3,), generator=tgen)
    x_t = sched.add_noise(x0, noise, t)
    with torch.no_grad():
        expected = ((gen.unet(x_t, t, c_f).sample - teacher(x_t, t, c_a).sample) ** 2).mean()
    assert objective(0.0).item() == pytest.approx(expected.item(), rel=1e-5)
    identity = objective(1.0) - objective(0.0)  # lambda * ||s_id - s_hat_id||^2 with lambda = 1
    assert 0 < identity.item() <= 4  # squared distance of unit vectors
    grads = torch.autograd.grad(identity, list(trainable.values()), allow_unused=True)
    assert sum(float(g.abs().sum()) for g in grads if g is not None) > 0


def test_wid_and_esd_refuse_settings_that_are_not_theirs():
    with pytest.raises(ValueError, match="eta: 0"):
        build_method("wid", {**BASE, "eta": 1.0})
    with pytest.raises(ValueError, match="preserve: false"):
        build_method("esd", BASE)
    with pytest.raises(ValueError, match="config key 'method'.*unknown"):
        build_method("nope", BASE)


# --- ESD ------------------------------------------------------------------------------------------------------

def test_esd_target_is_negative_guidance_from_the_unconditional_prediction():
    gen, data = tiny_generator(), tiny_data()
    teacher = copy.deepcopy(gen.unet)
    run = {**BASE, "preserve": False, "eta": 1.5}
    obj = build_method("esd", run).objectives(gen, teacher, data, np.random.default_rng(3),
                                              torch.Generator().manual_seed(3))
    rng, tgen, sched = np.random.default_rng(3), torch.Generator().manual_seed(3), gen.training_scheduler()
    with torch.no_grad():
        c_f = gen.conditions(torch.from_numpy(dirichlet_mixtures(data.forget_train, 3, rng)))
        c_u = gen.unconditional(3)
        x0, noise = torch.randn((3, 1, 8, 8), generator=tgen), torch.randn((3, 1, 8, 8), generator=tgen)
        t = torch.randint(1000, (3,), generator=tgen)
        x_t = sched.add_noise(x0, noise, t)
        eps_u, eps_f = teacher(x_t, t, c_u).sample, teacher(x_t, t, c_f).sample
        target = eps_u - 1.5 * (eps_f - eps_u)  # ESD: eps*(empty) - eta (eps*(c_f) - eps*(empty))
        forget = ((gen.unet(x_t, t, c_f).sample - target) ** 2).mean()
    assert obj.forget.item() == pytest.approx(forget.item(), rel=1e-4) and obj.retain is None
    # the same draws with PIU's anchor reference give a different loss: the reference is what differs
    piu = build_method("piu", run).objectives(gen, teacher, data, np.random.default_rng(3),
                                              torch.Generator().manual_seed(3))
    assert abs(piu.forget.item() - forget.item()) > 1e-2 * forget.item()


# --- experiment data --------------------------------------------------------------------------------------------

def test_unlearning_data_pairs_image_latents_with_their_embeddings(tmp_path):
    """4 identities x 3 constant-grey images; landmarks on the template, so alignment keeps each image as it is
    and its latent is its grey level mapped to [-1, 1]."""
    rng = np.random.default_rng(0)
    ids = [f"im{k:02d}" for k in range(12)]
    grey = {image_id: 20 * k for k, image_id in enumerate(ids)}
    for image_id in ids:
        Image.fromarray(np.full((112, 112, 3), grey[image_id], np.uint8)).save(tmp_path / f"{image_id}.png")
    emb = unit(rng.standard_normal((12, 16)))
    faces = pd.DataFrame({"image_id": ids, "status": "ok", "landmarks": [ARCFACE_TEMPLATE_112.ravel().tolist()] * 12,
                          "embedding": list(emb)})
    manifest = pd.DataFrame({"image_id": ids, "path": [str(tmp_path / f"{i}.png") for i in ids]})
    labels = pd.DataFrame({"image_id": ids, "identity": np.repeat(np.arange(4), 3)})
    centroids = pd.DataFrame({"identity": np.arange(4), "size": 3,
                              "centroid": list(unit(emb.reshape(4, 3, 16).mean(1)))})
    selection = {"forget_identity": 0, "forget_train_images": ["im00", "im02"], "anchor_identity": 2,
                 "retain_train_identities": [1, 2, 3]}
    data = unlearning_data(selection, faces, labels, centroids, latents_of=(manifest, tiny_generator()))
    level = lambda image_ids: torch.tensor([grey[i] / 127.5 - 1 for i in image_ids])  # noqa: E731
    retain_ids = ids[3:]
    torch.testing.assert_close(data.forget_latents.mean((1, 2, 3)), level(["im00", "im02"]))
    torch.testing.assert_close(data.retain_latents.mean((1, 2, 3)), level(retain_ids))
    torch.testing.assert_close(data.anchor_latents.mean((1, 2, 3)), level(["im06", "im07", "im08"]))
    assert data.forget_latents.shape == (2, 1, 8, 8) and data.retain_latents.std((1, 2, 3)).max() < 1e-6
    np.testing.assert_allclose(data.forget_train, emb[[0, 2]])
    np.testing.assert_allclose(data.retain_train, emb[3:])
    np.testing.assert_allclose(data.retain_centroids, np.stack(centroids["centroid"].to_numpy()[[1, 3]]), rtol=1e-6)
    assert unlearning_data(selection, faces, labels, centroids).forget_latents is None


def test_latent_space_generators_encode_real_images_and_decode_x0_hat_through_the_vae(tmp_path):
    """A tiny AutoencoderKL (downsampling 2): real images enter at the VAE's input size (2 x 4), and the
    recognizer input built from latents keeps its gradient through the decoder."""
    from diffusers import AutoencoderKL

    from idunlearn.experiment import real_latents
    from idunlearn.models.generator import IdentityGenerator
    from idunlearn.unlearning.wid import recognizer_input

    torch.manual_seed(0)
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8),
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        norm_num_groups=8, layers_per_block=1)
    mini = build_mini_generator({**TINY, "image_size": 4, "channels": 4})
    gen = IdentityGenerator(mini.encoder, mini.unet, mini.scheduler_config, vae=vae, vae_scale=0.5)
    for k in range(3):
        Image.fromarray(np.full((30, 20, 3), 40 * k, np.uint8)).save(tmp_path / f"{k}.png")
    manifest = pd.DataFrame({"image_id": ["a", "b", "c"], "path": [str(tmp_path / f"{k}.png") for k in range(3)]})
    latents = real_latents(gen, manifest, pd.DataFrame(), ["c", "a"], batch_size=1)
    with torch.no_grad():  # image "c" (grey 80) resized to 8 x 8, in [-1, 1], posterior mean, scaled
        expected = vae.encode(torch.full((1, 3, 8, 8), 80 / 127.5 - 1)).latent_dist.mean * 0.5
    assert latents.shape == (2, 4, 4, 4)
    torch.testing.assert_close(latents[:1], expected, rtol=1e-4, atol=1e-5)
    x = latents.clone().requires_grad_(True)
    images = recognizer_input(gen, x)
    assert images.shape == (2, 3, 112, 112)
    images.sum().backward()
    assert x.grad.abs().sum() > 0


def test_a_recognizer_gradients_cannot_pass_through_is_refused_naming_the_backend(monkeypatch):
    import idunlearn.experiment as experiment

    class OnnxLike:
        recognizer = object()  # e.g. insightface's ArcFaceONNX

    monkeypatch.setattr(experiment, "build_face_analyser", lambda cfg, models_dir: OnnxLike())
    with pytest.raises(ValueError, match="faces.backend 'insightface'.*differentiable"):
        experiment.differentiable_recognizer({"backend": "insightface"}, "models")
