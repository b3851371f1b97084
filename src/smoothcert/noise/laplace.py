"""Laplace noise: its ℓ1 certificate (Teng, Lee & Yuan 2020) and its ℓ∞ certificate by the
differential method (Yang et al. 2020, rs4a ``Laplace``)."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from scipy.stats import binom

from .base import Noise, float_or_array, register_noise, require_dim
from .draws import laplace_
from .tables import cached_table, table_key


@register_noise("laplace")
class Laplace(Noise):
    """Laplace noise and its ℓ1 and ℓ∞ certificates (Teng et al. 2020; Yang et al. 2020).

    iid per coordinate with density e^(−|z|/λ)/(2λ), λ = σ/√2 (its standard deviation is σ;
    rs4a's ``get_lambd``).

    If the smoothed classifier's top class has probability at least p > ½, its prediction is
    constant within the ℓ1 ball of radius −λ·ln(2(1 − p)) (Teng et al. 2020, Thm. 1; tight for
    a halfspace along a coordinate), and within the ℓ∞ ball of the differential method's radius
    λ·∫_{1−p}^{½} dq/Φ(q), Φ(q) the largest E[S·1_U] over sets U of measure q with S = Σᵢ sign(zᵢ)
    (rs4a ``Phi_linf``), looked up from below in a cached table for the input dimension d
    (:mod:`~smoothcert.noise.tables`): rs4a's "integrate" mode. rs4a's default "approx" mode,
    λ·Φ_N⁻¹(p)/√d, is an approximation with no proof that it stays below the integral (it does,
    by 10⁻⁶ to 10⁻⁴ relative, at the d ≥ 784 and p we checked), so it is not used.

    ``sigma`` is a positive float or a (B,) tensor of per-sample σ.
    """

    norm = "l1"
    direct_norms = ("l1", "linf")
    needs_dim = True  # the ℓ∞ table depends on d (the ℓ1 radius does not)

    def scale(self, dim: int | None = None):
        """λ = σ/√2 (for every d) (float64: a float, or an array for per-sample σ)."""
        return self._sigma_float64() / math.sqrt(2.0)

    def sample(self, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Noise with the shape, dtype and device of ``like`` (B, ...), drawn from ``generator``."""
        return self.sample_(torch.empty_like(like), generator)

    def sample_(self, out: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """λ·(E₁ − E₂) into ``out`` (two standard exponential draws per coordinate)."""
        return laplace_(out, generator).mul_(self._broadcast_sigma(out) / math.sqrt(2.0))

    def radius(self, p, dim: int | None = None):
        """Certified ℓ1 radius −λ·ln(2(1 − p)) in float64 (``dim`` is not needed); inf at
        p = 1."""
        p = np.asarray(p, dtype=np.float64)
        with np.errstate(divide="ignore"):  # log 0 = −inf at p = 1: the radius is inf
            return float_or_array(-self.scale() * np.log(2.0 * (1.0 - p)))

    def direct_radius(self, norm: str, p, dim: int | None = None):
        """ℓ1: :meth:`radius`; ℓ∞: λ times the differential method's table for d = ``dim``."""
        if norm != "linf":
            return super().direct_radius(norm, p, dim)
        d = require_dim(self.name, dim)
        table = cached_table(table_key(self.name, "linf", d, {}), functools.partial(phi_linf, d))
        return float_or_array(self.scale() * table.lookup(p))


def phi_linf(dim: int, q: np.ndarray) -> np.ndarray:
    """Φ(q) of Laplace noise (λ = 1) against ℓ∞: the largest E[S·1_U] over sets U of measure
    q, S = Σᵢ sign(zᵢ) = d − 2·Binomial(d, ½), taking the largest values of S first (exact,
    piecewise linear in q)."""
    k = np.arange(dim + 1)
    values = (dim - 2 * k).astype(np.float64)  # S, largest first
    mass = binom.pmf(k, dim, 0.5)
    above = np.concatenate([[0.0], np.cumsum(mass)])  # P(S > values[k])
    gain = np.concatenate([[0.0], np.cumsum(values * mass)])  # E[S; S > values[k]]
    j = np.clip(np.searchsorted(above, q, side="right") - 1, 0, dim)
    return gain[j] + values[j] * (q - above[j])
