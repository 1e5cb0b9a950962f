import copy

import numpy as np
import pytest
import torch

from idunlearn.models.layers import trainable_parameter_names
from idunlearn.models.mini import build_mini_generator
from idunlearn.unlearning import build_method
from idunlearn.conditions import dirichlet_mixtures
from idunlearn.unlearning.piu import negative_guidance_target
from idunlearn.unlearning.runner import apply_changed_parameters, save_changed_parameters, unlearn

from tiny_world import TINY, straight_and_resumed, tiny_data

RUN = {"method": "piu", "optimiser": "weighted_sum", "regime": "surgical",
       "surgical_blocks": ["down_blocks.2.", "mid_block.", "up_blocks.1.", "up_blocks.2."], "steps": 4,
       "checkpoint_every": 2, "eta": 1.0, "lambda": 10.0, "preserve": True, "forget_batch": 2, "retain_batch": 2,
       "dirichlet_k": 3, "dirichlet_alpha": 1.0, "lr": 1e-3, "betas": [0.9, 0.999], "adam_eps": 1e-8,
       "weight_decay": 0.01}




def test_negative_guidance_target_is_eq1():
    eps_a, eps_f = torch.tensor([1.0, -2.0]), torch.tensor([3.0, 0.5])
    # eps_a - eta (eps_f - eps_a) with eta = 1.5: [1 - 1.5*2, -2 - 1.5*2.5]
    torch.testing.assert_close(negative_guidance_target(eps_a, eps_f, 1.5), torch.tensor([-2.0, -5.75]))
    torch.testing.assert_close(negative_guidance_target(eps_a, eps_f, 0.0), eps_a)


def test_dirichlet_mixtures_are_unit_convex_combinations():
    emb = np.eye(4)[:3]
    mixes = dirichlet_mixtures(emb, 50, np.random.default_rng(0))
    np.testing.assert_allclose(np.linalg.norm(mixes, axis=1), 1.0, atol=1e-6)
    assert (mixes[:, :3] >= 0).all() and np.allclose(mixes[:, 3], 0)


def test_piu_losses_match_the_equations_on_a_fixed_batch():
    torch.manual_seed(0)
    gen = build_mini_generator(TINY)
    teacher = copy.deepcopy(gen.unet)
    data = tiny_data()
    method = build_method("piu", RUN)
    rng, tgen = np.random.default_rng(3), torch.Generator().manual_seed(3)
    obj = method.objectives(gen, teacher, data, rng, tgen)
    # replay the same draws by hand: eq. 1 target, eq. 2 forget loss, eq. 3 preservation loss
    rng, tgen = np.random.default_rng(3), torch.Generator().manual_seed(3)
    sched = gen.training_scheduler()
    with torch.no_grad():
        c_f = gen.conditions(torch.from_numpy(dirichlet_mixtures(data.forget_train, 2, rng)))
        c_a = gen.conditions(torch.from_numpy(np.repeat(data.anchor_centroid[None], 2, 0)))
        x0, noise = torch.randn((2, 1, 8, 8), generator=tgen), torch.randn((2, 1, 8, 8), generator=tgen)
        t = torch.randint(1000, (2,), generator=tgen)
        x_t = sched.add_noise(x0, noise, t)
        target = teacher(x_t, t, c_a).sample - 1.0 * (teacher(x_t, t, c_f).sample - teacher(x_t, t, c_a).sample)
        forget = ((gen.unet(x_t, t, c_f).sample - target) ** 2).mean()
    assert obj.forget.item() == pytest.approx(forget.item(), rel=1e-4)
    assert obj.retain is not None and obj.retain.item() == pytest.approx(0.0, abs=1e-10)  # student == teacher


def test_unlearning_changes_only_the_surgical_layers_and_resumes_exactly(tmp_path):
    torch.manual_seed(0)
    base = build_mini_generator(TINY)
    data = tiny_data()
    straight, log_full, log_resumed = straight_and_resumed(base, data, RUN, tmp_path)
    assert log_full["step"].tolist() == [1, 2, 3, 4]
    changed = {n for n, p in straight.unet.named_parameters()
               if not torch.equal(p, dict(base.unet.named_parameters())[n])}
    assert changed and changed <= set(trainable_parameter_names(base.unet, "surgical"))
    # interrupted after step 2 (a saved state), then resumed: same weights (checked by the helper) and losses
    np.testing.assert_allclose(log_resumed["total_loss"], log_full["total_loss"], rtol=1e-6)
    # only the changed parameters are saved, and applying them to the base model reproduces the result
    save_changed_parameters(straight, "surgical", RUN["surgical_blocks"], tmp_path / "delta.safetensors")
    rebuilt = apply_changed_parameters(copy.deepcopy(base), tmp_path / "delta.safetensors")
    for (n, a), (_, b) in zip(straight.unet.named_parameters(), rebuilt.unet.named_parameters()):
        torch.testing.assert_close(a, b, msg=n)


def test_non_finite_loss_stops_the_run(tmp_path):
    gen = build_mini_generator(TINY)
    data = tiny_data()
    data.forget_train[:] = np.nan
    with pytest.raises(FloatingPointError, match="non-finite loss"):
        unlearn(gen, build_method("piu", RUN), data, RUN, tmp_path / "s.pt", seed=0)


def test_a_resumed_job_s_time_counts_the_steps_before_the_resume(tmp_path):
    base, data = build_mini_generator(TINY), tiny_data()
    first, _ = unlearn(copy.deepcopy(base), build_method("piu", RUN), data, {**RUN, "steps": 2, "checkpoint_every": 1},
                       tmp_path / "s.pt", seed=0)  # interrupted: the state after step 1 is on disk
    log, timings = unlearn(copy.deepcopy(base), build_method("piu", RUN), data, RUN, tmp_path / "s.pt", seed=0)
    assert log["step"].tolist() == [1, 2, 3, 4] and log["seconds"].iloc[0] == first["seconds"].iloc[0]
    assert timings["seconds_total"] == pytest.approx(log["seconds"].sum())
    assert timings["seconds_total"] > log["seconds"].iloc[1:].sum()
