"""Data-dependent randomized smoothing, Algorithm 1: OptimizeSigma, a σ per input.

Alfarra, Bibi, Torr & Ghanem, "Data Dependent Randomized Smoothing" (arXiv:2012.04351), and
the authors' code, github.com/MotasemAlfarra/Data_Dependent_Randomized_Smoothing (files
``optimize_sigma.py``, ``CIFAR10/train_*.py``, ``post_processing_memory_based.py``).

* :func:`optimize_sigma` is the paper's Algorithm 1 (OptimizeSigma): per input x, stochastic
  gradient ascent over σ on the soft certified radius, with reparameterized noise.
  Both users of σ_x live elsewhere: the certifier with the memory of Algorithm 3 that keeps its
  certificates sound (:mod:`smoothcert.certifiers.data_dependent`), and training with a σ per
  example, Algorithm 2 (:mod:`smoothcert.training.sigma_modes`).

The soft radius is the noise's own (:attr:`smoothcert.noise.Noise.soft_radius`): Gaussian
σ/2·(Φ⁻¹(ψ_A) − Φ⁻¹(ψ_B)); uniform (L1) λ·(ψ_A − ψ_B), λ = √3·σ (Yang et al. 2020; the L1
certificate of the authors' follow-up library ``ddsmoothing/certificate.py``). A noise without
one is refused (one SmoothcertError), never optimized with another noise's formula. σ is always
the noise's standard deviation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SmoothcertError, check_count
from ..noise.base import NOISES, with_soft_radius
from ..tensors import eval_mode, frozen, model_device, model_input

# Defaults of Algorithm 1, from the code that produced the paper's certification numbers.
NUM_STEPS = 100
"""K: ``--iter_sig_after 100`` (σ optimization of the test set after training) in the authors'
``CIFAR10/train_macer.py`` and ``CIFAR10/train_smooth_adv.py``; the paper's K = 100 (its
Appendix B budget, and the first row of each K ablation in its appendix tables)."""
STEP_SIZE = 1e-4
"""α_σ, in pixel units of σ per unit of radius gradient: ``--lr_sig 0.0001`` in all of the
authors' training scripts (CIFAR10 and ImageNet)."""
NUM_SAMPLES = 1
"""n, noise draws per input and step: one draw in ``CIFAR10/train_smooth_adv.py`` (``get_sigma``)
and ``--gaussian_num_ds 1`` in ``ImageNet/train_rs.py``; the paper's Appendix B counts
K = 100, n = 1 as 200 forward/backward evaluations per input. (``CIFAR10/train_macer.py``
uses 64.)"""
CLAMP = (0.02, 0.98)
"""ψ is clamped to [0.02, 0.98] before Φ⁻¹: ``clamp_(0.02, 0.98)`` in ``optimize_sigma.py``
and every ``get_sigma`` of the authors' scripts. (Their later ``ddsmoothing`` library uses
[0.001, 0.999]: :data:`PACKAGE_CLAMP`.) Outside the interval the clamp has zero gradient, as in
their code."""
MIN_SIGMA = 1e-3
"""Floor that keeps σ_x positive (pixel units, a quarter of one uint8 grey level). Not in the
authors' code, which takes plain steps and never needed it at α_σ = 1e-4."""

# Defaults of the authors' later ``ddsmoothing`` package (the same repository, folder
# ``ddsmoothing/``, as of its commit 3a06e82, 2023-10-24): the budget its dataset-wide
# optimization runs with unless told otherwise. Its step is the same plain ascent step on the
# same soft radius (``ddsmoothing/ddsmoothing/optimization.py`` lines 41-52; L2:
# θ/2·(Φ⁻¹(ψ_A) − Φ⁻¹(ψ_B)), θ = σ, ``certificate.py`` lines 64-66 and 76-79), with no floor on
# σ. Its ψ averages the model's outputs as they are (``optimization.py`` lines 45-46; the model
# files are not in the repository, so whether they end in a softmax is not shown); ours is the
# mean softmax, as in the paper's Algorithm 1.
PACKAGE_NUM_STEPS = 900
"""K: ``--iterations`` default 900, ``ddsmoothing/scripts/run_optimization_dataset.py`` lines
46-49 ("optimization iterations per sample")."""
PACKAGE_STEP_SIZE = 0.04
"""α_σ: ``-lr/--learning-rate`` default 0.04, ``run_optimization_dataset.py`` lines 54-57. For
Gaussian noise the package's θ is σ, so the step is the same. (Its L1 certificate steps the
uniform half-width λ = √3·σ, which is a step of 0.04/3 in σ; ours is always in σ.)"""
PACKAGE_NUM_SAMPLES = 100
"""n: ``-n/--num-samples`` default 100, ``run_optimization_dataset.py`` lines 58-61 ("number of
samples per example and iteration")."""
PACKAGE_CLAMP = (0.001, 0.999)
"""ψ clamp: ``clamp_(0.001, 0.999)`` in ``L2Certificate.compute_proxy_gap``,
``ddsmoothing/ddsmoothing/certificate.py`` lines 64-66."""


@dataclass(frozen=True)
class Budget:
    """The settings of :func:`optimize_sigma` that a run names at once: K steps of α_σ with n
    draws each, ψ clamped to ``clamp`` (see the constants above for their sources)."""

    num_steps: int
    step_size: float
    num_samples: int
    clamp: tuple[float, float]


BUDGETS = {
    "paper": Budget(NUM_STEPS, STEP_SIZE, NUM_SAMPLES, CLAMP),
    "package": Budget(PACKAGE_NUM_STEPS, PACKAGE_STEP_SIZE, PACKAGE_NUM_SAMPLES, PACKAGE_CLAMP),
}
"""Named budgets: ``paper`` (the code behind the paper's numbers) and ``package`` (the
defaults of the authors' later ``ddsmoothing`` package)."""


# --------------------------------------------------------------------------- Algorithm 1
def optimize_sigma(
    model: nn.Module,
    x: torch.Tensor,
    sigma0,
    *,
    num_steps: int = NUM_STEPS,
    step_size: float = STEP_SIZE,
    num_samples: int = NUM_SAMPLES,
    generator: torch.Generator | None,
    noise: str = "gaussian",
    clamp: tuple[float, float] = CLAMP,
    min_sigma: float = MIN_SIGMA,
) -> torch.Tensor:
    """OptimizeSigma (Alfarra et al., Algorithm 1): σ_x maximizing the soft certified radius.

    ``x`` (B, C, H, W) in [0, 1]; ``sigma0`` a float or a (B,) tensor (the training σ, or in
    training the σ_x of the previous epoch). Each of the ``num_steps`` steps draws fresh unit
    noise ε (n = ``num_samples`` per input, from ``generator``), forms ψ = mean softmax of
    f(x + σ·ε) (the reparameterization trick: ε does not depend on σ), and takes the ascent step
    σ ← max(σ + α_σ·∂R/∂σ, ``min_sigma``) on the noise's soft radius R(σ, ψ_A, ψ_B)
    (:attr:`~smoothcert.noise.Noise.soft_radius`):

    * Gaussian noise: R(σ) = σ/2·(Φ⁻¹(ψ_A) − Φ⁻¹(ψ_B)), ψ clamped to ``clamp``;
    * uniform noise:  R(σ) = λ·(ψ_A − ψ_B), λ = √3·σ (no clamp: there is no Φ⁻¹);

    where ψ_A, ψ_B are the top two entries of ψ (no label is used: at certification there is
    none, and the authors' code takes ``topk(ψ, 2)``). The B inputs are optimized together but
    independently. The model is put in eval mode (its previous mode is restored) and gets no
    parameter gradients. Returns σ_x, shape (B,), detached, on the model's device, in x's dtype,
    ≥ ``min_sigma``.

    ``noise`` names a registered noise with a soft radius; any other raises
    :class:`SmoothcertError` naming it.

    This is a heuristic: σ_x carries no guarantee by itself. Certificates come from CERTIFY at
    σ_x, made sound for the data-dependent classifier by :class:`Memory`.
    """
    _check_optimize_args(x, num_steps, step_size, num_samples, noise, clamp, min_sigma)
    unit = NOISES[noise](1.0)  # ε with unit standard deviation; the draws are then σ·ε
    # gradients are needed even when the caller runs under no_grad or inference_mode
    with torch.inference_mode(False), torch.enable_grad(), eval_mode(model), frozen(model):
        x = x.detach().to(model_device(model))
        sigma = _initial_sigma(sigma0, x)
        x_rep = x.repeat_interleave(num_samples, dim=0)  # rows i·n … i·n+n−1 are input i's
        for _ in range(num_steps):
            sigma = _ascent_step(model, x_rep, sigma, unit, generator, num_samples=num_samples,
                                 step_size=step_size, clamp=clamp, min_sigma=min_sigma)
    return sigma.detach()


def _ascent_step(model, x_rep, sigma, unit, generator, *, num_samples, step_size, clamp,
                 min_sigma) -> torch.Tensor:
    """One step of Algorithm 1: fresh unit draws ε, ψ = mean softmax f(x + σ·ε), and
    σ ← max(σ + α_σ·∂R/∂σ, ``min_sigma``); σ (B,) detached. Needs grad mode on."""
    sigma = sigma.detach().requires_grad_(True)
    eps = unit.sample(x_rep, generator)  # fresh draws each step
    psi = _soft_scores(model, x_rep, sigma, eps, num_samples)
    radius = _soft_radius(psi, sigma, unit, clamp)
    (grad,) = torch.autograd.grad(radius.sum(), sigma)
    return (sigma.detach() + step_size * grad).clamp_min(min_sigma)


@torch.no_grad()
def soft_radius(
    model: nn.Module,
    x: torch.Tensor,
    sigma,
    *,
    num_samples: int,
    generator: torch.Generator | None,
    noise: str = "gaussian",
    clamp: tuple[float, float] = CLAMP,
) -> torch.Tensor:
    """Monte Carlo estimate of the objective R(σ) of :func:`optimize_sigma`, shape (B,).

    Useful to compare σ_x against σ0; it is an estimate of a smooth surrogate, not a certificate.
    """
    _check_optimize_args(x, 0, 0.0, num_samples, noise, clamp, MIN_SIGMA)
    x = x.to(model_device(model))
    sigma = _initial_sigma(sigma, x)
    x_rep = x.repeat_interleave(num_samples, dim=0)
    unit = NOISES[noise](1.0)
    eps = unit.sample(x_rep, generator)
    with eval_mode(model):
        return _soft_radius(_soft_scores(model, x_rep, sigma, eps, num_samples), sigma, unit,
                            clamp)


def _soft_scores(model, x_rep, sigma, eps, num_samples) -> torch.Tensor:
    """ψ (B, C): the mean softmax of f(x + σ·ε) over each input's ``num_samples`` draws."""
    scale = sigma.repeat_interleave(num_samples).view((-1,) + (1,) * (x_rep.dim() - 1))
    logits = model(model_input(model, x_rep + scale * eps))
    # a half model's logits widened: Φ⁻¹ of the scores has no 16-bit kernel
    probs = F.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=1)
    return probs.view(sigma.shape[0], num_samples, -1).mean(dim=1)


def _soft_radius(psi: torch.Tensor, sigma: torch.Tensor, noise, clamp) -> torch.Tensor:
    """The noise's soft radius (B,) at the top two entries ψ_A ≥ ψ_B of ψ (B, C): no label, as
    at certification there is none (the authors' code takes ``topk(ψ, 2)``)."""
    psi_a, psi_b = psi.topk(2, dim=1).values.unbind(dim=1)
    return noise.soft_radius(sigma, psi_a, psi_b, clamp)


def _initial_sigma(sigma0, x: torch.Tensor) -> torch.Tensor:
    batch = x.shape[0]
    if isinstance(sigma0, torch.Tensor):
        sigma = sigma0.detach().to(device=x.device, dtype=x.dtype).reshape(-1)
        if sigma.numel() == 1:
            sigma = sigma.expand(batch)
    elif isinstance(sigma0, (int, float)) and not isinstance(sigma0, bool):
        sigma = torch.full((batch,), float(sigma0), device=x.device, dtype=x.dtype)
    else:
        raise SmoothcertError(f"σ0 must be a number or a (B,) tensor, got {type(sigma0).__name__}")
    if sigma.shape != (batch,):
        raise SmoothcertError(f"σ0 has {sigma.numel()} entries but x has {batch} inputs")
    if not torch.isfinite(sigma).all() or (sigma <= 0).any():
        raise SmoothcertError("σ0 must be positive and finite for every input")
    return sigma.clone()


def _check_optimize_args(x, num_steps, step_size, num_samples, noise, clamp, min_sigma) -> None:
    with_soft_radius(noise, "data-dependent σ")  # an unknown name lists the known ones
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2:
        raise SmoothcertError("x must be a floating-point batch of shape (B, C, H, W)")
    if not torch.isfinite(x).all():
        raise SmoothcertError("x contains NaN or Inf")
    check_count("num_steps", num_steps, minimum=0), check_count("num_samples", num_samples)
    if not math.isfinite(step_size) or step_size < 0:
        raise SmoothcertError(f"step_size must be a finite number >= 0, got {step_size!r}")
    check_clamp(clamp)
    if not math.isfinite(min_sigma) or min_sigma <= 0:
        raise SmoothcertError(f"min_sigma must be a positive number, got {min_sigma!r}")


def check_clamp(clamp) -> tuple[float, float]:
    """``clamp`` as (low, high): two numbers with 0 < low < high < 1 (Φ⁻¹ is finite on the
    clamped ψ), from a pair or the text ``"low,high"``; else one SmoothcertError."""
    parts = clamp.split(",") if isinstance(clamp, str) else clamp
    try:
        if len(parts) != 2 or any(isinstance(v, bool) for v in parts):
            raise ValueError(clamp)
        low, high = float(parts[0]), float(parts[1])
    except (TypeError, ValueError):
        low = high = math.nan  # refused below
    if not 0.0 < low < high < 1.0:
        raise SmoothcertError(f"clamp must be two numbers low,high with 0 < low < high < 1, "
                              f"got {clamp!r}")
    return low, high
