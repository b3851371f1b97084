"""Exp2 noise, density ∝ e^(−‖z/λ‖₂), and its ℓ2 certificate in closed form (Yang et al.
2020, rs4a ``Exp2`` with k = 1, j = 0)."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import beta

from .base import float_or_array, register_noise, require_dim
from .draws import l2_directions_
from .radial import RadialNoise


@register_noise("exp2")
class Exp2(RadialNoise):
    """Exp2 noise, density ∝ exp(−‖z‖₂/λ), and its ℓ2 certificate (Yang et al. 2020).

    rs4a ``Exp2(k=1, j=0)``: z = λ·R·u, R ~ Gamma(d), u uniform on the unit ℓ2 sphere.

    σ is each coordinate's standard deviation: λ = σ/√(d + 1) for d = C·H·W (rs4a
    ``_sigma``). If the smoothed classifier's top class has probability at least p > ½, its
    prediction is constant within the ℓ2 ball of radius

        λ·(d − 1)·atanh(1 − 2·B⁻¹(1 − p)),  B the Beta((d − 1)/2, (d − 1)/2) CDF

    (the level-set method in closed form for k = 1; rs4a ``Exp2.certify_l2``). Needs d ≥ 2.
    """

    norm = "l2"
    min_dim = 2

    def unit_sigma(self, dim: int) -> float:
        return math.sqrt(math.exp(math.lgamma(dim + 2.0) - math.lgamma(float(dim))) / dim)

    def directions_(self, out, generator):
        return l2_directions_(out, generator)

    def radius(self, p, dim: int | None = None):
        """Certified ℓ2 radius (class docstring) in float64; needs ``dim`` >= 2."""
        d = require_dim(self.name, dim, self.min_dim)
        half = (d - 1) / 2.0
        x = beta.ppf(1.0 - self._p(p), half, half)
        with np.errstate(divide="ignore"):  # atanh 1 = inf at p = 1: the radius is inf
            return float_or_array(self.scale(d) * (d - 1) * np.arctanh(1.0 - 2.0 * x))
