"""Pareto (power-law) noise and its ℓ1 certificate (Yang et al. 2020, rs4a ``Pareto``)."""

from __future__ import annotations

import numpy as np
import torch
from scipy.special import hyp2f1

from .base import Noise, float_or_array, register_noise
from .draws import random_signs_

SHAPE = 3.0
"""The tail exponent a: rs4a's default (density ∝ (1 + |z|/λ)^(−1−a); a > 2 for a variance)."""


@register_noise("pareto")
class Pareto(Noise):
    """Pareto noise (a = 3) and its ℓ1 certificate (Yang et al. 2020).

    iid per coordinate with density a/(2λ)·(1 + |z|/λ)^(−1−a).

    σ is each coordinate's standard deviation λ·√(2/((a − 1)(a − 2))), so λ = σ for a = 3
    (rs4a ``get_lambd``). If the smoothed classifier's top class has probability at least
    p > ½, its prediction is constant within the ℓ1 ball of radius

        λ·(2p − 1)/a · ₂F₁(1, a/(a+1); a/(a+1) + 1; (2p − 1)^(1 + 1/a))

    (Yang et al. 2020, the differential method's integral in closed form, rs4a
    ``Pareto.certify_l1``). ``sigma`` is a positive float or a (B,) tensor of per-sample σ.
    """

    norm = "l1"
    a = SHAPE

    @classmethod
    def unit_sigma(cls) -> float:
        """The standard deviation of a coordinate at λ = 1 (rs4a ``_sigma``)."""
        return (0.5 * (cls.a - 1.0) * (cls.a - 2.0)) ** -0.5

    def scale(self, dim: int | None = None):
        """λ = σ/``unit_sigma`` for every d (float64: a float, or an array for per-sample σ)."""
        return self._sigma_float64() / self.unit_sigma()

    def sample(self, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Noise with the shape, dtype and device of ``like`` (B, ...), drawn from ``generator``."""
        return self.sample_(torch.empty_like(like), generator)

    def sample_(self, out: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """λ·(e^(E/a) − 1)·(±1): the magnitude by the inverse CDF (U^(−1/a) = e^(E/a), E a
        standard exponential), then a fair sign; two draws per coordinate, in that order."""
        out.exponential_(generator=generator).div_(self.a).expm1_()
        random_signs_(out, generator)
        return out.mul_(self._broadcast_sigma(out) / self.unit_sigma())

    def radius(self, p, dim: int | None = None):
        """Certified ℓ1 radius (class docstring) in float64; 0 where p ≤ ½."""
        t = np.maximum(2.0 * np.asarray(p, dtype=np.float64) - 1.0, 0.0)  # 0 at p <= ½
        b = self.a / (self.a + 1.0)
        return float_or_array(self.scale() * t / self.a
                              * hyp2f1(1.0, b, b + 1.0, t ** (1.0 + 1.0 / self.a)))


__all__ = ["SHAPE", "Pareto"]
