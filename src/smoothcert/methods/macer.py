"""MACER: maximizing the certified radius of the soft smoothed classifier."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import SmoothcertError, check_count, check_positive_finite
from ..registry import option
from ..tensors import copies
from .base import TrainingMethod, noise_for_copies, register_method


def macer_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    sigma: float | torch.Tensor,
    lbd: float,
    gamma: float,
    beta: float,
) -> torch.Tensor:
    """The MACER objective (classification + λ · robustness) / B for logits of shape (B, k, C).

    ``logits[i, j]`` are the logits f(x_i + δ_j) of input i under its j-th of k noise draws;
    ``targets`` (B,) are the labels; σ is the noise level in pixel units: a float, or a (B,)
    tensor with the σ_i of each input (data-dependent training). See :class:`MACER` for the two
    terms.
    """
    classification, robustness = macer_terms(logits, targets, sigma, gamma, beta)
    return (classification + lbd * robustness) / logits.shape[0]


def macer_terms(
    logits: torch.Tensor,
    targets: torch.Tensor,
    sigma: float | torch.Tensor,
    gamma: float,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The classification and robustness sums over the batch (not yet divided by B)."""
    if logits.dim() != 3 or logits.shape[2] < 2 or targets.shape != logits.shape[:1]:
        raise SmoothcertError(
            f"MACER needs logits of shape (B, k, C) with C >= 2 and targets of shape (B,); "
            f"got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    if isinstance(sigma, torch.Tensor) and sigma.shape != targets.shape:
        raise SmoothcertError(
            f"MACER needs one σ or one σ per input ({len(targets)}); got σ of shape "
            f"{tuple(sigma.shape)}"
        )
    return _classification(logits, targets), _robustness(logits, targets, sigma, gamma, beta)


def _classification(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Σ_i −log(p̂_{y_i} + 1e-10), p̂ the mean softmax over the k draws (MACER code's 1e-10)."""
    p_mean = F.softmax(logits, dim=2).mean(dim=1)
    return F.nll_loss(torch.log(p_mean + 1e-10), targets, reduction="sum")


def _robustness(logits, targets, sigma, gamma, beta) -> torch.Tensor:
    """Σ σ_i/2 · (γ − ξ_i) over inputs whose top class is the label and whose ξ_i ≤ γ is finite
    (σ_i = σ for a float σ)."""
    p_mean = F.softmax(beta * logits, dim=2).mean(dim=1)
    top2, top2_idx = p_mean.topk(2, dim=1)
    correct = top2_idx[:, 0] == targets
    p_a, p_b = top2[correct, 0], top2[correct, 1]  # label first, runner-up second
    xi = _probit(p_a) - _probit(p_b)  # ≥ 0: p_a is the top score
    keep = torch.isfinite(xi) & (xi <= gamma)
    # recompute on the kept entries only: masking an infinite ξ would still give NaN gradients
    xi = _probit(p_a[keep]) - _probit(p_b[keep])
    if isinstance(sigma, torch.Tensor):  # per input: σ_i/2 weighs input i's hinge
        return ((gamma - xi) * sigma.to(xi)[correct][keep]).sum() / 2
    return (gamma - xi).sum() * sigma / 2


def _probit(p: torch.Tensor) -> torch.Tensor:
    """Φ⁻¹(p) as torch.distributions.Normal(0, 1).icdf computes it (MACER's code): ±inf at 1, 0."""
    return torch.erfinv(2 * p - 1) * math.sqrt(2)


@register_method("macer")
class MACER(TrainingMethod):
    """Zhai, Dan, He, Zhang, Gong, Ravikumar, Hsieh & Wang, "MACER: Attack-free and Scalable
    Robust Training via Maximizing Certified Radius", ICLR 2020: maximize the certified radius
    of the soft smoothed classifier. With k noise draws δ_j ~ N(0, σ²I) per input,

        p̂ = (1/k) Σ_j softmax(f(x+δ_j)),           ĝ = (1/k) Σ_j softmax(β · f(x+δ_j)),
        ξ = Φ⁻¹(ĝ_y) − Φ⁻¹(max_{c≠y} ĝ_c),
        L = (1/B) Σ_i [ −log(p̂_{y_i} + 1e-10)
                        + λ · σ/2 · (γ − ξ_i) · 1{argmax ĝ = y_i, ξ_i ≤ γ, ξ_i finite} ].

    In detail this is the authors' ``macer.py`` (RuntianZ/macer, copied into Jeong & Shin's
    ``code/third_party/macer.py``): β tempers the robustness term only; the classification term
    is the NLL of the un-tempered mean softmax with 1e-10 added before the log; Φ⁻¹ is
    ``Normal(0, 1).icdf`` = √2·erfinv(2p − 1) in the logits' dtype; the hinge max(γ − ξ, 0) of
    the paper (Jeong & Shin, supplement eq. (8)) is taken by keeping only inputs with ξ ≤ γ, and
    inputs whose ξ is infinite or NaN in floating point (ĝ_y rounds to 1 or the runner-up to 0)
    are dropped (their hinge is 0 anyway, but a masked infinity would make the gradient NaN);
    both sums are divided by the batch size B.
    σ comes from the noise object. With a per-sample σ (a (B,) tensor: data-dependent training,
    Alfarra et al. 2022, Alg. 2) input i is noised at σ_i and its hinge is weighed by σ_i/2, the
    radius factor of its own smoothing distribution, i.e. σ/2 · (γ − ξ_i) becomes
    σ_i/2 · (γ − ξ_i); with equal σ_i this is the loss above.

    Alfarra et al.'s own MACER + DS script (``CIFAR10/train_macer.py`` of
    MotasemAlfarra/Data_Dependent_Randomized_Smoothing) trains a different robustness term, which
    we do not reproduce: the mean over correctly classified inputs of max(0, γ − σ_i/2 · ξ_i)
    (the hinge on the radius instead of on ξ), with ξ from the un-tempered mean softmax (no β)
    clamped to [0.02, 0.98]; with their γ = 8 the hinge is always active there.

    Defaults k = 16, λ = 12, γ = 8, β = 16: the argument defaults of MACER's ``main.py``
    (its CIFAR-10 recipe, σ = 0.25). Jeong & Shin's MNIST MACER baselines (supplement §B and
    their EXPERIMENTS.MD) use k = 16, λ = 16, γ = 8, β = 16, and λ = 6 at σ = 1.0, with
    ``--deferred``: λ = 0 until the first learning-rate drop. Here that is ``deferred_epochs``
    (λ = 0 while fewer epochs than that are complete; 0, MACER's own setting, disables it) set
    to the first milestone: 30 for the MNIST schedule (×0.1 at 30, 60). (Their code keeps λ = 0
    for 0-based epochs 0–30, and their ``StepLR.step(epoch)`` also first lowers the rate for
    epoch 31: both switch after 31 epochs.)

    Noise copies are laid out copy-major (``x.repeat(k, 1, 1, 1)``, one forward pass);
    ``"logits"`` are those of the first copy. Logged, per input as in MACER's printout:
    ``"ce"`` (the classification term) and ``"robustness"`` (σ/2 · Σ (γ − ξ) / B, before λ).
    """

    noises = ("gaussian",)  # its radius term is the Gaussian σ/2·(Φ⁻¹(p̂A) − Φ⁻¹(p̂B))

    supports_per_sample_sigma = True

    @dataclass(frozen=True)
    class Options:
        num_noise: int = option(16, "k: noise draws per input")
        lbd: float = option(12.0, "λ: weight of the robustness term (> 0)")
        gamma: float = option(8.0, "γ: hinge margin on ξ (> 0)")
        beta: float = option(16.0, "β: inverse temperature of the robustness term only (> 0)")
        deferred_epochs: int = option(0, "λ = 0 while fewer epochs are complete (0: never)")

        def __post_init__(self):
            check_count("num_noise", self.num_noise)
            for name in ("lbd", "gamma", "beta"):
                check_positive_finite(name, getattr(self, name))
            check_count("deferred_epochs", self.deferred_epochs, minimum=0)

    def setup(self):
        self._active = self.deferred_epochs == 0  # until on_epoch_start says otherwise

    def on_epoch_start(self, epoch, context):
        self._active = epoch >= self.deferred_epochs  # stateless: right again after a resume

    def loss(self, model, x, y, noise, generator):
        k, b, sigma = self.num_noise, x.shape[0], _sigma_per_input(noise)
        x_rep = copies(x, k)  # (k·B, C, H, W), copy-major
        logits = model(x_rep + noise_for_copies(noise, k).sample(x_rep, generator))
        logits = logits.view(k, b, -1).transpose(0, 1)  # (B, k, C)
        classification, robustness = macer_terms(logits, y, sigma, self.gamma, self.beta)
        lbd = self.lbd if self._active else 0.0
        return {
            "loss": (classification + lbd * robustness) / b,
            "logits": logits[:, 0],
            "ce": classification.detach() / b,
            "robustness": robustness.detach() / b,
        }


def _sigma_per_input(noise) -> float | torch.Tensor:
    """The noise's σ as a float, or as a (B,) tensor when it is per sample."""
    sigma = noise.sigma
    if isinstance(sigma, torch.Tensor) and sigma.numel() > 1:
        return sigma
    return float(sigma)
