"""The base of the noises with a density of one norm of z (Yang et al. 2020, rs4a's ExpInf,
Exp1, Exp2): z = λ·R·u with u uniform on the unit sphere of that norm and R^k ~ Gamma(α)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from .base import Noise, require_dim
from .draws import sample_dim, scale_rows_, standard_gamma


class RadialNoise(Noise):
    """Density ∝ exp(−‖z/λ‖^k) in one norm (a subclass names it through :meth:`directions_`).

    In that norm's polar coordinates the radius r has density ∝ r^(d−1)·e^(−r^k), so r^k ~
    Gamma(d/k); the direction is uniform on the unit sphere. λ follows from σ (each
    coordinate's standard deviation) and from d = C·H·W (rs4a ``get_lambd``), so the noise
    :attr:`needs_dim` and draws with the d of the batch's samples; one σ per noise object.
    """

    needs_dim = True
    per_sample_sigma = False  # λ(σ, d) per batch row is not implemented
    k: ClassVar[float] = 1.0
    min_dim: ClassVar[int] = 1

    def unit_sigma(self, dim: int) -> float:
        """The standard deviation of a coordinate at λ = 1 in dimension d (rs4a ``_sigma``)."""
        raise NotImplementedError

    def directions_(self, out: torch.Tensor, generator) -> torch.Tensor:
        """Rows of ``out`` uniform on the unit sphere of the noise's norm."""
        raise NotImplementedError

    def gamma_shape(self, dim: int) -> float:
        """α of the radius: R^k ~ Gamma(α, 1)."""
        return dim / self.k

    def scale(self, dim) -> float:
        """λ = σ/``unit_sigma(d)`` for input dimension d = ``dim``."""
        return self.scalar_sigma() / self.unit_sigma(require_dim(self.name, dim, self.min_dim))

    def sample(self, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Noise with the shape, dtype and device of ``like`` (B, ...), drawn from ``generator``."""
        return self.sample_(torch.empty_like(like), generator)

    def sample_(self, out: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """λ·R·u into ``out`` (B, ...), d = numel/B: the directions u first, then the B radii
        (Marsaglia–Tsang gamma draws, :func:`~smoothcert.noise.draws.standard_gamma`)."""
        dim = sample_dim(out)
        lam = self.scale(dim)
        self.directions_(out, generator)
        radii = standard_gamma(self.gamma_shape(dim), out.shape[0], generator, out.device)
        return scale_rows_(out, radii.pow_(1.0 / self.k).mul_(lam))

    def _p(self, p) -> np.ndarray:
        return np.asarray(p, dtype=np.float64)
