"""Noise distributions: one strategy object shared by training, certification and attacks.

Inputs live in pixel space [0, 1]; noise is added there, and σ is in pixel units. For every
distribution here σ is the *standard deviation* of each noise coordinate, so that the same
``--sigma`` means the same noise energy whatever the distribution. ``norm`` names the norm of
the distribution's certified ball ("l2" or "l1").
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.stats import norm

from .errors import SmoothcertError
from .registry import Registry

Sigma = float | torch.Tensor

NOISES: Registry = Registry("noise")
"""Noise name (``--noise``) -> class taking σ; checkpoints and run identities store the name."""


class _Isotropic:
    """What every noise here shares: one σ (the per-coordinate standard deviation) per input.

    ``sigma`` is a positive float, or a tensor of shape (B,) giving one σ per sample of a batch
    (data-dependent smoothing); a tensor σ broadcasts over the non-batch dimensions. Subclasses
    draw the noise (``sample``, ``sample_``) and turn a probability into a radius (``radius``).
    """

    norm: str

    def __init__(self, sigma: Sigma):
        self.sigma = _validated_sigma(sigma)

    def sigma_repr(self):
        return float(self.sigma) if isinstance(self.sigma, float) else self.sigma.tolist()

    def scalar_sigma(self) -> float:
        """σ as one float; refuses per-sample σ (which needs one noise object per input)."""
        if isinstance(self.sigma, float):
            return self.sigma
        if self.sigma.numel() == 1:
            return float(self.sigma.reshape(()))
        raise SmoothcertError("this operation needs a single σ; got a per-sample σ tensor")

    def perturb(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """x + δ for a batch x of shape (B, ...)."""
        return x + self.sample(x, generator)

    def check_input(self, x: torch.Tensor) -> None:
        """Raise a :class:`SmoothcertError` if this noise cannot smooth at ``x`` (any x here)."""

    def perturb_(self, out: torch.Tensor, x: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """x + δ into the buffer ``out`` (rows shaped like the input x); returns ``out``. The
        Monte Carlo engine draws through this, so a noise may build its noisy inputs exactly
        (:class:`~smoothcert.sound_noise.DiscreteGaussian`)."""
        return self.sample_(out, generator).add_(x)

    def _broadcast_sigma(self, like: torch.Tensor):
        if isinstance(self.sigma, float):
            return self.sigma
        s = self.sigma.to(device=like.device, dtype=like.dtype)
        if s.numel() == 1:
            return s.reshape(())
        if s.shape[0] != like.shape[0]:
            raise SmoothcertError(
                f"per-sample σ has {s.shape[0]} entries but the batch has {like.shape[0]} inputs"
            )
        return s.reshape((-1,) + (1,) * (like.dim() - 1))


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


@NOISES.register("uniform")
class Uniform(_Isotropic):
    """Uniform noise δ ~ U[−λ, λ]^d and its L1 certificate (Yang et al. 2020, "Randomized
    Smoothing of All Shapes and Sizes", Table 1 / Thm. for the uniform distribution).

    ``sigma`` is the **standard deviation** of each coordinate, as for :class:`Gaussian`; the
    half-width is λ = √3·σ (the std of U[−λ, λ] is λ/√3). If the smoothed classifier's top class
    has probability at least p > ½ under this noise, its prediction is constant within the L1
    ball of radius ``2λ·(p − ½)``.

    ``sigma`` is a positive float or a (B,) tensor of per-sample σ, exactly as for
    :class:`Gaussian`; only the draws and the radius differ.
    """

    norm = "l1"

    def __repr__(self) -> str:
        return f"Uniform(sigma={self.sigma_repr()})"

    @property
    def half_width(self):
        """λ = √3·σ (a float, or a (B,) tensor for per-sample σ)."""
        return math.sqrt(3.0) * self.sigma

    def sample(self, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Noise U[−λ, λ] with the shape, dtype and device of ``like`` (B, ...)."""
        u = torch.rand(like.shape, generator=generator, device=like.device, dtype=like.dtype)
        return u.mul_(2.0).sub_(1.0).mul_(math.sqrt(3.0) * self._broadcast_sigma(like))

    def sample_(self, out: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw noise into the preallocated buffer ``out`` (no allocation); returns ``out``."""
        out.uniform_(-1.0, 1.0, generator=generator)
        return out.mul_(math.sqrt(3.0) * self._broadcast_sigma(out))

    def radius(self, p):
        """Certified L1 radius 2λ·(p − ½) in float64; p is a float or array of probabilities > ½."""
        sigma = self.sigma if isinstance(self.sigma, float) else self.sigma.double().cpu().numpy()
        r = 2.0 * math.sqrt(3.0) * sigma * (np.asarray(p, dtype=np.float64) - 0.5)
        return float(r) if np.ndim(r) == 0 else r


def _validated_sigma(sigma: Sigma) -> Sigma:
    if isinstance(sigma, torch.Tensor):
        if sigma.dim() > 1 or sigma.numel() == 0:
            raise SmoothcertError(f"σ tensor must have shape (B,), got {tuple(sigma.shape)}")
        if not torch.isfinite(sigma).all() or (sigma <= 0).any():
            raise SmoothcertError("σ must be positive and finite for every sample")
        return sigma.detach()
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)):
        raise SmoothcertError(f"σ must be a number or a tensor, got {type(sigma).__name__}")
    if not math.isfinite(sigma) or sigma <= 0:
        raise SmoothcertError(f"σ must be a positive finite number, got {sigma!r}")
    return float(sigma)



from . import sound_noise  # noqa: E402, F401  (registers the sound discrete Gaussian noises)
