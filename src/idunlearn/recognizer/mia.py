"""Membership inference against the unlearned classifier: a likelihood-ratio attack with shadow models.

What is run (CPU-sized, stated in every table): offline-trained shadow LiRA (Carlini et al. 2022). ``n_shadows``
shadow models are trained with the original recipe on seeded halves of the pool (every train and test image of the
dataset; each image is in exactly half of the shadows). For each image the logit-scaled confidence of its label,
phi = log p_y - log(1 - p_y), gives an IN Gaussian (shadows that trained on it) and an OUT Gaussian (shadows that did
not); with ``fixed_variance`` the two variances are pooled over all images, as LiRA recommends for few shadows. The
attack score of a model on an image is log N(phi; mu_in, s_in) - log N(phi; mu_out, s_out). The reported AUC
separates the forget set D_f (trained on, then unlearned) from the unseen test images; Retrain gives the reference
(about 0.5 for random-subset forgetting).

U-LiRA (Hayes et al. 2025, GSUO Appendix C) is its own stage (``recognizer.ulira``, module ``ulira``): its shadows are
themselves unlearned with the method under attack. Beside both, a shadow-free loss-threshold attack AUC and GSUO's
SVM/loss attack success rate (Fig. 4) are reported for every unlearned model.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from sklearn.metrics import roc_auc_score
from sklearn.svm import SVC
from tqdm.auto import tqdm

from .data import ImageData
from .models import derive_seed
from .training import logits, train_from_scratch

_MEMBERSHIP, _SHADOW, _SVM = 71, 72, 73


def logit_confidence(model_logits: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """LiRA's statistic (Carlini et al. 2022, Section IV-C): phi = log(p_y / (1 - p_y)) = z_y - logsumexp_{k != y} z_k,
    computed from the logits without forming p_y."""
    z = model_logits.double()
    z_y = z[torch.arange(len(y)), y]
    others = z.scatter(1, y.view(-1, 1), float("-inf"))
    return (z_y - torch.logsumexp(others, dim=1)).numpy()


def shadow_memberships(n_items: int, n_shadows: int, seed: int) -> np.ndarray:
    """(n_shadows, n_items) bool: each item is IN for exactly n_shadows / 2 shadows (seeded per item)."""
    if n_shadows < 2 or n_shadows % 2:
        raise ValueError(f"n_shadows must be an even number >= 2, got {n_shadows} (config key "
                         "'recognizer.mia.n_shadows')")
    rng = np.random.default_rng([seed, _MEMBERSHIP])
    half = np.zeros(n_shadows, bool)
    half[: n_shadows // 2] = True
    return np.stack([rng.permutation(half) for _ in range(n_items)], axis=1)


def shadow_models(data: ImageData, model_cfg: dict, training: dict, membership: np.ndarray, seed: int):
    """Yield shadow model k trained with the original recipe on the images of ``membership[k]`` (rows of ``data``)."""
    x, y = data.tensors(np.arange(len(data.labels)))
    for k in tqdm(range(len(membership)), desc="shadows", mininterval=5):
        rows = np.flatnonzero(membership[k])
        model, _ = train_from_scratch(x[rows], y[rows], data.n_classes, data.images.shape[-1], model_cfg, training,
                                      derive_seed(seed, _SHADOW, k), desc=f"shadow {k}")
        yield model


def train_shadows(data: ImageData, model_cfg: dict, training: dict, n_shadows: int, seed: int) -> dict:
    """Shadow models on halves of the pool (all images of ``data``); returns membership (K, N) and phi (K, N)."""
    x, y = data.tensors(np.arange(len(data.labels)))
    membership = shadow_memberships(len(y), n_shadows, seed)
    phi = np.zeros(membership.shape)
    for k, model in enumerate(shadow_models(data, model_cfg, training, membership, seed)):
        phi[k] = logit_confidence(logits(model, x), y)
    return {"membership": membership, "phi": phi, "ids": data.ids}


def lira_scores(phi: np.ndarray, membership: np.ndarray, shadow_phi: np.ndarray,
                fixed_variance: bool = True) -> np.ndarray:
    """Per item, log N(phi; mu_in, s_in) - log N(phi; mu_out, s_out) from the shadows' IN and OUT statistics
    (LiRA, Carlini et al. 2022, Algorithm 1, online variant); ``membership`` and ``shadow_phi`` are (K, n)."""
    inside = np.where(membership, shadow_phi, np.nan)
    outside = np.where(membership, np.nan, shadow_phi)
    mu_in, mu_out = np.nanmean(inside, 0), np.nanmean(outside, 0)
    if fixed_variance:
        s_in = np.full_like(mu_in, np.sqrt(np.nanvar(inside - mu_in)))
        s_out = np.full_like(mu_out, np.sqrt(np.nanvar(outside - mu_out)))
    else:
        s_in, s_out = np.nanstd(inside, 0), np.nanstd(outside, 0)
    s_in, s_out = np.maximum(s_in, 1e-6), np.maximum(s_out, 1e-6)
    return stats.norm.logpdf(phi, mu_in, s_in) - stats.norm.logpdf(phi, mu_out, s_out)


def attack_auc(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> float:
    """ROC AUC of 'member' scores (higher = member) for the forget set (positives) against unseen images (negatives);
    0.5 means indistinguishable. NaN when a side is empty."""
    if len(member_scores) == 0 or len(nonmember_scores) == 0:
        return float("nan")
    truth = np.r_[np.ones(len(member_scores)), np.zeros(len(nonmember_scores))]
    return float(roc_auc_score(truth, np.r_[member_scores, nonmember_scores]))


def balanced_pair(n_positive: int, n_negative: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """1:1 downsampling of positives and negatives (GSUO Appendix C): min(n_positive, n_negative) positions drawn
    without replacement (seeded) from each side, sorted."""
    n = min(n_positive, n_negative)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_positive, n, replace=False)), np.sort(rng.choice(n_negative, n, replace=False))


def llr_accuracy(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> float:
    """Attack accuracy of the likelihood-ratio test at LLR > 0 on balanced sides: with GSUO's 1:1 downsampling the
    priors are equal, so LLR > 0 is the Bayes decision (Neyman-Pearson at ratio 1); no threshold is fitted on the
    evaluated samples. Balanced: (TPR + TNR) / 2. NaN when a side is empty."""
    if len(member_scores) == 0 or len(nonmember_scores) == 0:
        return float("nan")
    return float(((member_scores > 0).mean() + (nonmember_scores <= 0).mean()) / 2)


def svm_loss_attack(loss_retain: np.ndarray, loss_forget: np.ndarray, loss_test: np.ndarray, seed: int) -> float:
    """GSUO Fig. 4's MIA: an SVM on the per-sample loss, trained on retain images (members, 1) against one half of
    the test images (non-members, 0), balanced; its attack success rate is its accuracy on the forget set (as
    members) against the other half of the test images, balanced 1:1, so 0.5 = the forget set looks unseen (the
    paper's ideal), above 0.5 = it looks trained on, below = it looks less seen than unseen images. NaN when a side
    has no image."""
    rng = np.random.default_rng([seed, _SVM])
    test = rng.permutation(len(loss_test))
    fit_test, held_test = loss_test[test[: len(test) // 2]], loss_test[test[len(test) // 2:]]
    if min(len(loss_retain), len(loss_forget), len(fit_test), len(held_test)) == 0:
        return float("nan")
    fit_pos, fit_neg = balanced_pair(len(loss_retain), len(fit_test), int(rng.integers(2 ** 31)))
    features = np.r_[loss_retain[fit_pos], fit_test[fit_neg]].reshape(-1, 1)
    svm = SVC(kernel="rbf", gamma="scale").fit(features, np.r_[np.ones(len(fit_pos)), np.zeros(len(fit_neg))])
    pos, neg = balanced_pair(len(loss_forget), len(held_test), int(rng.integers(2 ** 31)))
    said_member = svm.predict(np.r_[loss_forget[pos], held_test[neg]].reshape(-1, 1))
    return float(((said_member[: len(pos)] == 1).mean() + (said_member[len(pos):] == 0).mean()) / 2)
