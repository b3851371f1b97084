"""ExpInf noise, density ∝ e^(−‖z/λ‖∞), and its ℓ∞ and ℓ1 certificates (Yang et al. 2020,
rs4a ``ExpInf`` with k = 1, j = 0)."""

from __future__ import annotations

import math

import numpy as np

from .base import float_or_array, register_noise, require_dim
from .draws import linf_directions_
from .radial import RadialNoise


@register_noise("exp-inf")
class ExpInf(RadialNoise):
    """ExpInf noise, density ∝ exp(−‖z‖∞/λ), and its ℓ∞ and ℓ1 certificates (Yang et al.
    2020).

    rs4a ``ExpInf(k=1, j=0)``: z = λ·R·u, R ~ Gamma(d), u uniform on the surface of the cube
    [−1, 1]^d.

    σ is each coordinate's standard deviation: λ = σ/√((d + 2)(d + 1)/3) for d = C·H·W (rs4a
    ``_sigma``). If the smoothed classifier's top class has probability at least p > ½, its
    prediction is constant within the ℓ∞ ball of radius λ·ln(1/(2(1 − p))) (the differential
    method in closed form for k = 1) and within the ℓ1 ball of radius 2λ·γ_d·(p − ½), γ_d =
    d/(d − 1)·Γ(d)/Γ(d − 1) = d (rs4a ``gamma_factor``; γ_1 = 1).
    """

    norm = "linf"
    direct_norms = ("linf", "l1")

    def unit_sigma(self, dim: int) -> float:
        second = math.exp(math.lgamma(dim + 2.0) - math.lgamma(float(dim)))  # E[R²], R ~ Γ(d)
        return math.sqrt(((dim - 1) / 3.0 + 1.0) / dim * second)

    def directions_(self, out, generator):
        return linf_directions_(out, generator)

    def radius(self, p, dim: int | None = None):
        """Certified ℓ∞ radius λ·ln(1/(2(1 − p))) in float64 (inf at p = 1); λ needs ``dim``."""
        with np.errstate(divide="ignore"):  # log 0 = −inf at p = 1: the radius is inf
            return float_or_array(-self.scale(dim) * np.log(2.0 * (1.0 - self._p(p))))

    def direct_radius(self, norm: str, p, dim: int | None = None):
        """ℓ∞: :meth:`radius`; ℓ1: 2λ·γ_d·(p − ½)."""
        if norm != "l1":
            return super().direct_radius(norm, p, dim)
        d = require_dim(self.name, dim)
        factor = (d / (d - 1.0) * math.exp(math.lgamma(float(d)) - math.lgamma(d - 1.0))
                  if d > 1 else 1.0)
        return float_or_array(2.0 * self.scale(d) * factor * (self._p(p) - 0.5))
