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


def test_meta_weight_zero_is_piu_robust_bit_for_bit_and_a_meta_term_is_not(tmp_path):
    base = tiny_generator()
    robust, off, on, at_theta = (copy.deepcopy(base) for _ in range(4))
    log_robust, _ = run(robust, settings(method="piu_robust"), tmp_path / "a.pt")
    log_off, _ = run(off, settings(method="piu_meta", meta_inner_steps=[1, 1], meta_weight=0.0), tmp_path / "b.pt")
    for (name, a), (_, b) in zip(robust.unet.named_parameters(), off.unet.named_parameters()):
        assert torch.equal(a, b), name
    for column in ("forget_loss", "retain_loss", "total_loss"):
        assert log_robust[column].tolist() == log_off[column].tolist(), column
    # a meta term, after one attacker step or at theta itself (the extra-batch ablation), changes the run
    for model, steps, path in ((on, [1, 1], "c.pt"), (at_theta, [0, 0], "d.pt")):
        log, _ = run(model, settings(method="piu_meta", meta_inner_steps=steps), tmp_path / path)
        assert log["forget_loss"].tolist() != log_robust["forget_loss"].tolist(), steps
        assert not all(torch.equal(a, b) for a, b in zip(robust.unet.parameters(), model.unet.parameters())), steps


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


def meta_step_gradients(inner_steps: list[int]) -> dict:
    """One piu_meta step (meta weight 0.5, attacker lr 1e-2) from a fixed tiny model: the gradient of its eq. 4 total
    (``total``), and by a separate route on copies of the model the gradients of PIU's eq. 4 on the step's plain batch
    at theta (``plain``), and on the meta term's batch at the attacker's end point theta' (``at_relearned``) and at
    theta (``at_start``); ``moved``: whether theta' differs from theta."""
    generator, data = tiny_generator(), tiny_data(latents=True)
    teacher = copy.deepcopy(generator.unet).requires_grad_(False)
    generator.requires_grad_(False)
    trainable = select_trainable(generator.unet, "surgical")
    cfg = settings(method="piu_meta", meta_inner_steps=inner_steps, meta_inner_lr=[1e-2, 1e-2], meta_weight=0.5,
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

    def on_meta_batch(unet_values: dict) -> list[torch.Tensor]:
        meta_gen = torch.Generator()
        meta_gen.set_state(seen["gen"])
        return piu_gradient(unet_values, copy.deepcopy(seen["rng"]), meta_gen)

    own = generator.unet.state_dict()
    return {"total": total, "plain": piu_gradient({}, np.random.default_rng(3), torch.Generator().manual_seed(3)),
            "at_relearned": on_meta_batch(seen["relearned"]), "at_start": on_meta_batch({}),
            "moved": any(not torch.equal(v, own[n]) for n, v in seen["relearned"].items())}


def _largest_gap(xs, ys) -> float:
    return max((x - y).abs().max().item() for x, y in zip(xs, ys))


def test_outer_gradient_is_taken_at_the_relearned_parameters():
    g = meta_step_gradients([2, 2])
    assert g["moved"]
    for total, plain, relearned in zip(g["total"], g["plain"], g["at_relearned"]):
        torch.testing.assert_close(total, plain + 0.5 * relearned, rtol=1e-4, atol=1e-7)
    # the test can tell the two points apart: the meta gradient at theta differs from the one at theta'
    gap = _largest_gap(g["at_relearned"], g["at_start"])
    assert gap > 100 * _largest_gap(g["total"], [p + 0.5 * r for p, r in zip(g["plain"], g["at_relearned"])])


def test_without_inner_steps_the_meta_term_is_a_second_piu_batch_at_theta():
    # the extra-batch ablation (meta_inner_steps [0, 0]): the attacker takes no step, so the update is piu_robust's
    # (``plain``) plus w x PIU's gradient on a second batch at theta itself, not at a relearned theta'
    g = meta_step_gradients([0, 0])
    assert not g["moved"]
    for total, plain, start in zip(g["total"], g["plain"], g["at_start"]):
        torch.testing.assert_close(total, plain + 0.5 * start, rtol=1e-4, atol=1e-7)
    # it differs from piu_robust's update by the whole second batch, far beyond the rounding of the check above
    tolerance = _largest_gap(g["total"], [p + 0.5 * s for p, s in zip(g["plain"], g["at_start"])])
    assert _largest_gap(g["total"], g["plain"]) > 100 * tolerance
    # and from piu_meta's (2 attacker steps): the same batch at theta' gives another gradient
    meta = meta_step_gradients([2, 2])
    assert _largest_gap(meta["at_relearned"], meta["at_start"]) > 100 * tolerance


def test_meta_rounds_resume_exactly(tmp_path):
    # the attack's own resume is piu_robust's test; here the attacker's draws (steps, lr, batches) must continue
    cfg = settings(method="piu_meta", steps=4, attack_every=None, meta_inner_steps=[1, 3], meta_inner_lr=[1e-3, 1e-2],
                   meta_every=2)
    _, log_full, log_resumed = straight_and_resumed(tiny_generator(), tiny_data(latents=True), cfg, tmp_path)
    np.testing.assert_allclose(log_resumed["total_loss"], log_full["total_loss"], rtol=1e-6)


def test_attacker_stream_is_its_own():
    # seeded from the run's seed (a different run draws differently), not the run's seed itself nor piu_robust's stream
    assert len({meta_seed(42 + identity) for identity in range(40)}) == 40
    method = started(settings(method="piu_meta"), seed=42)
    first = method.meta_rng.integers(10**9, size=4)
    for other in (42, adversarial_seed(42)):
        assert not np.array_equal(first, np.random.default_rng(other).integers(10**9, size=4)), other
    # a meta round draws nothing from the run's streams: the plain batches of every later step are piu_robust's
    generator, data = tiny_generator(), tiny_data(latents=True)
    teacher = copy.deepcopy(generator.unet).requires_grad_(False)
    generator.requires_grad_(False)
    select_trainable(generator.unet, "surgical")
    states = []
    for cfg in (settings(method="piu_robust", attack_every=None), settings(method="piu_meta", attack_every=None)):
        rng, gen = np.random.default_rng(3), torch.Generator().manual_seed(3)
        started(cfg).objectives(generator, teacher, data, rng, gen)
        states.append((rng.bit_generator.state, gen.get_state()))
    assert states[0][0] == states[1][0] and torch.equal(states[0][1], states[1][1])


@pytest.mark.parametrize("over", [{"meta_inner_steps": [3, 1]}, {"meta_inner_lr": [1e-3, 1e-4]}])
def test_a_reversed_range_is_refused_naming_its_key(over):
    with pytest.raises(ValueError, match=next(iter(over))):
        build_method("piu_meta", settings(method="piu_meta", **over))
