"""Uniform noise and its L1 certificate (Yang et al. 2020)."""

from __future__ import annotations

import math

import numpy as np
import torch

from .base import Noise, float_or_array, register_noise, require_dim


@register_noise("uniform")
class Uniform(Noise):
    """Uniform noise δ ~ U[−λ, λ]^d and its ℓ1 and ℓ∞ certificates (Yang et al. 2020,
    "Randomized Smoothing of All Shapes and Sizes", Table 1 / Thm. for the uniform
    distribution).

    ``sigma`` is the **standard deviation** of each coordinate, as for :class:`Gaussian`; the
    half-width is λ = √3·σ (the std of U[−λ, λ] is λ/√3). If the smoothed classifier's top class
    has probability at least p > ½ under this noise, its prediction is constant within the L1
    ball of radius ``2λ·(p − ½)``, and within the ℓ∞ ball of radius ``2λ·(1 − (1.5 − p)^(1/d))``
    for inputs of d = C·H·W coordinates (rs4a ``Uniform.certify_linf``: a shift δ moves at most
    1 − (1 − ‖δ‖∞/2λ)^d of the cube's mass, the most when every |δᵢ| = ‖δ‖∞, and the top class
    keeps more than ½ while that is below p − ½).

    ``sigma`` is a positive float or a (B,) tensor of per-sample σ, exactly as for
    :class:`Gaussian`; only the draws and the radius differ.
    """

    norm = "l1"
    direct_norms = ("l1", "linf")
    needs_dim = True  # the ℓ∞ radius depends on d (the ℓ1 radius does not)

    @property
    def half_width(self):
        """λ = √3·σ (a float, or a (B,) tensor for per-sample σ)."""
        return math.sqrt(3.0) * self.sigma

    def scale(self, dim: int | None = None):
        """λ = √3·σ for every d (float64: a float, or an array for per-sample σ)."""
        return math.sqrt(3.0) * self._sigma_float64()

    def sample(self, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Noise U[−λ, λ] with the shape, dtype and device of ``like`` (B, ...)."""
        u = torch.rand(like.shape, generator=generator, device=like.device, dtype=like.dtype)
        return u.mul_(2.0).sub_(1.0).mul_(math.sqrt(3.0) * self._broadcast_sigma(like))

    def sample_(self, out: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw noise into the preallocated buffer ``out`` (no allocation); returns ``out``."""
        out.uniform_(-1.0, 1.0, generator=generator)
        return out.mul_(math.sqrt(3.0) * self._broadcast_sigma(out))

    def radius(self, p, dim: int | None = None):
        """Certified L1 radius 2λ·(p − ½) in float64; p is a float or array of probabilities > ½."""
        sigma = self._sigma_float64()
        r = 2.0 * math.sqrt(3.0) * sigma * (np.asarray(p, dtype=np.float64) - 0.5)
        return float(r) if np.ndim(r) == 0 else r

    def direct_radius(self, norm: str, p, dim: int | None = None):
        """ℓ1: :meth:`radius`; ℓ∞: 2λ·(1 − (1.5 − p)^(1/d)) in float64, d = ``dim``."""
        if norm != "linf":
            return super().direct_radius(norm, p, dim)
        d = require_dim(self.name, dim)
        rest = 1.5 - np.asarray(p, dtype=np.float64)
        return float_or_array(-2.0 * math.sqrt(3.0) * self._sigma_float64()
                              * np.expm1(np.log(rest) / d))

    @staticmethod
    def soft_radius(sigma: torch.Tensor, psi_a: torch.Tensor, psi_b: torch.Tensor,
                    clamp: tuple[float, float]) -> torch.Tensor:
        """λ·(ψ_A − ψ_B), λ = √3·σ: the L1 certificate with ψ_B in place of 1 − ψ_A (the
        authors' ``ddsmoothing/certificate.py``; with ψ_B = 1 − ψ_A it is 2λ(ψ_A − ½)). It is
        linear in ψ, so ``clamp`` is not needed and ignored."""
        return math.sqrt(3.0) * sigma * (psi_a - psi_b)
