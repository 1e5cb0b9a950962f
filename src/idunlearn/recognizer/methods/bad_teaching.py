"""Bad-Teaching (Bad-T; Chundawat et al. 2023), as GSUO Appendix C describes it: the student (initialised as the
original model) moves towards an incompetent teacher (a randomly initialised model of the same architecture) on the
forget set and towards the competent teacher (the original model) on the retain set.

Per sample, L(x, l_u) = (1 - l_u) KL(T_s(x) || S(x)) + l_u KL(T_d(x) || S(x)) (Chundawat et al. eq. 2; l_u = 1 for
forget samples, T_s the competent and T_d the incompetent teacher, distributions at temperature T). An epoch is one
pass over D_f together with a seeded ``retain_fraction`` of D_r (the authors use 30%), shuffled together.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from ..models import build_model, derive_seed
from .common import Problem, adam, epoch_batches, fresh_copy, frozen_copy, step

_BAD_T, _INCOMPETENT = 72, 73


def bad_teacher_loss(student_logits: torch.Tensor, competent_logits: torch.Tensor, incompetent_logits: torch.Tensor,
                     is_forget: torch.Tensor, temperature: float) -> torch.Tensor:
    """Chundawat et al. eq. 2, averaged over the batch: KL(teacher || student) with the incompetent teacher's
    distribution on forget samples and the competent teacher's on retain samples."""
    teacher = torch.where(is_forget[:, None], incompetent_logits, competent_logits)
    p_t = torch.softmax(teacher / temperature, dim=1)
    log_s = torch.log_softmax(student_logits / temperature, dim=1)
    return torch.nn.functional.kl_div(log_s, p_t, reduction="batchmean")


def bad_teaching(original, problem: Problem, settings: dict, seed: int):
    model, competent = fresh_copy(original), frozen_copy(original)
    cfg = original.config
    incompetent = frozen_copy(build_model(cfg["n_classes"], cfg["image_size"], cfg, derive_seed(seed, _INCOMPETENT)))
    rng = np.random.default_rng([seed, _BAD_T])
    n_retain = max(1, int(round(settings["retain_fraction"] * len(problem.y_retain))))
    opt = adam(model.parameters(), settings["lr"])
    model.train()
    for _ in tqdm(range(settings["epochs"]), desc="bad_t", mininterval=5, leave=False):
        retain_rows = torch.from_numpy(rng.permutation(len(problem.y_retain))[:n_retain])
        x = torch.cat([problem.x_retain[retain_rows], problem.x_forget])
        is_forget = torch.cat([torch.zeros(n_retain, dtype=torch.bool),
                               torch.ones(len(problem.y_forget), dtype=torch.bool)])
        for idx in epoch_batches(len(x), settings["batch_size"], rng):
            xb = x[idx]
            with torch.no_grad():
                competent_logits, incompetent_logits = competent(xb), incompetent(xb)
            step(opt, bad_teacher_loss(model(xb), competent_logits, incompetent_logits, is_forget[idx],
                                       settings["temperature"]))
    return model.eval(), {}
