"""GSUO (Signal-Guided Unlearning Optimisation): Signal-Guided Optimisation (SGO) then Compensatory Optimisation (CO).

Random-subset forgetting (GSUO Section 4.1): the forget samples are split into Normal and Boundary by the original
model's confidence in their label; Normal target = alpha * softmax(f(x; Theta_o)) + (1 - alpha) / C (eq. 1);
Boundary target = the prediction distribution P_c* of the nearest retained class prototype other than the sample's
own class (eq. 2); SGO minimises KL(p_target || p_model) over the forget set, Normal and Boundary weighted equally;
CO fine-tunes on the retain set with cross-entropy.

Class-wise forgetting (GSUO Section 4.2): SGO minimises w_disp * L_disp (intra-class dispersion, eq. 3) + w_align *
L_align (alignment of the forget-class centre with the retained global centre, eq. 4) on the feature extractor; CO
minimises cross-entropy on the retain set minus ga_weight * cross-entropy on the forget samples still classified
correctly (gradient ascent that stops once a sample is forgotten), with a small learning rate on the feature extractor
and a larger one on the head (layer-wise learning rates).

Choices the paper leaves open (documented in the config schema): how the Boundary set is sized (``boundary_rule``:
``error_rate`` makes the Boundary share of the forget set equal to the original model's test error, ``threshold``
takes the samples whose label probability is below ``boundary_threshold``); prototypes and their distributions come
from the original model; the retained global centre of eq. 4 is recomputed with the current model (no gradient) at
the start of every SGO epoch.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ..training import features, logits
from .common import Problem, adam, cycle, epoch_batches, fresh_copy, step

_PROTOTYPES, _SGO, _CO = 31, 32, 33


# ------------------------------------------------------------------------------------------ random-subset signals
def normal_target(p_original: torch.Tensor, alpha: float) -> torch.Tensor:
    """GSUO eq. 1: p_target = alpha * softmax(f(x_n; Theta_o)) + (1 - alpha) * 1/C, from the original probabilities."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha} "
                         "(config key 'recognizer.methods.random_subset.gsuo.alpha')")
    return alpha * p_original + (1.0 - alpha) / p_original.shape[1]


def class_prototypes(feats: torch.Tensor, labels: torch.Tensor, n_classes: int) -> torch.Tensor:
    """GSUO Section 4.1.1: mu_c = (1/R) sum Phi(x) over the sampled retain images of class c; NaN rows for classes
    without any."""
    protos = torch.full((n_classes, feats.shape[1]), float("nan"), dtype=feats.dtype)
    for c in range(n_classes):
        rows = labels == c
        if rows.any():
            protos[c] = feats[rows].mean(0)
    return protos


def prototype_distributions(head: nn.Module, prototypes: torch.Tensor) -> torch.Tensor:
    """GSUO Section 4.1.1: P_c = softmax(h(mu_c; omega)), the prediction distribution of each class prototype."""
    with torch.no_grad():
        return torch.softmax(head(torch.nan_to_num(prototypes)), dim=1)


def nearest_other_prototype(feats: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """GSUO eq. 2: c* = argmin_{c != y_true} ||Phi(x_b) - mu_c||^2 (classes without a prototype are skipped)."""
    dist = torch.cdist(feats.double(), torch.nan_to_num(prototypes).double()) ** 2
    dist[:, torch.isnan(prototypes).any(1)] = float("inf")
    dist[torch.arange(len(labels)), labels] = float("inf")
    return dist.argmin(1)


def boundary_mask(confidence: torch.Tensor, rule: str, threshold: float, error_rate: float) -> torch.Tensor:
    """Boundary (True) versus Normal (False) forget samples by the original model's probability of their label.

    ``threshold``: confidence < threshold. ``error_rate``: the round(error_rate * N_f) least confident samples
    (ties broken by position), so that the Boundary share equals the original model's test error."""
    if rule == "threshold":
        return confidence < threshold
    if rule == "error_rate":
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error rate {error_rate} outside [0, 1]")
        n_boundary = int(round(error_rate * len(confidence)))
        mask = torch.zeros(len(confidence), dtype=torch.bool)
        mask[torch.from_numpy(np.argsort(confidence.numpy(), kind="stable")[:n_boundary])] = True
        return mask
    raise ValueError(f"unknown boundary rule {rule!r}: use 'error_rate' or 'threshold' "
                     "(config key 'recognizer.methods.random_subset.gsuo.boundary_rule')")


def kl_alignment(target: torch.Tensor, model_logits: torch.Tensor) -> torch.Tensor:
    """GSUO Section 4.1.1: mean over samples of KL(p_target || p_model) = sum_k t_k (log t_k - log p_k)."""
    log_p = torch.log_softmax(model_logits, dim=1)
    t = target.clamp_min(0)
    return (torch.xlogy(t, t) - t * log_p).sum(1).mean()


def random_subset_targets(original, problem: Problem, settings: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per forget sample the target distribution (eq. 1 or eq. 2) and the Boundary mask."""
    p_orig = torch.softmax(logits(original, problem.x_forget), dim=1)
    confidence = p_orig[torch.arange(len(problem.y_forget)), problem.y_forget]
    boundary = boundary_mask(confidence, settings["boundary_rule"], settings["boundary_threshold"],
                             1.0 - problem.original_test_accuracy)
    # prototypes: R retain images per class (GSUO's D_P^c), drawn with the experiment's seed
    rng = np.random.default_rng([seed, _PROTOTYPES])
    y_r = problem.y_retain.numpy()
    rows = np.concatenate([rng.permutation(np.flatnonzero(y_r == c))[: settings["prototype_samples"]]
                           for c in range(problem.n_classes)]).astype(np.int64)
    protos = class_prototypes(features(original, problem.x_retain[rows]), problem.y_retain[rows], problem.n_classes)
    targets = normal_target(p_orig, settings["alpha"])
    if boundary.any():
        nearest = nearest_other_prototype(features(original, problem.x_forget[boundary]), problem.y_forget[boundary],
                                          protos)
        targets[boundary] = prototype_distributions(original.head, protos)[nearest]
    return targets, boundary


def unlearn_random_subset(original, problem: Problem, settings: dict, seed: int) -> tuple[nn.Module, dict]:
    targets, boundary = random_subset_targets(original, problem, settings, seed)
    model = fresh_copy(original)
    rng = np.random.default_rng([seed, _SGO])
    opt = adam(model.parameters(), settings["sgo_lr"])
    model.train()
    for _ in tqdm(range(settings["sgo_epochs"]), desc="gsuo sgo", mininterval=5, leave=False):
        for idx in epoch_batches(len(targets), settings["batch_size"], rng):
            step(opt, kl_alignment(targets[idx], model(problem.x_forget[idx])))
    _compensate_on_retain(model, problem, settings, seed)
    return model.eval(), {"n_boundary": int(boundary.sum()), "n_normal": int((~boundary).sum())}


def _compensate_on_retain(model, problem: Problem, settings: dict, seed: int) -> None:
    """GSUO Section 4.1.2 (CO): cross-entropy fine-tuning on D_r (a seeded ``co_fraction`` of it per epoch)."""
    rng = np.random.default_rng([seed, _CO])
    opt = adam(model.parameters(), settings["co_lr"])
    n = len(problem.y_retain)
    per_epoch = max(1, int(round(settings["co_fraction"] * n)))
    model.train()
    for _ in tqdm(range(settings["co_epochs"]), desc="gsuo co", mininterval=5, leave=False):
        subset = rng.permutation(n)[:per_epoch]
        for i in range(0, per_epoch, settings["batch_size"]):
            idx = subset[i: i + settings["batch_size"]]
            step(opt, nn.functional.cross_entropy(model(problem.x_retain[idx]), problem.y_retain[idx]))


# ---------------------------------------------------------------------------------------------- class-wise signals
def dispersion_loss(feats: torch.Tensor, labels: torch.Tensor, forget_classes) -> torch.Tensor:
    """GSUO eq. 3: L_disp = -(1/|Y_f|) sum_c log( 1/(N_c (N_c - 1)) sum_{i != j} (1 - cos(Phi_i, Phi_j)) ),
    over the normalised features of each forget class (classes with fewer than two samples are skipped)."""
    terms = []
    for c in forget_classes:
        z = nn.functional.normalize(feats[labels == c], dim=1)
        n = len(z)
        if n < 2:
            continue
        off_diagonal = (1.0 - z @ z.T).sum() - (1.0 - (z * z).sum(1)).sum()  # the i == j terms are 1 - 1 = 0
        terms.append(-torch.log((off_diagonal / (n * (n - 1))).clamp_min(1e-12)))
    if not terms:
        raise ValueError("dispersion loss needs a forget class with at least two samples in the batch")
    return torch.stack(terms).mean()


def alignment_loss(feats: torch.Tensor, labels: torch.Tensor, forget_classes,
                   retain_centre: torch.Tensor) -> torch.Tensor:
    """GSUO eq. 4: L_align = (1/|Y_f|) sum_c (1 - cos(mu_f^c, mu_r)), mu_f^c the mean of the normalised features of
    forget class c, mu_r the (unnormalised) mean feature of the retain set."""
    terms = []
    for c in forget_classes:
        rows = labels == c
        if not rows.any():
            continue
        centre = nn.functional.normalize(feats[rows], dim=1).mean(0)
        terms.append(1.0 - nn.functional.cosine_similarity(centre, retain_centre, dim=0))
    if not terms:
        raise ValueError("alignment loss needs at least one forget-class sample in the batch")
    return torch.stack(terms).mean()


def suppression_loss(forget_logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """CO's ascent term (GSUO Section 4.2.2, "suppressing accurate predictions for forget samples"): the summed
    cross-entropy of the forget samples that are still classified as their label, divided by the batch size; samples
    already misclassified contribute nothing, so the ascent stops instead of running away."""
    still_correct = (forget_logits.argmax(1) == y).to(forget_logits.dtype)
    per_sample = nn.functional.cross_entropy(forget_logits, y, reduction="none")
    return (per_sample * still_correct).sum() / max(len(y), 1)


def unlearn_classwise(original, problem: Problem, settings: dict, seed: int) -> tuple[nn.Module, dict]:
    model = fresh_copy(original)
    rng = np.random.default_rng([seed, _SGO])
    opt = adam(model.backbone.parameters(), settings["sgo_lr"])
    last = {}
    for _ in tqdm(range(settings["sgo_epochs"]), desc="gsuo sgo", mininterval=5, leave=False):
        retain_centre = features(model, problem.x_retain).mean(0)  # current model, no gradient (module docstring)
        model.train()
        for idx in epoch_batches(len(problem.y_forget), settings["batch_size"], rng):
            if len(idx) < 2:
                continue
            feats, y = model.features(problem.x_forget[idx]), problem.y_forget[idx]
            l_disp = dispersion_loss(feats, y, problem.forget_classes)
            l_align = alignment_loss(feats, y, problem.forget_classes, retain_centre)
            step(opt, settings["w_disp"] * l_disp + settings["w_align"] * l_align)
            last = {"l_disp": l_disp.item(), "l_align": l_align.item()}
    # CO: CE on D_r - ga_weight * CE on D_f, layer-wise learning rates (GSUO Section 4.2.2)
    opt = torch.optim.Adam([{"params": model.backbone.parameters(), "lr": settings["co_lr_backbone"]},
                            {"params": model.head.parameters(), "lr": settings["co_lr_head"]}])
    rng = np.random.default_rng([seed, _CO])
    forget_batches = cycle(len(problem.y_forget), settings["batch_size"], rng)
    model.train()
    for _ in tqdm(range(settings["co_epochs"]), desc="gsuo co", mininterval=5, leave=False):
        for idx in epoch_batches(len(problem.y_retain), settings["batch_size"], rng):
            f_idx = next(forget_batches)
            loss = nn.functional.cross_entropy(model(problem.x_retain[idx]), problem.y_retain[idx])
            step(opt, loss - settings["ga_weight"] * suppression_loss(model(problem.x_forget[f_idx]),
                                                                       problem.y_forget[f_idx]))
    return model.eval(), {f"sgo_final_{k}": v for k, v in last.items()}


def unlearn(original, problem: Problem, settings: dict, seed: int) -> tuple[nn.Module, dict]:
    if problem.task == "random_subset":
        return unlearn_random_subset(original, problem, settings, seed)
    return unlearn_classwise(original, problem, settings, seed)
