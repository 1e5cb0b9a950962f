"""Robust PIU: PIU trained against its own embedding attack."""

import copy

import numpy as np
import pytest
import torch
from torch.nn.functional import mse_loss

from idunlearn.audit.attack import ATTACK_SEED_OFFSET
from idunlearn.audit.probes import AUDIT_SEED_OFFSET
from idunlearn.conditions import dirichlet_mixtures, draw_rows
from idunlearn.config import run_config, validate_config
from idunlearn.evaluation.samples import RETAIN_SEED_OFFSET
from idunlearn.unlearning import build_method
from idunlearn.unlearning.piu_robust import adversarial_seed, drifted_to_retain
from idunlearn.unlearning.runner import unlearn

from tiny_world import tiny_data, tiny_generator

TINY_RUN = {"steps": 3, "checkpoint_every": 2, "forget_batch": 2, "retain_batch": 2, "lr": 1e-3,
            "attack_steps": 2, "attack_restarts": 1, "adversarial_conditions": 2, "attack_lr": 0.05,
            "attack_batch": 2}


def settings(**over) -> dict:
    """A run's full settings as the workflow resolves them (schema defaults, then the run's keys)."""
    config = validate_config({"unlearning": {"runs": {"r": {**TINY_RUN, **over}}}})
    return run_config(config, "r")


def run(generator, run_settings: dict, path, seed: int = 5):
    """Unlearn ``generator`` in place; returns (loss log, the method)."""
    method = build_method(run_settings["method"], run_settings)
    log, _ = unlearn(generator, method, tiny_data(latents=True), run_settings, path, seed=seed)
    return log, method


def test_without_attack_rounds_it_is_piu_bit_for_bit(tmp_path):
    base = tiny_generator()
    piu, robust = copy.deepcopy(base), copy.deepcopy(base)
    log_piu, _ = run(piu, settings(method="piu"), tmp_path / "a.pt")
    log_robust, _ = run(robust, settings(method="piu_robust", attack_every=None), tmp_path / "b.pt")
    for (name, a), (_, b) in zip(piu.unet.named_parameters(), robust.unet.named_parameters()):
        assert torch.equal(a, b), name
    assert log_piu["total_loss"].tolist() == log_robust["total_loss"].tolist()


def test_attack_rounds_give_unit_conditions_in_the_ball_and_resume_exactly(tmp_path):
    # rounds before steps 2 and 3; the straight run leaves its last saved state (after step 2: the round's
    # conditions and the attack's stream) behind, and a fresh copy resumed from it ends where the straight run did
    cfg = settings(method="piu_robust", attack_every=1, attack_min_cosine=0.5, retain_drift_margin=-2.0,
                   checkpoint_every=1)
    base = tiny_generator()
    straight, resumed = copy.deepcopy(base), copy.deepcopy(base)
    log_full, method = run(straight, cfg, tmp_path / "a.pt")
    log_resumed, again = run(resumed, cfg, tmp_path / "a.pt")
    assert log_resumed["step"].tolist() == [1, 2, 3]  # steps 1-2 from the saved state, step 3 rerun
    for (name, a), (_, b) in zip(straight.unet.named_parameters(), resumed.unet.named_parameters()):
        torch.testing.assert_close(a, b, msg=name)
    np.testing.assert_allclose(log_resumed["total_loss"], log_full["total_loss"], rtol=1e-6)
    torch.testing.assert_close(again.adversarial, method.adversarial)
    conditions = method.adversarial
    assert conditions.shape == (2, 16)
    torch.testing.assert_close(conditions.norm(dim=1), torch.ones(2))
    centre = torch.nn.functional.normalize(torch.from_numpy(tiny_data().forget_train.mean(axis=0)), dim=0)
    assert (conditions @ centre >= 0.5 - 1e-6).all()
    # margin -2: every condition counts as drifted, so all of them went to the retain side
    assert method.retain_side.all() and method.extra_batch(straight, "forget") is None


def test_inner_attack_seed_depends_on_the_run_seed_only_and_is_no_evaluation_seed():
    # the workflow's run seed is config seed + forget identity (workflow/scripts/unlearn.py); the evaluation draws
    # samples from config seed + i and + RETAIN_SEED_OFFSET + i, the audit from + AUDIT_SEED_OFFSET (+
    # ATTACK_SEED_OFFSET) + i and runs its attack from config seed + 0 / 1. Seeding the inner attack with the run's
    # seed (or any of these) would make it replay an evaluation or audit stream.
    config_seed, span = 42, AUDIT_SEED_OFFSET + ATTACK_SEED_OFFSET + RETAIN_SEED_OFFSET
    seeds = [adversarial_seed(config_seed + identity) for identity in range(40)]
    assert len(set(seeds)) == 40 and seeds == [adversarial_seed(config_seed + i) for i in range(40)]
    assert not any(config_seed <= s < config_seed + span for s in seeds)
    method = build_method("piu_robust", settings(method="piu_robust", attack_every=1))
    method.start(config_seed)
    audit_attack_stream = torch.Generator().manual_seed(config_seed)
    assert not torch.equal(torch.randn(8, generator=method.gen), torch.randn(8, generator=audit_attack_stream))


def test_conditions_drifting_to_a_retain_identity_go_to_the_retain_side():
    forget, retain = torch.eye(4)[0], torch.eye(4)[1:3]
    toward_retain = torch.nn.functional.normalize(torch.tensor([0.6, 0.8, 0.0, 0.0]), dim=0)  # cos 0.6 vs 0.8
    toward_forget = torch.nn.functional.normalize(torch.tensor([0.8, 0.0, 0.6, 0.0]), dim=0)  # cos 0.8 vs 0.6
    conditions = torch.stack([toward_retain, toward_forget])
    assert drifted_to_retain(conditions, forget, retain, 0.0).tolist() == [True, False]
    assert drifted_to_retain(conditions, forget, retain, 0.3).tolist() == [False, False]  # 0.8 - 0.6 < 0.3


def test_adversarial_rows_join_the_forget_batch_with_piu_targets_and_the_retain_batch_with_teacher_targets():
    generator, data = tiny_generator(), tiny_data()
    teacher = copy.deepcopy(generator.unet)
    with torch.no_grad():  # a student that differs from the teacher, so that the preservation loss is not 0
        for p in generator.unet.parameters():
            p.add_(0.01)
    method = build_method("piu_robust", settings(method="piu_robust", attack_every=10, eta=1.5))
    method.start(0)
    adversarial, side = torch.from_numpy(tiny_data(seed=1).forget_train[:2]), torch.tensor([False, True])
    method.load_state_dict({"step": 1, "adversarial": adversarial, "retain_side": side,
                            "gen": method.gen.get_state()})
    stream = method.gen.get_state()
    obj = method.objectives(generator, teacher, data, np.random.default_rng(3), torch.Generator().manual_seed(3))
    # replay by hand: PIU's batch from the run's streams, one adversarial row per side from the attack's stream
    rng, gen, own = np.random.default_rng(3), torch.Generator().manual_seed(3), torch.Generator()
    own.set_state(stream)
    sched = generator.training_scheduler()

    def noisy(n, g):
        x0, noise = torch.randn((n, 1, 8, 8), generator=g), torch.randn((n, 1, 8, 8), generator=g)
        t = torch.randint(1000, (n,), generator=g)
        return sched.add_noise(x0, noise, t), t

    with torch.no_grad():
        emb_f = torch.cat([torch.from_numpy(dirichlet_mixtures(data.forget_train, 2, rng)), adversarial[:1]])
        (x_f, t_f), (xa_f, ta_f) = noisy(2, gen), noisy(1, own)
        x_f, t_f = torch.cat([x_f, xa_f]), torch.cat([t_f, ta_f])
        c_f = generator.conditions(emb_f)
        c_a = generator.conditions(torch.from_numpy(np.repeat(data.anchor_centroid[None], 3, 0)))
        eps_a = teacher(x_f, t_f, c_a).sample
        target = eps_a - 1.5 * (teacher(x_f, t_f, c_f).sample - eps_a)  # PIU eq. 1 at every forget row
        forget = mse_loss(generator.unet(x_f, t_f, c_f).sample, target)  # PIU eq. 2
        emb_r = torch.cat([torch.from_numpy(draw_rows(data.retain_train, 2, rng)), adversarial[1:]])
        (x_r, t_r), (xa_r, ta_r) = noisy(2, gen), noisy(1, own)
        x_r, t_r = torch.cat([x_r, xa_r]), torch.cat([t_r, ta_r])
        c_r = generator.conditions(emb_r)
        retain = mse_loss(generator.unet(x_r, t_r, c_r).sample, teacher(x_r, t_r, c_r).sample)  # PIU eq. 3
    assert obj.forget.item() == pytest.approx(forget.item(), rel=1e-5)
    assert obj.retain.item() == pytest.approx(retain.item(), rel=1e-5) and retain.item() > 0
