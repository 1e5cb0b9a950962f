"""UCE (Gandikota et al.): a closed-form edit of the cross-attention key and value projections, adapted to
identity conditions (PIU appendix C.2)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..models.generator import IdentityGenerator
from .base import ClosedFormMethod, UnlearningData
from .conditions import forget_conditions

EDITED = ("attn2.to_k.weight", "attn2.to_v.weight")


def uce_edit(weight: torch.Tensor, erase: torch.Tensor, guide: torch.Tensor, preserve: torch.Tensor,
             alpha_erase: float, alpha_preserve: float, lam: float) -> torch.Tensor:
    """The minimiser of eq. 34, by its closed form (PIU appendix eq. 35):
    W = (a_e sum v*_i c_i^T + a_p sum W c_j c_j^T + lam W)(a_e sum c_i c_i^T + a_p sum c_j c_j^T + lam I)^-1,
    with v*_i = W c*_i (eq. 31). weight: (out, d); erase, guide: (n_e, d) rows c_i, c*_i; preserve: (n_p, d)."""
    w, e, g, p = (x.double() for x in (weight, erase, guide, preserve))
    v_star = g @ w.T  # rows v*_i^T (eq. 31)
    gram = alpha_erase * e.T @ e + alpha_preserve * p.T @ p + lam * torch.eye(w.shape[1], dtype=w.dtype,
                                                                                device=w.device)
    rhs = alpha_erase * v_star.T @ e + alpha_preserve * w @ p.T @ p + lam * w
    return torch.linalg.solve(gram, rhs.T).T.to(weight.dtype)  # rhs gram^-1; gram is symmetric


def token_mean(conditions: torch.Tensor) -> torch.Tensor:
    """The concept vector c of a condition: the mean of its 77 encoder output tokens (the Arc2Face adaptation
    of the public PIU reimplementation, for which alpha_e, alpha_p and lambda were tuned)."""
    return conditions.float().mean(dim=1)


class UCE(ClosedFormMethod):
    """Edit to_k and to_v of every cross-attention layer in the run's regime (the paper: all of them).

    Erase set E: the conditions of the forget-train embeddings and of ``uce_erase_mixtures`` Dirichlet mixtures of
    them (PIU appendix C.2.2: "multiple conditioning embeddings ... together with their linear combinations", the
    mixtures of Section 3.4 with PIU's ``dirichlet_k`` / ``dirichlet_alpha``; 0 gives the plain set of the public
    reimplementation); guide c* for each: the anchor centroid's condition; preservation set P: the anchor centroid
    and ``uce_preserve - 1`` other retain-train centroids (seeded draw). Joint unlearning: every forget identity's
    rows, each guided to its own anchor; P holds every anchor and the ``uce_preserve - 1`` others.

    params: uce_alpha_erase, uce_alpha_preserve, uce_lambda, uce_preserve, uce_erase_mixtures, dirichlet_k,
    dirichlet_alpha.
    """

    name = "uce"

    joint = True

    def erase_embeddings(self, data: UnlearningData, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The forget-train embeddings followed by ``uce_erase_mixtures`` Dirichlet mixtures of them (each within one
        forget identity, shared among the identities as PIU's batch), and the forget identity (index into
        ``data.anchors()``) of each row, whose anchor is its guide."""
        p, plain = self.params, np.asarray(data.forget_train, np.float32)
        if p["uce_erase_mixtures"] == 0:
            return plain, data.groups()
        mixtures, groups = forget_conditions(data, p["uce_erase_mixtures"], rng, p["dirichlet_k"],
                                             p["dirichlet_alpha"], with_groups=True)
        return np.concatenate([plain, mixtures]), np.concatenate([data.groups(), groups])

    def edit(self, generator: IdentityGenerator, data: UnlearningData, trainable: dict[str, nn.Parameter],
             rng: np.random.Generator) -> dict:
        p = self.params
        a_e, a_p, lam = p["uce_alpha_erase"], p["uce_alpha_preserve"], p["uce_lambda"]
        targets = [w for n, w in trainable.items() if n.endswith(EDITED)]
        if not targets:
            raise ValueError("the run's regime selects no cross-attention to_k/to_v weight for uce to edit")
        others = data.require("retain_centroids", self.name)
        chosen = np.sort(rng.choice(len(others), size=min(p["uce_preserve"] - 1, len(others)), replace=False))
        anchors = np.asarray(data.anchors(), np.float32)
        preserve_emb = np.concatenate([anchors, others[chosen]]).astype(np.float32)
        erase_emb, erase_groups = self.erase_embeddings(data, rng)
        with torch.no_grad():
            erase = token_mean(generator.conditions(torch.from_numpy(erase_emb)))
            # each erased condition's guide c*: its own forget identity's anchor (one encoding per anchor)
            guide = token_mean(generator.conditions(torch.from_numpy(anchors)))[torch.from_numpy(erase_groups)]
            preserve = token_mean(generator.conditions(torch.from_numpy(preserve_emb)))
            terms = np.zeros(3)  # the three terms of eq. 34 after the edit, summed over the edited matrices
            for weight in targets:
                old = weight.detach().float().clone()
                weight.copy_(uce_edit(old, erase, guide, preserve, a_e, a_p, lam))
                delta = weight.float() - old
                terms += [float(((erase @ weight.float().T - guide @ old.T) ** 2).sum()),
                          float(((preserve @ delta.T) ** 2).sum()), float((delta ** 2).sum())]
        return {"forget_loss": terms[0], "retain_loss": terms[1], "total_loss": float(np.dot([a_e, a_p, lam], terms)),
                "backward_passes": 0, "edited_matrices": len(targets)}
