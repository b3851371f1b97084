"""DSRS's second distribution Q (Li et al. 2022): the run's (generalized) Gaussian conditioned
on ‖δ‖₂ ≤ T, the ball of P-mass th (the authors' ``gaussian-th`` and ``general-gaussian-th``).

Not a smoothing noise of its own (not in ``NOISES``): the ``dsrs`` certifier draws from it
besides the run's Gaussian noise, through :meth:`TruncatedGaussian.perturb_`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import special

from .draws import l2_directions_, sample_dim, scale_rows_


@dataclass(frozen=True)
class TruncatedGaussian:
    """P conditioned on the ball of P-mass ``th`` (0 < th < 1), in the input's d; P the
    generalized Gaussian of ``k`` (0: N(0, σ²I)) and per-coordinate σ, s = σ·√(d/(d − 2k)).

    A draw is a direction uniform on the unit sphere (a standard normal row over its norm:
    :func:`~smoothcert.noise.draws.l2_directions_`) times a radius s·√(2·γ⁻¹(m/2, U·th)),
    m = d − 2k, U ~ U[0, 1): the inverse CDF of ‖δ‖²/s² ~ χ²_m (regularized lower incomplete
    gamma, scipy's ``gammaincinv``, float64 on the host) truncated at its ``th`` quantile. An
    isotropic law is its direction times its radius, so this is exactly P given ‖δ‖ ≤ T (the
    authors draw radii and reject those above T; the inverse CDF needs one uniform per draw
    and no loop). Draws from ``generator``: the normals of every row first, then one uniform
    per row.
    """

    sigma: float
    th: float
    k: float = 0.0

    def perturb_(self, out: torch.Tensor, x: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """x + δ_Q into ``out`` (B, ...) rows shaped like x; returns ``out``."""
        l2_directions_(out, generator)
        u = torch.rand(out.shape[0], generator=generator, dtype=torch.float64,
                       device=out.device)
        d = sample_dim(out)
        m = d - 2.0 * self.k
        half_chi2 = special.gammaincinv(m / 2.0, u.cpu().numpy() * self.th)
        radius = self.sigma * np.sqrt(d / m) * np.sqrt(2.0 * half_chi2)
        scale_rows_(out, torch.from_numpy(radius).to(out.device))
        return out.add_(x)
