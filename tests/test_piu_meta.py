"""Relearning-resistant PIU: piu_robust trained against a simulated relearning attacker (first-order
meta-learning)."""

import copy

import numpy as np
import pytest
import torch
from torch.nn.functional import mse_loss

from idunlearn.models.layers import select_trainable, trainable_parameter_names
from idunlearn.unlearning import build_method
from idunlearn.unlearning.piu_meta import meta_seed
from idunlearn.unlearning.piu_robust import adversarial_seed

from test_piu_robust import run, settings as robust_settings
from tiny_world import straight_and_resumed, tiny_data, tiny_generator

META_RUN = {"attack_every": 2, "meta_batch": 2}  # piu_robust's tiny run, an inner attack round before step 3


def settings(**over) -> dict:
    return robust_settings(**{**META_RUN, **over})


def started(run_settings: dict, seed: int = 7):
    method = build_method(run_settings["method"], run_settings)
    method.start(seed)
    return method


def test_without_inner_steps_it_is_piu_robust_bit_for_bit_and_with_them_it_is_not(tmp_path):
    base = tiny_generator()
    robust, off, on = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base)
    log_robust, _ = run(robust, settings(method="piu_robust"), tmp_path / "a.pt")
    log_off, _ = run(off, settings(method="piu_meta", meta_inner_steps=[0, 0]), tmp_path / "b.pt")
    for (name, a), (_, b) in zip(robust.unet.named_parameters(), off.unet.named_parameters()):
        assert torch.equal(a, b), name
    for column in ("forget_loss", "retain_loss", "total_loss"):
        assert log_robust[column].tolist() == log_off[column].tolist(), column
    log_on, _ = run(on, settings(method="piu_meta", meta_inner_steps=[1, 1]), tmp_path / "c.pt")
    assert log_on["forget_loss"].tolist() != log_robust["forget_loss"].tolist()
    assert not all(torch.equal(a, b) for a, b in zip(robust.unet.parameters(), on.unet.parameters()))


def test_one_inner_step_is_an_adamw_step_on_the_denoising_loss_and_leaves_the_model_alone():
    generator, data = tiny_generator(), tiny_data(latents=True)
    generator.requires_grad_(False)
    select_trainable(generator.unet, "surgical")  # the run's regime: the attacker's (all cross-attention) is wider
    before = copy.deepcopy(generator.unet.state_dict())
    method, lr = started(settings(method="piu_meta")), 3e-3
    relearned = method.relearned(generator, data, 1, lr)
    # the same step by hand: the attacker's stream draws the images, then the noise and timesteps
    rng, gen = np.random.default_rng(meta_seed(7)), torch.Generator().manual_seed(meta_seed(7))
    rows = rng.integers(5, size=2)
    x0, emb = data.forget_latents[rows], torch.from_numpy(data.forget_train[rows])
    noise = torch.randn(x0.shape, generator=gen)
    t = torch.randint(1000, (2,), generator=gen)
    attacked = trainable_parameter_names(generator.unet, "all_cross_attention")
    reference = copy.deepcopy(generator.unet)
    params = [p.requires_grad_(True) for n, p in reference.named_parameters() if n in attacked]
    x_t = generator.training_scheduler().add_noise(x0, noise, t)
    with torch.no_grad():
        cond = generator.conditions(emb)
    loss = mse_loss(reference(x_t, t, encoder_hidden_states=cond).sample, noise)  # DDPM denoising loss
    grads = torch.autograd.grad(loss, params)
    for name, p, g in zip(attacked, params, grads):
        # AdamW's first step without weight decay: m_hat = g, v_hat = g^2, theta - lr g / (|g| + eps)
        torch.testing.assert_close(relearned[name], p.detach() - lr * g / (g.abs() + 1e-8), msg=name)
    assert any(not torch.equal(relearned[n], before[n]) for n in attacked)
    for name, value in generator.unet.state_dict().items():  # the run's model is not touched
        assert torch.equal(value, before[name]), name
    assert not any(p.grad is not None for p in generator.unet.parameters())


def test_outer_gradient_is_taken_at_the_relearned_parameters():
    generator, data = tiny_generator(), tiny_data(latents=True)
    teacher = copy.deepcopy(generator.unet).requires_grad_(False)
    generator.requires_grad_(False)
    trainable = select_trainable(generator.unet, "surgical")
    cfg = settings(method="piu_meta", meta_inner_steps=[2, 2], meta_inner_lr=[1e-2, 1e-2], meta_weight=0.5,
                   attack_every=None, eta=1.5)
    method = started(cfg)
    seen = {}

    def spy(*args):  # record the attacker's end point and the stream the meta term's batch is drawn from
        seen["relearned"] = relearned(*args)
        seen["rng"], seen["gen"] = copy.deepcopy(method.meta_rng), method.meta_gen.get_state()
        return seen["relearned"]

    relearned, method.relearned = method.relearned, spy
    obj = method.objectives(generator, teacher, data, np.random.default_rng(3), torch.Generator().manual_seed(3))
    total = torch.autograd.grad(obj.forget + cfg["lambda"] * obj.retain, list(trainable.values()))

    def piu_gradient(unet_values: dict, rng, gen) -> list[torch.Tensor]:
        """PIU's eq. 4 gradient on a separate copy of the model holding ``unet_values``."""
        model = copy.deepcopy(generator)
        model.unet.load_state_dict(unet_values, strict=False)
        params = select_trainable(model.unet, "surgical")
        piu = build_method("piu", settings(method="piu", eta=1.5)).objectives(model, teacher, data, rng, gen)
        return torch.autograd.grad(piu.forget + cfg["lambda"] * piu.retain, list(params.values()))

    plain = piu_gradient({}, np.random.default_rng(3), torch.Generator().manual_seed(3))
    meta_gen = torch.Generator()
    meta_gen.set_state(seen["gen"])
    at_relearned = piu_gradient(seen["relearned"], copy.deepcopy(seen["rng"]), meta_gen)
    meta_gen.set_state(seen["gen"])
    at_start = piu_gradient({}, copy.deepcopy(seen["rng"]), meta_gen)
    for g, p, r, s in zip(total, plain, at_relearned, at_start):
        torch.testing.assert_close(g, p + 0.5 * r, rtol=1e-4, atol=1e-7)
    # the test can tell the two points apart: the meta gradient at theta differs from the one at theta'
    gap = max((r - s).abs().max().item() for r, s in zip(at_relearned, at_start))
    assert gap > 100 * max((g - p - 0.5 * r).abs().max().item() for g, p, r in zip(total, plain, at_relearned))


def test_meta_rounds_resume_exactly(tmp_path):
    # the attack's own resume is piu_robust's test; here the attacker's draws (steps, lr, batches) must continue
    cfg = settings(method="piu_meta", steps=4, attack_every=None, meta_inner_steps=[1, 3], meta_inner_lr=[1e-3, 1e-2],
                   meta_every=2)
    _, log_full, log_resumed = straight_and_resumed(tiny_generator(), tiny_data(latents=True), cfg, tmp_path)
    np.testing.assert_allclose(log_resumed["total_loss"], log_full["total_loss"], rtol=1e-6)


def test_attacker_stream_is_its_own():
    seeds = [meta_seed(42 + identity) for identity in range(40)]
    assert len(set(seeds)) == 40 and not set(seeds) & {adversarial_seed(42 + i) for i in range(40)}
    assert not set(seeds) & set(range(42, 42 + 10**6))  # nor a run, evaluation or audit seed
    method = started(settings(method="piu_meta"), seed=42)
    assert not np.array_equal(method.meta_rng.integers(10**9, size=4), np.random.default_rng(42).integers(10**9, size=4))


@pytest.mark.parametrize("over", [{"meta_inner_steps": [3, 1]}, {"meta_inner_lr": [1e-3, 1e-4]}])
def test_a_reversed_range_is_refused_naming_its_key(over):
    with pytest.raises(ValueError, match=next(iter(over))):
        build_method("piu_meta", settings(method="piu_meta", **over))
