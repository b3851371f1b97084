"""Isotropic Gaussian noise and its L2 certificate (Cohen, Rosenfeld & Kolter 2019)."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import norm

from .base import Noise, register_noise


@register_noise("gaussian")
class Gaussian(Noise):
    """Isotropic Gaussian noise δ ~ N(0, σ²I) and its L2 certificate (Cohen et al. 2019, Thm. 1).

    If the smoothed classifier's top class has probability at least p > ½ under this noise, its
    prediction is constant within the L2 ball of radius ``σ·Φ⁻¹(p)``.

    ``sigma`` is a positive float, or a tensor of shape (B,) giving one σ per sample of a batch
    (data-dependent smoothing); a tensor σ broadcasts over the non-batch dimensions.
    """

    norm = "l2"

    def sample(self, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Noise with the shape, dtype and device of ``like`` (B, ...), drawn from ``generator``."""
        eps = torch.randn(like.shape, generator=generator, device=like.device, dtype=like.dtype)
        return eps * self._broadcast_sigma(like)

    def sample_(self, out: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw noise into the preallocated buffer ``out`` (no allocation); returns ``out``."""
        out.normal_(generator=generator)
        return out.mul_(self._broadcast_sigma(out))

    def radius(self, p, dim: int | None = None):
        """Certified L2 radius σ·Φ⁻¹(p) in float64; p is a float or array of probabilities > ½."""
        return cohen_radius(self._sigma_float64(), p)

    @staticmethod
    def soft_radius(sigma: torch.Tensor, psi_a: torch.Tensor, psi_b: torch.Tensor,
                    clamp: tuple[float, float]) -> torch.Tensor:
        """σ/2·(Φ⁻¹(ψ_A) − Φ⁻¹(ψ_B)), ψ clamped to ``clamp`` (Alfarra et al., the objective of
        Algorithm 1; the clamp
        keeps Φ⁻¹ finite and has zero gradient outside, as in the authors' code). With
        ψ_B = 1 − ψ_A it is Cohen's σΦ⁻¹(ψ_A); it is MACER's radius (Zhai et al. 2020)."""
        psi_a, psi_b = psi_a.clamp(*clamp), psi_b.clamp(*clamp)
        return sigma / 2 * (torch.special.ndtri(psi_a) - torch.special.ndtri(psi_b))


def cohen_radius(sigma, p):
    """σ·Φ⁻¹(p) in float64 (Cohen et al. 2019, Thm. 1): a float for a float σ and p, else an
    array. ``sigma`` is a float or a numpy array of per-sample σ."""
    r = sigma * norm.ppf(np.asarray(p, dtype=np.float64))
    return float(r) if np.ndim(r) == 0 else r
