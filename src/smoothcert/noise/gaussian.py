"""Isotropic Gaussian noise and its L2 certificate (Cohen, Rosenfeld & Kolter 2019)."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import norm

from .base import NOISES, _Isotropic


@NOISES.register("gaussian")
class Gaussian(_Isotropic):
    """Isotropic Gaussian noise δ ~ N(0, σ²I) and its L2 certificate (Cohen et al. 2019, Thm. 1).

    If the smoothed classifier's top class has probability at least p > ½ under this noise, its
    prediction is constant within the L2 ball of radius ``σ·Φ⁻¹(p)``.

    ``sigma`` is a positive float, or a tensor of shape (B,) giving one σ per sample of a batch
    (data-dependent smoothing); a tensor σ broadcasts over the non-batch dimensions.
    """

    norm = "l2"

    def __repr__(self) -> str:
        return f"Gaussian(sigma={self.sigma_repr()})"

    def sample(self, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Noise with the shape, dtype and device of ``like`` (B, ...), drawn from ``generator``."""
        eps = torch.randn(like.shape, generator=generator, device=like.device, dtype=like.dtype)
        return eps * self._broadcast_sigma(like)

    def sample_(self, out: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw noise into the preallocated buffer ``out`` (no allocation); returns ``out``."""
        out.normal_(generator=generator)
        return out.mul_(self._broadcast_sigma(out))

    def radius(self, p):
        """Certified L2 radius σ·Φ⁻¹(p) in float64; p is a float or array of probabilities > ½."""
        sigma = self.sigma if isinstance(self.sigma, float) else self.sigma.double().cpu().numpy()
        r = sigma * norm.ppf(np.asarray(p, dtype=np.float64))
        return float(r) if np.ndim(r) == 0 else r
