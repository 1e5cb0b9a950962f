"""The usual unlearning baselines for classifiers (as listed in GSUO Section 5.1 and Appendix C).

FT: fine-tune on D_r. GA: gradient ascent on D_f. RL (Graves et al. 2021; GSUO Appendix C): fine-tune on D_f
relabelled at random, D_f only. RL with retain (SalUn's RL, Fan et al. 2024): D_r together with D_f relabelled at
random. SalUn: RL with retain restricted to the parameters whose forget-loss gradient magnitude is in the top
``mask_ratio`` share. SCRUB (Kurmanji et al. 2023): max-steps away from the teacher on D_f, min-steps towards it
(plus cross-entropy) on D_r. l1-sparse (Jia et al. 2023): fine-tune on D_r with an l1 penalty whose weight decays
linearly to zero. EU-k / CF-k (Goel et al. 2022; GSUO Appendix C): the first ``frozen_layers`` weight layers of the
original kept, the rest retrained from a fresh initialisation (EU-k) or fine-tuned (CF-k) on D_r. All use Adam; an
epoch is one pass over the set named in each function.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ..models import build_model, derive_seed
from .common import Problem, adam, ce, epoch_batches, fresh_copy, frozen_copy, random_other_labels, step

# _RL_RETAIN keeps the stream of the former `rl` (now `rl_with_retain`), so that its results do not change
_FT, _GA, _RL_RETAIN, _SALUN, _SCRUB, _L1, _RL, _EU_K, _CF_K, _EU_K_INIT = 41, 42, 43, 44, 45, 46, 47, 48, 49, 50


def _cross_entropy_passes(original, x, y, sign: float, settings: dict, rng: np.random.Generator, desc: str):
    """``epochs`` passes over (x, y) with Adam on sign x cross-entropy (+1 descends, -1 ascends)."""
    model = fresh_copy(original)
    opt = adam(model.parameters(), settings["lr"])
    model.train()
    for _ in tqdm(range(settings["epochs"]), desc=desc, mininterval=5, leave=False):
        for idx in epoch_batches(len(y), settings["batch_size"], rng):
            step(opt, sign * ce(model, x[idx], y[idx]))
    return model.eval(), {}


def finetune(original, problem: Problem, settings: dict, seed: int):
    """FT: cross-entropy on D_r for ``epochs`` passes over D_r."""
    return _cross_entropy_passes(original, problem.x_retain, problem.y_retain, 1.0, settings,
                                 np.random.default_rng([seed, _FT]), "ft")


def gradient_ascent(original, problem: Problem, settings: dict, seed: int):
    """GA: maximise the cross-entropy on D_f for ``epochs`` passes over D_f."""
    return _cross_entropy_passes(original, problem.x_forget, problem.y_forget, -1.0, settings,
                                 np.random.default_rng([seed, _GA]), "ga")


def _relabelled_union(problem: Problem, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """D_r with its labels and D_f with random other labels, drawn once (as in SalUn's RL)."""
    y_random = random_other_labels(problem.y_forget, problem.n_classes, rng)
    return torch.cat([problem.x_retain, problem.x_forget]), torch.cat([problem.y_retain, y_random])


def _train_masked(model, x, y, settings: dict, rng: np.random.Generator, mask: dict | None, desc: str) -> None:
    opt = adam(model.parameters(), settings["lr"])
    model.train()
    for _ in tqdm(range(settings["epochs"]), desc=desc, mininterval=5, leave=False):
        for idx in epoch_batches(len(y), settings["batch_size"], rng):
            opt.zero_grad(set_to_none=True)
            ce(model, x[idx], y[idx]).backward()
            if mask is not None:
                for name, p in model.named_parameters():
                    p.grad.mul_(mask[name])
            opt.step()


def random_labels(original, problem: Problem, settings: dict, seed: int):
    """RL as GSUO Appendix C defines it (Graves et al. 2021): cross-entropy on D_f relabelled at random (each label
    drawn once among the other classes), ``epochs`` passes over D_f; D_r is not used."""
    model, rng = fresh_copy(original), np.random.default_rng([seed, _RL])
    y_random = random_other_labels(problem.y_forget, problem.n_classes, rng)
    _train_masked(model, problem.x_forget, y_random, settings, rng, None, "rl")
    return model.eval(), {}


def random_labels_with_retain(original, problem: Problem, settings: dict, seed: int):
    """RL with retain (SalUn's RL variant): cross-entropy on D_r and on D_f relabelled at random, ``epochs`` passes
    over D_r + D_f."""
    model, rng = fresh_copy(original), np.random.default_rng([seed, _RL_RETAIN])
    x, y = _relabelled_union(problem, rng)
    _train_masked(model, x, y, settings, rng, None, "rl_with_retain")
    return model.eval(), {}


def saliency_mask(model, problem: Problem, ratio: float, batch_size: int) -> dict[str, torch.Tensor]:
    """SalUn's weight saliency: 1 where |d loss_f / d theta| (forget-set cross-entropy, summed over batches) is among
    the top ``ratio`` share of all parameters (one global threshold) and non-zero, else 0."""
    model.zero_grad(set_to_none=True)
    model.train()
    for i in range(0, len(problem.y_forget), batch_size):
        # gradient ascent's loss (-CE); its gradient magnitude is the same as CE's
        (-ce(model, problem.x_forget[i: i + batch_size], problem.y_forget[i: i + batch_size])).backward()
    grads = {name: p.grad.detach().abs() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    flat = torch.cat([g.flatten() for g in grads.values()])
    k = max(1, int(round(ratio * flat.numel())))
    threshold = torch.topk(flat, k, sorted=True).values[-1]
    # weights with a zero gradient never count as salient (with ReLU units, many are exactly zero)
    return {name: ((g >= threshold) & (g > 0)).to(g.dtype) for name, g in grads.items()}


def salun(original, problem: Problem, settings: dict, seed: int):
    """SalUn: RL on the salient weights only (mask from the forget-loss gradient of the original model)."""
    model, rng = fresh_copy(original), np.random.default_rng([seed, _SALUN])
    mask = saliency_mask(model, problem, settings["mask_ratio"], settings["batch_size"])
    x, y = _relabelled_union(problem, rng)
    _train_masked(model, x, y, settings, rng, mask, "salun")
    kept = sum(float(m.sum()) for m in mask.values()) / sum(m.numel() for m in mask.values())
    return model.eval(), {"salun_mask_share": kept}


def distill_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """SCRUB's distillation divergence KL(p_teacher || p_student) at temperature T, scaled by T^2 (Hinton et al.)."""
    log_s = torch.log_softmax(student_logits / temperature, dim=1)
    p_t = torch.softmax(teacher_logits / temperature, dim=1)
    return nn.functional.kl_div(log_s, p_t, reduction="batchmean") * temperature ** 2


def scrub(original, problem: Problem, settings: dict, seed: int):
    """SCRUB: for ``epochs`` epochs, a max-pass over D_f (maximise the divergence from the teacher, only in the first
    ``max_epochs`` epochs) then a min-pass over D_r (gamma * CE + alpha * divergence)."""
    teacher, model = frozen_copy(original), fresh_copy(original)
    rng = np.random.default_rng([seed, _SCRUB])
    opt = adam(model.parameters(), settings["lr"])
    T = settings["temperature"]
    model.train()
    for epoch in tqdm(range(settings["epochs"]), desc="scrub", mininterval=5, leave=False):
        if epoch < settings["max_epochs"]:
            for idx in epoch_batches(len(problem.y_forget), settings["batch_size"], rng):
                x = problem.x_forget[idx]
                step(opt, -distill_kl(model(x), teacher(x), T))
        for idx in epoch_batches(len(problem.y_retain), settings["batch_size"], rng):
            x, y = problem.x_retain[idx], problem.y_retain[idx]
            out = model(x)
            step(opt, settings["gamma"] * nn.functional.cross_entropy(out, y)
                 + settings["alpha"] * distill_kl(out, teacher(x), T))
    return model.eval(), {}


def l1_sparse(original, problem: Problem, settings: dict, seed: int):
    """l1-sparse: cross-entropy on D_r + gamma_t * ||theta||_1 with gamma_t = gamma * (1 - t / T) (linear decay over
    the T optimisation steps), ``epochs`` passes over D_r."""
    model, rng = fresh_copy(original), np.random.default_rng([seed, _L1])
    opt = adam(model.parameters(), settings["lr"])
    per_epoch = -(-len(problem.y_retain) // settings["batch_size"])
    total, t = settings["epochs"] * per_epoch, 0
    model.train()
    for _ in tqdm(range(settings["epochs"]), desc="l1_sparse", mininterval=5, leave=False):
        for idx in epoch_batches(len(problem.y_retain), settings["batch_size"], rng):
            gamma_t = settings["gamma"] * (1.0 - t / total)
            l1 = sum(p.abs().sum() for p in model.parameters())
            step(opt, ce(model, problem.x_retain[idx], problem.y_retain[idx]) + gamma_t * l1)
            t += 1
    return model.eval(), {}



def weight_layers(model) -> list[nn.Module]:
    """The layers with weights, input to output (the conv layers, the feature layer, the head)."""
    return [m for m in [*model.backbone, model.head] if isinstance(m, (nn.Conv2d, nn.Linear))]


def _layer_retraining(original, problem: Problem, settings: dict, seed: int, reinitialise: bool, tag: int, desc: str):
    """GSUO Appendix C (Goel et al. 2022): freeze the first ``frozen_layers`` weight layers; the remaining ones are
    reinitialised (EU-k) or kept (CF-k), then trained with cross-entropy for ``epochs`` passes over D_r."""
    model = fresh_copy(original)
    layers = weight_layers(model)
    k = settings["frozen_layers"]
    if not 0 <= k < len(layers):
        raise ValueError(f"frozen_layers {k} must lie in [0, {len(layers) - 1}] (the model has {len(layers)} weight "
                         "layers; config key 'recognizer.methods.<task>.eu_k|cf_k.frozen_layers')")
    if reinitialise:
        cfg = original.config
        fresh = build_model(cfg["n_classes"], cfg["image_size"], cfg, derive_seed(seed, _EU_K_INIT))
        for layer, new in zip(layers[k:], weight_layers(fresh)[k:]):
            layer.load_state_dict(new.state_dict())
    for layer in layers[:k]:
        for p in layer.parameters():
            p.requires_grad_(False)
    rng = np.random.default_rng([seed, tag])
    opt = adam([p for p in model.parameters() if p.requires_grad], settings["lr"])
    model.train()
    for _ in tqdm(range(settings["epochs"]), desc=desc, mininterval=5, leave=False):
        for idx in epoch_batches(len(problem.y_retain), settings["batch_size"], rng):
            step(opt, ce(model, problem.x_retain[idx], problem.y_retain[idx]))
    return model.eval(), {}


def exact_unlearning_k(original, problem: Problem, settings: dict, seed: int):
    """EU-k: the layers after the first ``frozen_layers`` trained from scratch on D_r."""
    return _layer_retraining(original, problem, settings, seed, True, _EU_K, "eu_k")


def catastrophic_forgetting_k(original, problem: Problem, settings: dict, seed: int):
    """CF-k: the layers after the first ``frozen_layers`` fine-tuned on D_r."""
    return _layer_retraining(original, problem, settings, seed, False, _CF_K, "cf_k")
