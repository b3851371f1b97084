"""Exp1 noise, density ∝ e^(−‖z/λ‖₁^k) with k = 2, and its ℓ1 certificate by the
differential method (Yang et al. 2020, rs4a ``Exp1``)."""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.stats import gamma

from .base import float_or_array, register_noise, require_dim
from .draws import l1_directions_
from .radial import RadialNoise
from .tables import cached_table, table_key

POWER = 2.0
"""k: Exp1 with k = 1 is the Laplace density, so this is the paper's first other member (rs4a's
tutorial draws Exp1 with k = 2; its tests build ℓ1 tables for k = 2, 3, 4)."""


@register_noise("exp1")
class Exp1(RadialNoise):
    """Exp1 noise, density ∝ exp(−(‖z‖₁/λ)²), and its ℓ1 certificate (Yang et al. 2020).

    rs4a ``Exp1(k=2)``: z = λ·R·u, R^k ~ Gamma(d/k), u uniform on the unit ℓ1 sphere.

    σ is each coordinate's standard deviation: λ = σ/√(2/(d(d + 1))·Γ((d + 2)/k)/Γ(d/k)) for
    d = C·H·W (rs4a ``_sigma``; λ = σ·√(d + 1) for k = 2). If the smoothed classifier's top
    class has probability at least p > ½, its prediction is constant within the ℓ1 ball of
    radius λ·∫_{1−p}^{½} dq/Φ(q), Φ(q) = k/2·Γ((d+k−1)/k)/Γ(d/k)·(1 − G_{(d+k−1)/k}(G⁻¹_{d/k}
    (1 − 2q))) (rs4a ``Phi_l1``, G_α the Gamma(α) CDF), looked up from below in a cached
    table for d (:mod:`~smoothcert.noise.tables`).
    """

    norm = "l1"
    k = POWER

    def unit_sigma(self, dim: int) -> float:
        k = self.k
        return math.sqrt(2.0 / dim / (dim + 1.0)
                         * math.exp(math.lgamma((dim + 2.0) / k) - math.lgamma(dim / k)))

    def directions_(self, out, generator):
        return l1_directions_(out, generator)

    def radius(self, p, dim: int | None = None):
        """Certified ℓ1 radius (class docstring) in float64; the table and λ need ``dim``."""
        d = require_dim(self.name, dim)
        table = cached_table(table_key(self.name, "l1", d, {"k": self.k}),
                             functools.partial(phi_l1, d, self.k))
        return float_or_array(self.scale(d) * table.lookup(p))


def phi_l1(dim: int, k: float, q: np.ndarray) -> np.ndarray:
    """Φ(q) of Exp1 (λ = 1, k ≥ 1) against ℓ1 (rs4a ``Exp1.Phi_l1``), with 1 − G(G⁻¹(1 − 2q))
    written as the survival function at the inverse survival function of 2q (accurate for
    small q)."""
    const = k / 2.0 * math.exp(math.lgamma((dim + k - 1.0) / k) - math.lgamma(dim / k))
    return const * gamma.sf(gamma.isf(2.0 * np.asarray(q), dim / k), (dim + k - 1.0) / k)
