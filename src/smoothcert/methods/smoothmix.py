"""SmoothMix: mixup between an input and its adversary against the smoothed classifier."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SmoothcertError, check_count, check_nonnegative
from ..registry import option
from ..smoothing.attacks import draw_noises, noisy_logits, soft_smoothed_log_prob
from ..tensors import copies, eval_mode
from .base import TrainingMethod, register_method

_GRAD_EPS = 1e-8  # the authors' ∇ / (‖∇‖₂ + 1e-8): an all-zero gradient gives a zero step


def _check_optional_radius(name: str, value: float | None) -> float | None:
    """None (no projection) or a finite L2 radius ≥ 0 in pixel units."""
    return None if value is None else check_nonnegative(name, value)


# --------------------------------------------------------------------------- the adversary
def smoothmix_attack(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    noises: torch.Tensor,
    *,
    num_steps: int,
    alpha: float,
    mix_step: int = 0,
    maxnorm: float | None = None,
    maxnorm_s: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SmoothMix's adversary (the authors' ``SmoothMix_PGD.attack``): (x_s, x̂), both (B, ...).

    With the m noises δ_j (``noises``, (m, B, ...)) fixed, starting from x̂⁽⁰⁾ = x (in [0, 1]),
    T = ``num_steps`` normalized-gradient ascent steps on the soft smoothed classifier's loss
    L(x') = −log((1/m) Σ_j softmax(f(x' + δ_j))_y):

        x̂⁽ᵗ⁺¹⁾ = clamp(P(x̂⁽ᵗ⁾ + α · ∇L(x̂⁽ᵗ⁾) / (‖∇L(x̂⁽ᵗ⁾)‖₂ + 1e-8)), 0, 1),

    P the projection onto the L2 ball of radius ``maxnorm`` around x (none when it is None, the
    paper's setting: no norm restriction, so ‖x̂⁽ᵀ⁾ − x‖₂ ≤ T·α). x̂ = x̂⁽ᵀ⁾. The "clean side"
    x_s is x̂⁽ˢ⁾, s = ``mix_step`` (s = 0: x itself; s = 1: the one-step adversary), projected
    onto the ball of radius ``maxnorm_s`` around x (None: not projected). The model runs in eval
    mode (its mode is restored); nothing is random. Projections use torch's ``renorm`` as the
    code does (it scales by r / (‖δ‖₂ + 1e-7)). Both outputs are detached.

    One departure: the loss is computed as a logsumexp (:func:`soft_smoothed_log_prob`), exact
    where the code's log(clamp(mean softmax, 1e-20)) saturates and stops the attack.
    """
    clean_side, adv = x.detach(), x.detach()
    with eval_mode(model), torch.enable_grad():
        for step in range(num_steps):
            if step == mix_step:
                clean_side = adv
            adv = _ascent_step(model, x, adv, y, noises, alpha, maxnorm)
    return _project(clean_side, x, maxnorm_s), adv


def _ascent_step(model, x, adv, y, noises, alpha: float, maxnorm: float | None):
    """One step x̂ ← P(x̂ + α·∇L/(‖∇L‖₂ + 1e-8)) of :func:`smoothmix_attack`."""
    adv = adv.detach().requires_grad_(True)
    loss = -soft_smoothed_log_prob(noisy_logits(model, adv, noises), y).sum()
    (grad,) = torch.autograd.grad(loss, adv)
    norm = grad.flatten(1).norm(p=2, dim=1).view((-1,) + (1,) * (grad.dim() - 1))
    return _project(adv.detach() + alpha * grad / (norm + _GRAD_EPS), x, maxnorm)


def _project(x_new: torch.Tensor, x0: torch.Tensor, radius: float | None) -> torch.Tensor:
    """clamp(x0 + renorm(x_new − x0, radius), 0, 1), detached (radius None: clamp only)."""
    if radius is not None:
        x_new = x0 + (x_new - x0).renorm(p=2, dim=0, maxnorm=radius)
    return x_new.clamp(0.0, 1.0).detach()


# --------------------------------------------------------------------------- the mixup term
def smoothmix_mixup_loss(
    log_q: torch.Tensor, p_bar: torch.Tensor, lam: torch.Tensor, correct: torch.Tensor
) -> torch.Tensor:
    """(1/(m·B)) Σ_j Σ_i 1[correct_i] · KL(ŷ_i ‖ q_ij), the mixup term of SmoothMix.

    ``log_q`` (m, B, C) are log softmax f(x_mix,i + δ_j); ``p_bar`` (B, C) is the soft smoothed
    prediction at the clean side; ``lam`` (B,) in [0, ½); ``correct`` (B,) is 1 where argmax
    p̄_i = y_i, else 0. The target is ŷ_i = (1 − λ_i)·p̄_i + λ_i·u, u the uniform distribution
    over the C classes. KL(ŷ ‖ q) = Σ_c ŷ_c (log ŷ_c − log q_c) with 0·log 0 = 0 (``F.kl_div``).
    As in the authors' code, ŷ is *not* detached (the gradient also reaches p̄) and the mean is
    over all m·B rows, the masked ones included.
    """
    lam = lam.unsqueeze(-1)
    target = (1.0 - lam) * p_bar + lam * (1.0 / p_bar.shape[-1])  # (B, C)
    kl = (torch.xlogy(target, target) - target * log_q).sum(dim=-1)  # (m, B)
    return (kl * correct).mean()


# --------------------------------------------------------------------------- the method
@register_method("smoothmix")
class SmoothMix(TrainingMethod):
    """Jeong, Park, Kim, Lee, Kim & Shin, "SmoothMix: Training Confidence-calibrated Smoothed
    Classifiers for Certified Robustness", NeurIPS 2021 (code: github.com/jh-jeong/smoothmix,
    ``code/train.py`` at cb1fd33; this is a re-implementation of that file's ``train`` and
    ``SmoothMix_PGD``, which we follow wherever it is more specific than the paper).

    Per batch, draw m noises δ_1 … δ_m once (reused by the attack and both loss terms), find the
    adversary x̂ = x̂⁽ᵀ⁾ and the clean side x_s = x̂⁽ˢ⁾ (:func:`smoothmix_attack`; s = 0: x_s = x),
    then with the model in train mode

        L = (1/m) Σ_j CE(f(x_s + δ_j), y)  +  η·w_e · (1/m) Σ_j 1[argmax p̄ = y] KL(ŷ ‖ q_j),

        p̄ = (1/m) Σ_j softmax f(x_s + δ_j),     λ ~ U[0, ½) per input,
        x_mix = (1 − λ)·x_s + λ·x̂,              ŷ = (1 − λ)·p̄ + λ·u   (u uniform over classes),
        q_j = softmax f(x_mix + δ_j)

    (batch means; the KL term is :func:`smoothmix_mixup_loss`). The paper's text is not in our
    library of papers, so no equation numbers are cited: the formulas are read off the code.
    What the code does that a reader of the paper might not expect, and we do too:

    - with s ≥ 1 ("+ one-step adversary") x_s replaces x everywhere: the CE term, p̄ and the
      correctness mask are evaluated at x̂⁽ˢ⁾, not at x;
    - p̄ in the target is not detached; the mask is over all m·B rows (mean, not over the
      correct ones); the clean and the mixed inputs are two separate forward passes;
    - warm-up: epoch e (0-based) uses w_e = min(1, (e + 1)/W), W = ``warmup_epochs``, on BOTH η
      and the clean side's radius (x_s is projected onto the ball of radius
      w_e·``maxnorm_s``, default w_e·α·s around x). W ≤ 1: no warm-up.

    Hyperparameters (flags of ``code/train.py``):

    - ``num_noise`` m (``--num-noise-vec``), ``num_steps`` T (``--num-steps``), ``alpha`` α
      (``--alpha``, L2 step in pixel units), ``eta`` η (``--eta``), ``mix_step`` s
      (``--mix_step``; 0 or 1 in every published run), ``maxnorm`` (``--maxnorm``: an L2 ball
      for x̂, None = unrestricted, the paper's setting; 2, 4, 6, 8 in the σ = 1.0 "restriction"
      ablation), ``maxnorm_s`` (``--maxnorm_s``: None = α·s), ``warmup_epochs`` W (``--warmup``).
    - Defaults: T = 8, α = 1.0, η = 1.0, s = 0, no ``maxnorm``, W = 10 are the code's defaults
      (and, with m = 4, the MNIST σ = 1.0, η = 1 row of ``EXPERIMENTS.MD``); m = 4 is every
      MNIST run's value (the code's default m = 1 is used by no published run).

    Published settings (``EXPERIMENTS.MD``; all with W = 10 and no ``maxnorm``):

    =====  ==================================  ===================================
    σ      MNIST (LeNet; m = 4, α = 1.0)       CIFAR-10 (ResNet-110; m = 2, η = 5)
    =====  ==================================  ===================================
    0.25   η = 1: T = 3;  η = 5: T = 2         T = 4, α = 0.5
    0.50   T = 4 (η = 1 or 5)                  T = 4, α = 1.0
    1.00   T = 8 (η = 1 or 5)                  T = 4, α = 2.0
    =====  ==================================  ===================================

    Every row is listed twice, with s = 0 ("SmoothMix") and s = 1 ("+ One-step adversary").
    Our recipes (``configs/*/smoothmix_s*.yaml``) take, on MNIST (and Fashion-MNIST), s = 0 with
    η = 5: plain SmoothMix's better ACR at every σ in the authors' released certification
    records (``data/certify/mnist/smoothmix/…/0/``, N = 100,000: 0.932 / 1.694 / 1.820 against
    η = 1's 0.931 / 1.678 / 1.788). On CIFAR-10 they take s = 0 at σ = 0.25 and s = 1 at
    σ = 0.5 and 1.0: the SmoothMix baseline rows of CAT-RS's ``EXPERIMENTS.MD``
    (alinlab/smoothing-catrs, on whose code the ACR study of Sun et al. builds its SmoothMix
    baseline); the released CIFAR-10 records agree (σ = 0.25: ACR 0.553 with s = 0, 0.548
    with s = 1; σ = 0.5: 0.712 with s = 0, 0.736 with s = 1). ImageNet: not given in the
    repository ("can be reproduced in a similar way").

    Re-implementations: alinlab/smoothing-catrs ``code/train_smoothmix.py`` (d4bc576) is the
    authors' file unchanged. eth-sri/acr-weakness ``code/train_smoothmix.py`` (1c8ea59) has the
    same loss and attack; it adds seeding, optional MultiStepLR milestones / AdamW, periodic
    checkpoints, and steps its scheduler with ``scheduler.step()``. The original calls
    ``scheduler.step(epoch)`` after epoch ``epoch``, which delays every lr decay by one epoch
    (MNIST: epochs 31 and 61, not 30 and 60; CIFAR-10: 51 and 101); our recipes keep the
    nominal epochs, as every recipe here does.

    Batching: the authors' loop splits each loaded batch of 256 into m chunks of 256/m inputs
    and takes one SGD step per chunk; to reproduce their runs set the trainer's batch size to
    256/m (64 for MNIST's m = 4, 128 for CIFAR-10's m = 2).

    Departures: the attack's loss is a logsumexp (see :func:`smoothmix_attack`); λ and the
    noises come from the trainer's generator (the code uses the global RNG, in the same order:
    the m noises, then λ). A per-sample σ (a (B,) tensor) needs nothing more: each δ_j is one
    ``noise.sample(x)``. ``"logits"`` are f(x_s + δ_1). Logged: ``"ce"``, ``"mixup"`` (the KL
    term before its weight), ``"mix_weight"`` (η·w_e), ``"mixup_share"`` (fraction of inputs
    with argmax p̄ = y) and ``"adv_distance"`` (batch mean of ‖x̂ − x‖₂).
    """

    supports_per_sample_sigma = True

    @dataclass(frozen=True)
    class Options:
        num_noise: int = option(4, "m: noises per input")
        num_steps: int = option(8, "T: attack steps")
        alpha: float = option(1.0, "α: L2 step of the attack, pixel units")
        eta: float = option(1.0, "η: weight of the mixup term")
        mix_step: int = option(0, "s: the clean side is the attack's iterate x̂⁽ˢ⁾ (0: x)")
        maxnorm: float | None = option(None, "L2 ball of the adversary, pixel units (null: none)")
        maxnorm_s: float | None = option(None, "L2 ball of the clean side (null: α·s)")
        warmup_epochs: int = option(10, "W: η and the clean side's ball grow over W epochs")

        def __post_init__(self):
            check_count("num_noise", self.num_noise)
            check_count("num_steps", self.num_steps, minimum=0)
            check_nonnegative("alpha", self.alpha), check_nonnegative("eta", self.eta)
            check_count("mix_step", self.mix_step, minimum=0)
            if self.mix_step > 0 and self.mix_step >= self.num_steps:
                raise SmoothcertError(
                    f"mix_step must be 0 or less than num_steps (the clean side is the attack's "
                    f"iterate after mix_step of its num_steps steps), got mix_step="
                    f"{self.mix_step} with num_steps={self.num_steps}"
                )
            _check_optional_radius("maxnorm", self.maxnorm)
            _check_optional_radius("maxnorm_s", self.maxnorm_s)
            check_count("warmup_epochs", self.warmup_epochs, minimum=0)

    def setup(self):
        self._warmup = 1.0  # w_e; set by on_epoch_start (full strength outside a trainer)

    def warmup_at(self, epoch: int) -> float:
        """w_e = min(1, (e + 1)/W) for epoch e (0-based); 1 when W ≤ 1."""
        if self.warmup_epochs <= 1:
            return 1.0
        return min(1.0, (epoch + 1) / self.warmup_epochs)

    def on_epoch_start(self, epoch, context):
        self._warmup = self.warmup_at(epoch)  # from the epoch alone: also right after a resume

    @property
    def mix_weight(self) -> float:
        """η·w_e: the weight of the mixup term in the current epoch."""
        return self.eta * self._warmup

    @property
    def clean_side_radius(self) -> float:
        """w_e·maxnorm_s (default w_e·α·s): how far the clean side may be from x this epoch."""
        radius = self.alpha * self.mix_step if self.maxnorm_s is None else self.maxnorm_s
        return self._warmup * radius

    def adversaries(self, model, x, y, noises) -> tuple[torch.Tensor, torch.Tensor]:
        """(x_s, x̂) for this epoch's settings: :func:`smoothmix_attack` with these
        hyperparameters."""
        return smoothmix_attack(
            model, x, y, noises, num_steps=self.num_steps, alpha=self.alpha,
            mix_step=self.mix_step, maxnorm=self.maxnorm, maxnorm_s=self.clean_side_radius,
        )

    def loss(self, model, x, y, noise, generator):
        m, b = self.num_noise, x.shape[0]
        noises = draw_noises(noise, x, m, generator)  # (m, B, ...), drawn once per batch
        clean, adv = self.adversaries(model, x, y, noises)  # eval mode inside
        logits = noisy_logits(model, clean, noises)  # (m, B, C), copy-major, train mode
        ce = F.cross_entropy(logits.flatten(0, 1), copies(y, m))
        p_bar = F.softmax(logits, dim=-1).mean(dim=0)  # not detached, as in the code
        correct = (p_bar.argmax(dim=-1) == y).to(p_bar.dtype)
        lam = torch.rand(b, generator=generator, device=x.device, dtype=x.dtype) / 2
        x_mix = _mix(clean, adv, lam)
        log_q = F.log_softmax(noisy_logits(model, x_mix, noises), dim=-1)
        mixup = smoothmix_mixup_loss(log_q, p_bar, lam, correct)
        return {
            "loss": ce + self.mix_weight * mixup,
            "logits": logits[0],
            "ce": ce.detach(),
            "mixup": mixup.detach(),
            "mix_weight": torch.tensor(self.mix_weight, device=x.device),
            "mixup_share": correct.mean(),
            "adv_distance": (adv - x).flatten(1).norm(p=2, dim=1).mean(),
        }


def _mix(x1: torch.Tensor, x2: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """(1 − λ_i)·x1_i + λ_i·x2_i per input, λ (B,)."""
    lam = lam.view((-1,) + (1,) * (x1.dim() - 1))
    return (1.0 - lam) * x1 + lam * x2
