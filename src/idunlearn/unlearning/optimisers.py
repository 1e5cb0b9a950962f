"""Optimisers turn (forget objective, retain objective) into a parameter update on the trainable parameters.

Convention: every optimiser MINIMISES both objectives it receives (``Objectives.forget`` and ``Objectives.retain``);
a method that ascends a loss returns its negative. The update direction is handed to AdamW as the gradient (the
base step of the papers' setups), optionally clipped to a global norm (config key ``grad_clip``). Gradients are
taken over the trainable parameters only, flattened into one vector where two gradients must be combined.

| config ``optimiser``   | direction                                                     | backward passes |
|------------------------|---------------------------------------------------------------|-----------------|
| ``weighted_sum``       | grad(forget + lambda retain), PIU eq. 4                        | 1               |
| ``eupmu``              | grad(forget + lambda_t retain), lambda_t from the same batch   | 1 (+1 forward)  |
| ``eupmu_fast``         | as ``eupmu``, lambda_t from consecutive batches               | 1               |
| ``unilateral_surgery`` | EUPMU Proposition 3.2 (explicit; "UNGrad" in EUPMU Table 4)    | 2               |
| ``epsilon_constrained``| grad f2 + eta_t grad f1 (epsilon-constrained Algorithm 1)      | 2               |
| ``siss_scaled``        | g_r + beta (norm g_r / norm g_f) g_f (PIU appendix C.1, eq. 28)| 2               |

Each ``step`` returns a row for the loss log: ``forget_loss``, ``retain_loss``, ``total_loss`` (the scalar whose
gradient, with the step's weights held fixed, is the update direction), ``backward_passes`` and the optimiser's own
quantities (``lambda_t``, ``eta_t``, ...). Internal state (weights, previous losses) is part of ``state_dict`` so a
resumed run continues exactly.
"""

from __future__ import annotations

import math

import torch

from .base import Objectives

VARPI = 1e-7  # numerical stability variable of the epsilon-constrained Algorithm 1 (line 1)
EPSILON_SCALES = ("first_step", "batch")  # Phase II: f1 in units of its first-step value, or of each batch's f1_0
EPSILON_PHASES = ("highest", "lowest", "controlled", "original")


def flat_grad(loss: torch.Tensor, params: list[torch.nn.Parameter], retain_graph: bool = False) -> torch.Tensor:
    """d loss / d params flattened into one vector in ``params`` order (zeros for parameters the loss skips)."""
    grads = torch.autograd.grad(loss, params, retain_graph=retain_graph, allow_unused=True, materialize_grads=True)
    return torch.cat([g.reshape(-1) for g in grads])


def epsilon_at(fraction: float, f1_highest: float, f1_lowest: float) -> float:
    """Phase II's epsilon at ``fraction`` of the range between the Phase I boundaries (epsilon-constrained Sec. 4.3).

    ``f1_highest``: the forget objective f1 at the highest-completeness boundary (Phase I ``highest`` run), which
    estimates f1*; ``f1_lowest``: f1 at the lowest-completeness boundary (``lowest`` run). The paper's grid is
    fractions 0.25, 0.5, 0.75 (range [1, 9] gives epsilon 3, 5, 7). An empty range (f1_lowest <= f1_highest: the
    boundaries coincide up to noise, a degenerate front) gives f1_highest, the paper's lower end f1*.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"epsilon fraction must lie strictly between 0 and 1 (got {fraction})")
    return f1_highest + fraction * max(f1_lowest - f1_highest, 0.0)


class Optimiser:
    """AdamW base step on the trainable parameters; subclasses choose the direction."""

    name: str

    def __init__(self, params: list[torch.nn.Parameter], cfg: dict):
        self.params = params
        self.adamw = torch.optim.AdamW(params, lr=cfg["lr"], betas=tuple(cfg["betas"]), eps=cfg["adam_eps"],
                                       weight_decay=cfg["weight_decay"])
        self.grad_clip = cfg.get("grad_clip")
        self.state: dict = {}  # the optimiser's own resumable quantities (floats or None)

    def step(self, objectives: Objectives) -> dict:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {"adamw": self.adamw.state_dict(), **self.state}

    def load_state_dict(self, state: dict) -> None:
        self.adamw.load_state_dict(state["adamw"])
        self.state = {key: state[key] for key in self.state}

    def _check(self, objectives: Objectives, need_retain: bool) -> None:
        retain = objectives.retain
        if need_retain and retain is None:
            raise ValueError(f"optimiser {self.name!r} needs a retain objective, but the method returned none "
                             f"(is config key 'preserve' false?)")
        if not torch.isfinite(objectives.forget) or (retain is not None and not torch.isfinite(retain)):
            raise FloatingPointError(f"non-finite loss (forget {objectives.forget.item()}, retain "
                                     f"{retain.item() if retain is not None else 'none'})")

    def _adamw_step(self) -> None:
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.adamw.step()

    def _step_on(self, loss: torch.Tensor) -> None:
        """One backward pass of ``loss``, then the base step."""
        self.adamw.zero_grad(set_to_none=True)
        loss.backward()
        self._adamw_step()

    def _flat_params(self) -> torch.Tensor:
        """The trainable parameters' values flattened into one vector in ``params`` order (as ``flat_grad``)."""
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def _parts(self, vector: torch.Tensor):
        """(parameter, its slice of the flattened ``vector`` shaped like it), in ``params`` order."""
        for param, part in zip(self.params, vector.split([p.numel() for p in self.params])):
            yield param, part.view_as(param)

    def _step_along(self, direction: torch.Tensor) -> None:
        """The base step with the flattened ``direction`` as the gradient."""
        for param, part in self._parts(direction):
            param.grad = part
        self._adamw_step()

    def _gradients(self, objectives: Objectives) -> tuple[torch.Tensor, torch.Tensor]:
        """Flattened gradients of the forget and the retain objective: two backward passes."""
        # the two objectives may share a graph (one batched forward): keep it for the second pass
        return (flat_grad(objectives.forget, self.params, retain_graph=True),
                flat_grad(objectives.retain, self.params))

    @staticmethod
    def _row(objectives: Objectives, total: float, backward_passes: int, **extra) -> dict:
        retain = objectives.retain.item() if objectives.retain is not None else float("nan")
        return {"forget_loss": objectives.forget.item(), "retain_loss": retain, "total_loss": total,
                "backward_passes": backward_passes, **extra}


class WeightedSum(Optimiser):
    """L_total = L_forget + lambda * L_preserve (PIU eq. 4), one backward pass. Config: ``lambda``."""

    name = "weighted_sum"

    def __init__(self, params: list[torch.nn.Parameter], cfg: dict):
        super().__init__(params, cfg)
        self.lam = cfg["lambda"]

    def step(self, objectives: Objectives) -> dict:
        self._check(objectives, need_retain=False)
        total = objectives.forget if objectives.retain is None else objectives.forget + self.lam * objectives.retain
        self._step_on(total)  # PIU eq. 4
        return self._row(objectives, total.item(), 1)


class EUPMU(Optimiser):
    """Implicit unilateral gradient surgery (EUPMU paper, Algorithm 1): one backward pass per step.

    lambda_t (lambda_0 = 0) is a dual variable updated from the measured retain-loss change
    delta_t = (l_r(theta_t) - l_r(theta_{t+1})) / alpha + epsilon, lambda_{t+1} = clip(lambda_t - beta delta_t, 0, D):
    it grows when the retain loss rises by more than the tolerance alpha * epsilon per step and shrinks otherwise.
    ``eupmu`` measures the change on the same retain batch, re-evaluated after the update through
    ``Objectives.retain_again`` (one forward pass without gradients). Config: ``eupmu_alpha`` (alpha, the step size
    that normalises the change; with AdamW the parameter change is not alpha * d, so alpha only sets the units of
    epsilon), ``eupmu_beta`` (beta), ``eupmu_epsilon`` (epsilon >= 0), ``eupmu_max_lambda`` (D).
    """

    name = "eupmu"
    same_batch = True

    def __init__(self, params: list[torch.nn.Parameter], cfg: dict):
        super().__init__(params, cfg)
        self.alpha, self.beta = cfg["eupmu_alpha"], cfg["eupmu_beta"]
        self.epsilon, self.max_lambda = cfg["eupmu_epsilon"], cfg["eupmu_max_lambda"]
        if self.alpha <= 0 or self.beta < 0 or self.epsilon < 0 or self.max_lambda < 0:
            raise ValueError("config keys 'eupmu_alpha' (> 0), 'eupmu_beta', 'eupmu_epsilon', 'eupmu_max_lambda' "
                             f"(>= 0) out of range: {self.alpha}, {self.beta}, {self.epsilon}, {self.max_lambda}")
        self.state = {"lambda": 0.0, "previous_retain": None}  # lambda_0 = 0 (Algorithm 1, input)

    def _update_lambda(self, before: float, after: float) -> None:
        delta = (before - after) / self.alpha + self.epsilon  # EUPMU eq. 8: delta~_t
        # EUPMU Algorithm 1 line 2: lambda = min(D, max(0, lambda - beta delta~))
        self.state["lambda"] = min(self.max_lambda, max(0.0, self.state["lambda"] - self.beta * delta))

    def step(self, objectives: Objectives) -> dict:
        self._check(objectives, need_retain=True)
        if self.same_batch and objectives.retain_again is None:
            raise ValueError(f"optimiser {self.name!r} re-measures the retain loss on the same batch, but the method "
                             f"provides no Objectives.retain_again; use optimiser 'eupmu_fast'")
        retain = objectives.retain.item()
        previous = self.state["previous_retain"]
        # EUPMU-fast (EUPMU Section 3.3): the change is l_r(theta_t; B_t) - l_r(theta_{t+1}; B_{t+1}), known now.
        # The end of Section 3.3 prints the proxy the other way round, l_r(theta_{t+1}; B_{t+1}) - l_r(theta_t; B_t);
        # that is minus the Delta_r it approximates (and minus eq. 8's l_r(theta_t) - l_r(theta_{t+1})), so lambda
        # would fall when the retain loss rises: we use the corrected sign.
        # At the first step (no previous batch) Algorithm 1's theta_0 = theta_1 gives delta~_0 = epsilon >= 0, so
        # lambda_1 = max(0, 0 - beta epsilon) = 0 = lambda_0: nothing to update.
        if not self.same_batch and previous is not None:
            self._update_lambda(previous, retain)
        lam = self.state["lambda"]
        total = objectives.forget + lam * objectives.retain
        self._step_on(total)  # EUPMU Algorithm 1 lines 3-4: one backward pass of l_u + lambda_t l_r, then the step
        extra = {"lambda_t": lam}
        if self.same_batch:
            with torch.no_grad():
                after = objectives.retain_again().item()  # l_r(theta_{t+1}; B_t)
            self._update_lambda(retain, after)  # EUPMU eq. 8 on the same batch: lambda_{t+1}
            extra.update(retain_loss_after=after, extra_forward_passes=1)
        else:
            self.state["previous_retain"] = retain
        return self._row(objectives, total.item(), 1, **extra)


class EUPMUFast(EUPMU):
    """EUPMU-fast (EUPMU Section 3.3): lambda_t from consecutive retain batches, no extra forward pass."""

    name = "eupmu_fast"
    same_batch = False


class UnilateralSurgery(Optimiser):
    """Explicit unilateral gradient surgery (EUPMU Proposition 3.2; "UNGrad" in EUPMU Table 4): two backward passes.

    d = g_u + lambda* g_r with lambda* = (-g_r . g_u - epsilon) / ||g_r||^2 when positive, else d = g_u. When g_r = 0
    every d satisfies the constraint g_r . d >= -epsilon (epsilon >= 0), so lambda* = 0. Config: ``eupmu_epsilon``.
    """

    name = "unilateral_surgery"

    def __init__(self, params: list[torch.nn.Parameter], cfg: dict):
        super().__init__(params, cfg)
        self.epsilon = cfg["eupmu_epsilon"]
        if self.epsilon < 0:
            raise ValueError(f"config key 'eupmu_epsilon' must be >= 0 (got {self.epsilon})")

    def step(self, objectives: Objectives) -> dict:
        self._check(objectives, need_retain=True)
        g_u, g_r = self._gradients(objectives)
        squared = g_r.dot(g_r).item()
        lam = (-g_r.dot(g_u).item() - self.epsilon) / squared if squared > 0 else 0.0  # EUPMU eq. 6
        lam = max(lam, 0.0)  # EUPMU eq. 5: d = g_u when lambda* <= 0
        self._step_along(g_u + lam * g_r)  # EUPMU eq. 5
        return self._row(objectives, objectives.forget.item() + lam * objectives.retain.item(), 2, lambda_t=lam)


class EpsilonConstrained(Optimiser):
    """min f2 s.t. f1 <= epsilon by epsilon-constrained Algorithm 1: two backward passes per step.

    f1 is the forget objective, f2 the retain objective. Each step solves the dual of eq. 7,
    eta_t = max((psi - grad f2 . grad f1) / (||grad f1||^2 + varpi), 0), and steps along grad f2 + eta_t grad f1.
    The base step is AdamW, as in the paper's setups (Appendix E.1; weight decay 0 by default, see
    ``config.resolve_run_settings``). Config ``epsilon_phase`` picks the control function psi (Section 4.3, 5.4):

    - ``highest`` (Phase I, highest unlearning completeness, epsilon = f1*): psi = alpha ||grad f1||^delta1;
    - ``lowest`` (Phase I, lowest completeness): the same with the roles of f1 and f2 exchanged. Where f2 and its
      gradient are 0 (PIU's preservation loss at the original model), psi = 0 and eta_t = 0: the step descends f1
      freely until f2 rises, and psi then holds f2 down;
    - ``controlled`` (Phase II): psi = beta ((f1 - epsilon) / s)^delta2 ||grad f1||^2, delta2 odd, s = |f1| at the
      run's first step (the original model): Section 5.4's scaled psi with f1 - epsilon in units of the loss, so
      that beta means the same on any loss scale (unscaled, eta_t ~ beta (f1 - epsilon) is a small fraction of the
      retain pull when f1 is small, and Phase II stops short of its bound). With ``epsilon_scale: batch`` (an
      extension) f1 and epsilon are relative to the original model's f1 on the same batch,
      psi = beta (f1 / f1_0(batch) - epsilon)^delta2 ||grad f1||^2, f1_0 = the method's ``forget_reference``: one
      fixed epsilon then means the same on easy and hard batches (docs/results/controllable.md);
    - ``original``: no update, only f1 and f2 logged on the run's batches (an extension, not the paper's: the
      original model in place of the lowest boundary, see ``unlearning.controllable.<run>.lowest``).

    With ``epsilon_hold_bound`` (an extension, Phase II only) every base step ends on the bound or above it by
    its first-order change grad f1 . (theta_{t+1} - theta_t) on the batch: a step that would end below is corrected
    along grad f1, the rest of the step unchanged. From above it then lands on the bound instead of crossing it
    (Algorithm 1's gradient flow approaches the bound without crossing it, f1 moving at -psi; an AdamW step of fixed
    length does not); from below it returns to the bound, where Algorithm 1 (eta_t >= 0) only lets f1 rise as
    fast as the retain descent raises it, and AdamW's momentum keeps descending f1 for steps after eta_t has
    dropped to 0. The correction, in the bounded objective's units, is logged as ``bound_correction`` (0: the step
    stayed as it was). It bounds f1 from both sides, min f2 s.t. f1 = epsilon to first order, so the end point is
    the epsilon a user asked for rather than any point below it (docs/results/controllable.md).

    Config: ``epsilon_alpha`` (alpha), ``epsilon_phase1_delta`` (delta1 >= 1), ``epsilon_beta`` (beta),
    ``epsilon_phase2_delta`` (delta2), ``epsilon`` (Phase II's bound on f1; see ``epsilon_at``), ``epsilon_scale``
    (``first_step`` or ``batch``; with ``batch`` every phase logs ``forget_relative`` = f1 / f1_0, the column its
    epsilon is taken from), ``epsilon_hold_bound`` (bool).
    """

    name = "epsilon_constrained"

    def __init__(self, params: list[torch.nn.Parameter], cfg: dict):
        super().__init__(params, cfg)
        self.phase = cfg["epsilon_phase"]
        if self.phase not in EPSILON_PHASES:
            raise ValueError(f"config key 'epsilon_phase': {self.phase!r} is unknown; use one of "
                             f"{', '.join(EPSILON_PHASES)}")
        self.alpha, self.delta1 = cfg["epsilon_alpha"], cfg["epsilon_phase1_delta"]
        self.beta, self.delta2, self.epsilon = cfg["epsilon_beta"], cfg["epsilon_phase2_delta"], cfg["epsilon"]
        # epsilon_hold_bound has no schema default (absent: off), so that cached runs keep their job parameters
        self.scale, self.hold_bound = cfg["epsilon_scale"], cfg.get("epsilon_hold_bound", False)
        if self.scale not in EPSILON_SCALES:
            raise ValueError(f"config key 'epsilon_scale': {self.scale!r} is unknown; use one of "
                             f"{', '.join(EPSILON_SCALES)}")
        if self.alpha <= 0 or self.beta <= 0:
            raise ValueError(f"config keys 'epsilon_alpha' and 'epsilon_beta' must be > 0 "
                             f"(got {self.alpha}, {self.beta})")
        if self.delta1 < 1:
            raise ValueError(f"config key 'epsilon_phase1_delta' must be >= 1 (got {self.delta1})")
        if not (float(self.delta2).is_integer() and int(self.delta2) % 2 == 1):
            raise ValueError(f"config key 'epsilon_phase2_delta' must be an odd integer so that psi has the sign of "
                             f"f1 - epsilon (got {self.delta2})")
        if self.phase == "controlled" and self.epsilon is None:
            raise ValueError("config key 'epsilon' must be set for epsilon_phase 'controlled' (Phase II): the "
                             "bound on the forget objective, e.g. epsilon_at(0.5, f1 of the 'highest' run, "
                             "f1 of the 'lowest' run)")
        self.state = {"f1_scale": None}  # Phase II: |f1| at the first step

    def _relative(self, objectives: Objectives) -> dict:
        """``forget_relative`` = f1 / f1_0 on this batch, logged in every phase under ``epsilon_scale: batch``."""
        if self.scale == "first_step":
            return {}
        if objectives.forget_reference is None:
            raise ValueError("epsilon_scale 'batch' needs the method's forget_reference (the original model's forget "
                             "objective on the batch; PIU and ESD give it): use epsilon_scale 'first_step' here")
        reference = objectives.forget_reference.item()
        if reference <= 0:
            raise ValueError(f"epsilon_scale 'batch': the original model's forget objective on this batch is "
                             f"{reference}, so f1 has no batch scale; use epsilon_scale 'first_step'")
        return {"forget_relative": objectives.forget.item() / reference}

    def step(self, objectives: Objectives) -> dict:
        self._check(objectives, need_retain=True)
        relative = self._relative(objectives)
        if self.phase == "original":
            return self._row(objectives, objectives.retain.item(), 0, **relative)
        g_forget, g_retain = self._gradients(objectives)
        if self.phase == "lowest":  # min f1 s.t. f2 <= f2*: the constrained objective is the retain objective
            g1, g2, f1, f2 = g_retain, g_forget, objectives.retain.item(), objectives.forget.item()
        else:
            g1, g2, f1, f2 = g_forget, g_retain, objectives.forget.item(), objectives.retain.item()
        squared = g1.dot(g1).item()
        if self.phase == "controlled" and self.scale == "batch":
            # epsilon-constrained Section 5.4's psi on f1 relative to the original model's on the batch (extension):
            # psi = beta (f1 / f1_0 - epsilon)^delta ||grad f1||^2
            psi = self.beta * (relative["forget_relative"] - self.epsilon) ** int(self.delta2) * squared
        elif self.phase == "controlled":
            if self.state["f1_scale"] is None:
                if f1 == 0:
                    raise ValueError("epsilon_phase 'controlled': the forget objective is 0 at the first step, so "
                                     "it gives Phase II no loss scale; is this run's method unlearning anything?")
                self.state["f1_scale"] = abs(f1)
            # epsilon-constrained Section 5.4: psi = beta ((f1 - epsilon) / s)^delta ||grad f1||^2 (Phase II)
            psi = self.beta * ((f1 - self.epsilon) / self.state["f1_scale"]) ** int(self.delta2) * squared
        else:
            psi = self.alpha * math.sqrt(squared) ** self.delta1  # Section 4.3 Phase I: psi = alpha ||grad f1||^delta
        eta = max((psi - g2.dot(g1).item()) / (squared + VARPI), 0.0)  # epsilon-constrained Algorithm 1 line 9
        held = self.phase == "controlled" and self.hold_bound
        before = self._flat_params() if held else None
        self._step_along(g2 + eta * g1)  # Algorithm 1 lines 10-11
        if held:  # the bounded objective and its units per unit of f1: f1 itself, or f1 / f1_0 on the batch
            bounded, per_f1 = ((relative["forget_relative"], 1 / objectives.forget_reference.item())
                               if self.scale == "batch" else (f1, 1.0))
            relative["bound_correction"] = self._hold_bound(before, g1, squared, bounded - self.epsilon, per_f1)
        return self._row(objectives, f2 + eta * f1, 2, eta_t=eta, psi_t=psi, **relative)

    def _hold_bound(self, before: torch.Tensor, g1: torch.Tensor, squared: float, gap: float, per_f1: float) -> float:
        """Corrects the step just taken along grad f1 (``squared`` = ||grad f1||^2) so that the bounded objective,
        ``gap`` above its bound (below: negative), ends on the bound or above it by the first-order change
        (``epsilon_hold_bound``); returns the correction of that change (>= 0; 0: the step stays as it was)."""
        step = self._flat_params() - before
        change = g1.dot(step).item() * per_f1  # first-order change of the bounded objective
        correction = max(-gap - change, 0.0)  # the allowed change is >= -gap: to the bound, or back up to it
        if correction == 0 or squared == 0:
            return 0.0
        shift = g1 * (correction / (per_f1 * squared))  # along grad f1: raises the first-order change by correction
        with torch.no_grad():
            for param, part in self._parts(shift):
                param.add_(part)
        return correction


class SISSScaled(Optimiser):
    """SISS's gradient-level update as reproduced for Arc2Face (PIU appendix C.1, eqs. 22 and 28): two backward passes.

    Sign convention: the SISS method returns forget = MINUS the forget-image denoising loss L_forget, so its
    gradient is g_f = -grad L_forget and the paper's g_retain - lambda_eff grad L_forget, lambda_eff =
    beta ||g_retain|| / ||grad L_forget||, becomes d = g_r + beta ||g_r|| / ||g_f|| g_f here (||g_f|| =
    ||grad L_forget||). The forget contribution is 0 when g_f = 0. Config: ``siss_beta`` (PIU: 0.1).
    """

    name = "siss_scaled"

    def __init__(self, params: list[torch.nn.Parameter], cfg: dict):
        super().__init__(params, cfg)
        self.beta = cfg["siss_beta"]
        if self.beta < 0:
            raise ValueError(f"config key 'siss_beta' must be >= 0 (got {self.beta})")

    def step(self, objectives: Objectives) -> dict:
        self._check(objectives, need_retain=True)
        g_f, g_r = self._gradients(objectives)
        norm_f = g_f.norm().item()
        scale = self.beta * g_r.norm().item() / norm_f if norm_f > 0 else 0.0  # PIU eq. 28: lambda_eff
        self._step_along(g_r + scale * g_f)  # PIU eq. 22 with g_f = -grad L_forget
        return self._row(objectives, objectives.retain.item() + scale * objectives.forget.item(), 2,
                         siss_scale=scale)


OPTIMISERS: dict[str, type[Optimiser]] = {cls.name: cls for cls in (
    WeightedSum, EUPMU, EUPMUFast, UnilateralSurgery, EpsilonConstrained, SISSScaled)}


def build_optimiser(params: list[torch.nn.Parameter], cfg: dict) -> Optimiser:
    try:
        cls = OPTIMISERS[cfg["optimiser"]]
    except KeyError:
        raise ValueError(f"config key 'optimiser': {cfg['optimiser']!r} is unknown; use one of "
                         f"{', '.join(OPTIMISERS)}") from None
    return cls(params, cfg)
