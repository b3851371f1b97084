"""L2 attacks on the *soft* smoothed classifier (Salman et al., NeurIPS 2019).

Salman, Li, Razenshteyn, Zhang, Zhang, Bubeck & Yang, "Provably Robust Deep Learning via
Adversarially Trained Smoothed Classifiers", NeurIPS 2019, attack the soft smoothed classifier
G(x) = E_δ[softmax f(x + δ)] through its Monte Carlo estimate with m noise draws δ_1 … δ_m held
FIXED for the whole attack:

    maximize over ‖x' − x‖₂ ≤ ε, x' ∈ [0, 1]^d:   L(x') = −log( (1/m) Σ_j softmax(f(x' + δ_j))_y ).

The same draws are then reused by the training step (``methods/smoothadv.py``). Both attacks
follow the authors' ``code/attacks.py`` (``PGD_L2`` and ``DDN``, multi-noise variants), which
adapt Rony et al.'s ``fast_adversarial``; each class says where we depart from that code.

A :class:`SoftSmoothedAttack` has one final public entry point, ``attack(model, x, y, noises,
epsilon=..., generator=...)``, which validates, runs the model in eval mode (restoring its mode)
and returns an :class:`AttackResult`; a subclass implements the one hook :meth:`_perturbation`.
The objective is the reusable :class:`SoftSmoothedObjective` built on :func:`noisy_logits` and
:func:`soft_smoothed_log_prob`; :meth:`SoftSmoothedAttack.attack_objective` runs the same attack
on any other objective, e.g. :class:`FreshNoiseObjective`, which redraws its m noises at every
evaluation.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import final

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SmoothcertError, check_count, check_positive_finite, check_probability
from ..registry import Configurable, Registry, option
from ..tensors import eval_mode, model_input

ATTACKS: Registry = Registry("attack")


# --------------------------------------------------------------------------- the objective
def draw_noises(noise, x: torch.Tensor, num: int, generator: torch.Generator | None = None):
    """``num`` noise draws for every input of the batch x (B, ...): a tensor (num, B, ...).

    Draw j for the whole batch comes before draw j+1 (one ``noise.sample(x)`` call per draw, so
    a per-sample σ of shape (B,) works).
    """
    check_count("num", num)
    return torch.stack([noise.sample(x, generator) for _ in range(num)])


def noisy_logits(model: nn.Module, x: torch.Tensor, noises: torch.Tensor) -> torch.Tensor:
    """Logits f(x + δ_j) of shape (m, B, C) for x (B, ...) and noises (m, B, ...).

    One forward pass over all m·B noisy inputs, laid out copy-major (copy j is rows j·B … ).
    """
    m, b = noises.shape[:2]
    logits = model(model_input(model, (x.unsqueeze(0) + noises).flatten(0, 1)))
    return logits.view(m, b, -1)


def soft_smoothed_log_prob(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """log((1/m) Σ_j softmax(logits_j)_y) per input, from logits (m, B, C): shape (B,).

    Computed as logsumexp_j log_softmax(logits_j)_y − log m, which is exact where the authors'
    ``log(clamp(mean softmax, 1e-20))`` saturates (and loses its gradient) below 1e-20.
    """
    log_p = F.log_softmax(logits, dim=-1)
    index = y.view(1, -1, 1).expand(logits.shape[0], -1, 1)
    log_p_y = log_p.gather(-1, index).squeeze(-1)  # (m, B)
    return torch.logsumexp(log_p_y, dim=0) - math.log(logits.shape[0])


def majority_vote(logits: torch.Tensor) -> torch.Tensor:
    """The most frequent argmax over the m copies of logits (m, B, C): shape (B,), int64.

    Ties go to the smallest class index.
    """
    votes = F.one_hot(logits.argmax(dim=-1), logits.shape[-1]).sum(dim=0)  # (B, C)
    return votes.argmax(dim=-1)


@dataclass(frozen=True)
class ObjectiveValue:
    """The soft smoothed loss L(x') per input (B,) and whether the majority vote of the base
    classifier over the fixed noises misses the label there (B,) bool."""

    loss: torch.Tensor
    misclassified: torch.Tensor


class SoftSmoothedObjective:
    """L(x') = −log((1/m) Σ_j softmax(f(x' + δ_j))_y) with the noises δ (m, B, ...) fixed.

    The attacks only see this object: a variant that redraws its noises at every evaluation
    (an evaluation attack with n fresh draws per step) can replace it without touching them.
    """

    def __init__(self, model: nn.Module, y: torch.Tensor, noises: torch.Tensor):
        self.model, self.y, self.noises = model, y, noises

    def __call__(self, x_adv: torch.Tensor) -> ObjectiveValue:
        logits = noisy_logits(self.model, x_adv, self.noises)
        loss = -soft_smoothed_log_prob(logits, self.y)
        return ObjectiveValue(loss, majority_vote(logits.detach()) != self.y)


class FreshNoiseObjective(SoftSmoothedObjective):
    """The soft smoothed loss with ``num`` NEW noise draws δ_j ~ ``noise`` at every evaluation.

    Each call draws (num, B, ...) noises from ``generator`` for the batch it is given, so every
    gradient step of an attack sees fresh noise (an expectation-over-transformation attack) and
    the majority vote that DDN tracks is over those draws. Salman et al.'s and Campbell et al.'s
    evaluation attacks keep the draws fixed instead (:class:`SoftSmoothedObjective`).
    """

    def __init__(self, model: nn.Module, y: torch.Tensor, noise, num: int,
                 generator: torch.Generator | None = None):
        super().__init__(model, y, torch.empty(0))
        self.noise, self.num, self.generator = noise, check_count("num", num), generator

    def __call__(self, x_adv: torch.Tensor) -> ObjectiveValue:
        self.noises = draw_noises(self.noise, x_adv.detach(), self.num, self.generator)
        return super().__call__(x_adv)


# --------------------------------------------------------------------------- base class
@dataclass(frozen=True)
class AttackResult:
    """An attack's output for a batch of B inputs.

    ``adversarial`` (B, ...) lies in [0, 1] with ‖adversarial − x‖₂ ≤ ε per input (up to
    float rounding); ``noises`` (m, B, ...) are the fixed draws it was found with (reuse them
    for the training step); ``distance`` (B,) is ‖adversarial − x‖₂. All are detached.
    """

    adversarial: torch.Tensor
    noises: torch.Tensor
    distance: torch.Tensor


class SoftSmoothedAttack(Configurable, abc.ABC):
    """Base of the L2 attacks on the soft smoothed classifier.

    Subclasses extend the ``Options`` dataclass (``num_steps`` = T, the number of gradient
    evaluations) with their own hyperparameters and implement :meth:`_perturbation`. ε is an
    argument of :meth:`attack`, not a hyperparameter, because SmoothAdv's warm-up changes it
    every epoch and a minimal-distance search changes it per input.
    """

    plugin_kind = "attack"
    option_word = "hyperparameter"
    #: True when the output at every ε is one ε-free ``search(...)`` projected onto the ε-ball
    epsilon_free = False

    @dataclass(frozen=True)
    class Options:
        num_steps: int = option(10, "T: gradient steps per attack")

        def __post_init__(self):
            check_count("num_steps", self.num_steps)

    @final
    def attack(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        noises: torch.Tensor,
        *,
        epsilon: float | torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> AttackResult:
        """Attack inputs x (B, ...) in [0, 1] with labels y (B,) under fixed noises (m, B, ...).

        ``epsilon`` is one L2 budget in pixel units (a float ≥ 0) or one per input (tensor (B,)).
        ``model`` runs in eval mode during the attack and gets its previous mode back; its
        parameters receive no gradient. ``generator`` (on x's device) supplies the random unit
        directions that replace an all-zero gradient. Raises :class:`SmoothcertError` for
        inputs outside [0, 1], a negative or non-finite ε, or mismatched shapes.
        """
        eps = _check_attack_inputs(x, y, noises, epsilon)
        x, noises = x.detach(), noises.detach()
        objective = SoftSmoothedObjective(model, y, noises)
        adversarial = self._run(model, objective, x, eps, generator)
        distance = _l2(adversarial - x)
        return AttackResult(adversarial=adversarial, noises=noises, distance=distance)

    @final
    def attack_objective(
        self,
        model: nn.Module,
        objective,
        x: torch.Tensor,
        *,
        epsilon: float | torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """:meth:`attack` on any ``objective`` (a callable x' (B, ...) ↦ :class:`ObjectiveValue`
        that evaluates ``model``, e.g. :class:`FreshNoiseObjective`): the adversarial inputs
        (B, ...), detached, in [0, 1] with ‖x' − x‖₂ ≤ ε per input. Validation, eval mode and
        ``generator`` as in :meth:`attack`.
        """
        _check_batch(x)
        return self._run(model, objective, x.detach(), _check_epsilon(epsilon, x), generator)

    def _run(self, model, objective, x, eps, generator) -> torch.Tensor:
        with eval_mode(model), torch.enable_grad():
            delta = self._perturbation(objective, x, eps, generator)
        return (x + delta).detach()

    @final
    def skip_draws(self, x: torch.Tensor, generator: torch.Generator | None = None) -> None:
        """Draw and discard the random directions one attack on x (B, ...) draws (T of x's shape).

        ``generator`` is then where it would be after the attack (draws of the objective itself,
        such as :class:`FreshNoiseObjective`'s, excluded): a caller that reuses a result instead
        of rerunning the attack keeps every later draw unchanged.
        """
        for _ in range(self.num_steps):
            torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)

    @abc.abstractmethod
    def _perturbation(
        self,
        objective: SoftSmoothedObjective,
        x: torch.Tensor,
        epsilon: torch.Tensor,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        """δ (B, ...) with ‖δ_b‖₂ ≤ ε_b and x + δ in [0, 1] that increases ``objective``.

        ``epsilon`` is a tensor (B,) on x's device; the model is already in eval mode.
        """

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


def _ascent(objective, x_adv: torch.Tensor, generator) -> tuple[torch.Tensor, ObjectiveValue,
                                                               torch.Tensor]:
    """The unit ascent direction ∇L/‖∇L‖₂ per input at x_adv, the objective there, and (B,) bool:
    whether the direction is random.

    Where the gradient is exactly zero the authors' code substitutes a random Gaussian direction;
    we use that direction normalised to unit length so every step has its nominal size. The
    random directions are drawn for the whole batch at every step (no host synchronisation, and
    the generator advances by the same amount whatever the gradients are:
    :meth:`SoftSmoothedAttack.skip_draws` relies on it).
    """
    x_adv = x_adv.detach().requires_grad_(True)
    value = objective(x_adv)
    (grad,) = torch.autograd.grad(value.loss.sum(), x_adv)
    shape = (-1,) + (1,) * (grad.dim() - 1)
    norms = _l2(grad).view(shape)
    rand = torch.randn(grad.shape, generator=generator, device=grad.device, dtype=grad.dtype)
    rand = rand / _l2(rand).clamp_min(torch.finfo(rand.dtype).tiny).view(shape)
    direction = torch.where(norms > 0, grad / norms.clamp_min(torch.finfo(grad.dtype).tiny), rand)
    return direction, ObjectiveValue(value.loss.detach(), value.misclassified), norms.view(-1) == 0


def _l2(t: torch.Tensor) -> torch.Tensor:
    return t.flatten(1).norm(p=2, dim=1)


def _per_input(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A (B,) tensor shaped to broadcast over a batch ``like`` (B, ...)."""
    return v.view((-1,) + (1,) * (like.dim() - 1))


def _project(delta: torch.Tensor, epsilon: torch.Tensor) -> torch.Tensor:
    """Scale each δ_b onto the L2 ball of radius ε_b (unchanged inside it)."""
    norms = _l2(delta)
    scale = torch.where(norms > epsilon, epsilon / norms.clamp_min(1e-30), torch.ones_like(norms))
    return delta * _per_input(scale, delta)


def _into_box(x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """The δ that moves x to clamp(x + δ, 0, 1)."""
    return (x + delta).clamp(0.0, 1.0) - x


# --------------------------------------------------------------------------- PGD
@ATTACKS.register("pgd")
class PGDL2(SoftSmoothedAttack):
    """Projected normalized-gradient ascent in the L2 ball (Salman et al.'s ``PGD_L2``).

    From δ = 0, T times:

        δ ← δ + α · ∇L(x+δ) / ‖∇L(x+δ)‖₂        (a random unit direction where ∇L = 0)
        δ ← clamp(x + δ, 0, 1) − x               (into the image box)
        δ ← δ · min(1, ε / ‖δ‖₂)                 (onto the ε-ball; stays in the box)

    with step α = 2ε/T by default (the authors' ``lr = max_norm / steps * 2``, so T steps can
    cross the ball's diameter). ``rel_stepsize`` sets α = rel_stepsize · ε instead (Foolbox's
    name). Returns x + δ after the last step (no best-iterate tracking, as in the code).

    Following the code over its interface: ``PGD_L2`` takes ``random_start=True`` but never uses
    it, so the attack starts at x. The projection is exact (torch's ``renorm`` in the code
    divides by ‖δ‖ + 1e-7, a difference below float32 rounding).
    """

    @dataclass(frozen=True)
    class Options(SoftSmoothedAttack.Options):
        rel_stepsize: float | None = option(None, "α / ε (null: 2 / T, Salman et al.)")

        def __post_init__(self):
            super().__post_init__()
            if self.rel_stepsize is not None:
                check_positive_finite("rel_stepsize", self.rel_stepsize)

    def _perturbation(self, objective, x, epsilon, generator):
        rel = 2.0 / self.num_steps if self.rel_stepsize is None else self.rel_stepsize
        alpha = _per_input(rel * epsilon, x)
        delta = torch.zeros_like(x)
        for _ in range(self.num_steps):
            direction, _, _ = _ascent(objective, x + delta, generator)
            delta = _project(_into_box(x, delta + alpha * direction), epsilon)
        return delta


# --------------------------------------------------------------------------- DDN
_DDN_MAX_STEP, _DDN_MIN_STEP = 1.0, 0.01  # cosine schedule of Rony et al. (SGD lr 1, eta_min 0.01)


def ddn_step_size(step: int, num_steps: int) -> float:
    """α_i of DDN's cosine schedule at step i = 0 … T−1.

    The code steps ``CosineAnnealingLR(T_max=T, eta_min=0.01)`` *before* each update, so step i
    uses the schedule's value at i + 1: α_i = 0.01 + 0.99 · (1 + cos(π (i+1) / T)) / 2, ending
    at α_{T−1} = 0.01.
    """
    cos = (1.0 + math.cos(math.pi * (step + 1) / num_steps)) / 2.0
    return _DDN_MIN_STEP + (_DDN_MAX_STEP - _DDN_MIN_STEP) * cos


@dataclass(frozen=True)
class DDNSearch:
    """DDN's search before its final projection, for a batch of B inputs (detached).

    ``delta`` (B, ...): the smallest-norm iterate whose noisy majority vote missed the label, 0
    where none did (x + delta lies in [0, 1]). ``random`` (B,) bool: some step of that input
    followed a random direction (an exactly zero gradient), so its search depends on the
    generator's state, not only on x, the label and the noises.
    """

    delta: torch.Tensor
    random: torch.Tensor

    def within(self, epsilon: float | torch.Tensor) -> torch.Tensor:
        """δ scaled onto the L2 ball of radius ε (a float or one per input, (B,)), unchanged
        inside it: DDN's perturbation at budget ε."""
        return _project(self.delta, _check_epsilon(epsilon, self.delta))


@ATTACKS.register("ddn")
class DDN(SoftSmoothedAttack):
    """Decoupled Direction and Norm (Rony et al., CVPR 2019) as used by Salman et al. (``DDN``,
    multi-noise variant of their ``code/attacks.py``).

    DDN searches for the *smallest* adversarial perturbation, then projects it onto the ε-ball.
    A per-input norm budget r starts at ``init_norm`` (default ε: Salman et al.'s training sets
    ``init_norm`` to the current warm-up ε every epoch). From δ = 0, for i = 0 … T−1:

        record δ as the best if the majority vote of f(x + δ + δ_j) over j misses y and ‖δ‖₂
            is the smallest such norm so far;
        δ ← δ + α_i · ∇L/‖∇L‖₂        (α_i: :func:`ddn_step_size`, cosine from ≈1 to 0.01)
        r ← r·(1−γ) if that vote was adversarial, else r·(1+γ); r ← min(r, ‖max(x, 1−x)‖₂)
        δ ← δ · r / ‖δ‖₂;   δ ← clamp(x + δ, 0, 1) − x

    and returns x + (best δ projected onto the ε-ball). Exactly as in the code, an input for
    which no iterate was adversarial gets δ = 0 (x itself), as does one whose noisy vote was
    already wrong at x; the last update is never evaluated.

    ``quantize_levels`` (e.g. 256) rounds every iterate x + δ to that many grey levels, as the
    authors' ``DDN`` does by default (``quantize=True, levels=256``). It is off here by default
    and the final projection is never re-quantized: the code rounds the projected δ too, which
    can leave the ε-ball by up to ½·√d/255 (≈ 0.1 on CIFAR-10).
    """

    @dataclass(frozen=True)
    class Options(SoftSmoothedAttack.Options):
        gamma: float = option(0.05, "γ: relative norm change per step, in (0, 1) (Salman et "
                                    "al.'s --gamma-DDN)")
        init_norm: float | None = option(None, "starting norm budget, pixel units (null: ε)")
        quantize_levels: int | None = option(None, "round iterates to this many grey levels "
                                                   "(null: off)")

        def __post_init__(self):
            super().__post_init__()
            check_probability("gamma", self.gamma)
            if self.init_norm is not None:
                check_positive_finite("init_norm", self.init_norm)
            if self.quantize_levels is not None:
                check_count("quantize_levels", self.quantize_levels, minimum=2)

    @final
    def search(self, model: nn.Module, objective, x: torch.Tensor, *,
               epsilon: float | torch.Tensor | None = None,
               generator: torch.Generator | None = None) -> DDNSearch:
        """DDN's minimal-norm search on ``objective`` (as :meth:`attack_objective` runs it)
        without the final projection: from the same generator state, ``x + search(...).within(ε)``
        is :meth:`attack_objective`'s output at ε, bit for bit.

        ε enters DDN only through that projection (the authors' ``max_norm`` renorm) and, where
        ``init_norm`` is null, as the starting norm (then ``epsilon`` is required). So with
        ``init_norm`` set one search serves every budget ε, and for the inputs whose ``random``
        is False it is the same from any generator state: a minimal-distance scan over ε need
        not rerun it. Validation, eval mode and ``generator`` as in :meth:`attack`.
        """
        _check_batch(x)
        if self.init_norm is None and epsilon is None:
            raise SmoothcertError("DDN.search needs epsilon (its first norm): init_norm is null")
        eps = None if epsilon is None else _check_epsilon(epsilon, x)
        with eval_mode(model), torch.enable_grad():
            return self._search(objective, x.detach(), self._start(x, eps), generator)

    @property
    def epsilon_free(self) -> bool:  # ε only projects the result: see :meth:`search`
        return self.init_norm is not None

    def _perturbation(self, objective, x, epsilon, generator):
        return _project(self._search(objective, x, self._start(x, epsilon), generator).delta,
                        epsilon)

    def _start(self, x: torch.Tensor, epsilon: torch.Tensor | None) -> torch.Tensor:
        """The first norm budget r per input (B,): ``init_norm``, or ε where it is null."""
        if self.init_norm is None:
            return epsilon.clone()
        return torch.full((x.shape[0],), self.init_norm, device=x.device, dtype=x.dtype)

    def _search(self, objective, x, radius, generator) -> DDNSearch:
        worst = _l2(torch.maximum(x, 1.0 - x))  # the largest norm that [0, 1]^d allows
        delta, best, best_l2 = torch.zeros_like(x), torch.zeros_like(x), worst.clone()
        random = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
        for i in range(self.num_steps):
            l2 = _l2(delta)
            direction, value, zero_gradient = _ascent(objective, x + delta, generator)
            random = random | zero_gradient
            better = value.misclassified & (l2 < best_l2)
            best_l2 = torch.where(better, l2, best_l2)
            best = torch.where(_per_input(better, x), delta, best)
            delta = delta + ddn_step_size(i, self.num_steps) * direction
            sign = value.misclassified.to(x.dtype) * 2.0 - 1.0  # +1: shrink, −1: grow
            radius = torch.minimum(radius * (1.0 - sign * self.gamma), worst)
            delta = delta * _per_input(radius / _l2(delta).clamp_min(1e-30), x)
            delta = _into_box(x, self._quantized(x + delta) - x)
        return DDNSearch(delta=best.detach(), random=random)

    def _quantized(self, x_adv: torch.Tensor) -> torch.Tensor:
        if self.quantize_levels is None:
            return x_adv
        top = self.quantize_levels - 1
        return (x_adv * top).round() / top


# --------------------------------------------------------------------------- validation
def _check_batch(x) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[0] == 0:
        raise SmoothcertError("x must be a non-empty batch tensor of shape (B, ...)")
    if not x.is_floating_point():
        raise SmoothcertError(f"x must be a floating-point tensor, got {x.dtype}")
    if bool(((x < 0) | (x > 1)).any()):  # one host sync per attack
        raise SmoothcertError("attack inputs must lie in [0, 1] (pixel space, before normalising)")


def _check_attack_inputs(x, y, noises, epsilon) -> torch.Tensor:
    """Validate the batch; return ε as a (B,) tensor on x's device and dtype."""
    _check_batch(x)
    b = x.shape[0]
    if y.shape != (b,) or y.dtype.is_floating_point:
        raise SmoothcertError(f"y must be integer labels of shape ({b},), got {tuple(y.shape)}")
    if noises.dim() != x.dim() + 1 or noises.shape[1:] != x.shape or noises.shape[0] < 1:
        raise SmoothcertError(
            f"noises must have shape (m, {', '.join(map(str, x.shape))}) with m >= 1, "
            f"got {tuple(noises.shape)}"
        )
    return _check_epsilon(epsilon, x)


def _check_epsilon(epsilon, x: torch.Tensor) -> torch.Tensor:
    b = x.shape[0]
    bad = SmoothcertError(f"ε must be finite and >= 0 (L2, pixel units), got {epsilon!r}")
    if isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool):
        if not math.isfinite(epsilon) or epsilon < 0:  # checked in Python: no device sync
            raise bad
        return torch.full((b,), float(epsilon), device=x.device, dtype=x.dtype)
    if not isinstance(epsilon, torch.Tensor):
        raise SmoothcertError(f"ε must be a number or a tensor, got {type(epsilon).__name__}")
    if epsilon.numel() not in (1, b) or epsilon.dim() > 1:
        raise SmoothcertError(f"ε must be a number or a tensor of shape ({b},)")
    eps = epsilon.detach().to(device=x.device, dtype=x.dtype).reshape(-1).expand(b).clone()
    if not bool((torch.isfinite(eps) & (eps >= 0)).all()):
        raise bad
    return eps
