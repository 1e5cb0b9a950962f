"""WID (the with-identity-loss variant of "Unlearn and Protect"), adapted to Arc2Face (PIU appendix C.3)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn.functional import interpolate, mse_loss, normalize

from ..conditions import dirichlet_mixtures
from ..faces.align import ALIGNED_SIZE
from ..models.generator import IdentityGenerator, unit_rgb
from .base import Objectives, UnlearningData
from .conditions import noised, predicted_x0
from .piu import PIU


def recognizer_input(generator: IdentityGenerator, latents: torch.Tensor) -> torch.Tensor:
    """Latents -> (N, 3, 112, 112) float RGB in [0, 255], differentiable: the generator's decode (VAE for latent
    models, identity in pixel space; [-1, 1] clamped), the whole frame bicubic-resized to the aligned-face size,
    without rounding. A differentiable stand-in for detection + alignment: close to the evaluation's aligned crop for
    the mini generator, whose frames are template-aligned faces; only approximate for Arc2Face's 512 px frames."""
    vae = generator.vae
    images = vae.decode((latents / generator.vae_scale).to(vae.dtype)).sample if vae is not None else latents
    images = unit_rgb(images)
    if images.shape[-1] != ALIGNED_SIZE:
        images = interpolate(images, size=(ALIGNED_SIZE,) * 2, mode="bicubic", align_corners=False)
    return images.clamp(0, 1) * 255


class WID(PIU):
    """L_total = L_forget + lambda ||s_id - s_hat_id||^2 with eta = 0 (PIU appendix eq. 47).

    Both terms are evaluated on real images x0 of the anchor identity, noised to x_t: the forget term makes the
    student under forget conditions c_f (Dirichlet mixtures, as PIU) predict what the frozen model predicts under
    the anchor centroid (eq. 44); the identity term compares the recognizer's embedding s_hat_id of the decoded
    one-step estimate x0_hat (eq. 46, from the student's c_f prediction) with s_id, the embedding of the clean x0
    itself at the generator's resolution (eq. 45).

    Reference embedding: s_id = recognizer(x0) for an anchor image x0, i.e. the anchor's identity. WID aligns
    p_theta(. | c_f) with p_theta*(. | c_a) (eq. 36, an expectation over the anchor's images), and its identity
    loss is meant to keep reconstructions under c_f on the desired identity. Taking x0 from the anchor makes
    the paper's literal reference ("the original clean image", eq. 45) and that intent the same identity, whereas
    forget-identity images compared with their own embeddings would reward reproducing the forget identity,
    working against the forget term.

    params: forget_batch (anchor images per step), dirichlet_k, dirichlet_alpha, wid_lambda, eta (must be 0).
    """

    name = "wid"
    needs = ("latents", "recognizer")
    joint = False  # its images come from one anchor identity

    def __init__(self, params: dict):
        if params["eta"] != 0:
            raise ValueError(f"method 'wid' matches the anchor prediction itself (eta = 0, PIU appendix eq. 43): "
                             f"set eta: 0 in its unlearning.runs entry (got {params['eta']})")
        super().__init__(params)

    def objectives(self, generator: IdentityGenerator, teacher: nn.Module, data: UnlearningData,
                   rng: np.random.Generator, gen: torch.Generator) -> Objectives:
        p, sched, device = self.params, generator.training_scheduler(), generator.device
        anchors, recognizer = data.require("anchor_latents", self.name), data.require("recognizer", self.name)
        n = p["forget_batch"]
        x0 = anchors[rng.integers(len(anchors), size=n)]
        forget_emb = dirichlet_mixtures(data.forget_train, n, rng, p["dirichlet_k"], p["dirichlet_alpha"])
        with torch.no_grad():  # frozen text encoder
            c_f = generator.conditions(torch.from_numpy(forget_emb))
            c_a = self.reference_conditions(generator, np.repeat(data.anchor_centroid[None], n, axis=0))
        x_t, t, _ = noised(sched, x0, gen, device)
        with torch.no_grad():  # eps_hat_forget = eps*(z_t, t, c_a) (PIU appendix eq. 43, eq. 40 with eta = 0)
            target = generator.predict_noise(x_t, t, c_a, unet=teacher)
            s_id = normalize(recognizer(recognizer_input(generator, x0.to(device))), dim=1)
        eps = generator.predict_noise(x_t, t, c_f)
        forget = mse_loss(eps.float(), target.float())  # PIU appendix eq. 44
        s_hat = normalize(recognizer(recognizer_input(generator, predicted_x0(sched, x_t, t, eps))), dim=1)
        identity = ((s_id - s_hat) ** 2).sum(dim=1).mean()  # ||s_id - s_hat_id||^2 (PIU appendix eq. 47)
        return Objectives(forget + p["wid_lambda"] * identity, None)
