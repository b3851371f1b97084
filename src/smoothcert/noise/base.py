"""Noise distributions: one strategy object shared by training, certification and attacks.

Inputs live in pixel space [0, 1]; noise is added there, and σ is in pixel units. For every
distribution here σ is the *standard deviation* of each noise coordinate, so that the same
``--sigma`` means the same noise energy whatever the distribution. ``norm`` names the norm of
the distribution's certified ball ("l2" or "l1").
"""

from __future__ import annotations

import math

import torch

from ..errors import SmoothcertError
from ..registry import Registry

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
        (:class:`~smoothcert.noise.discrete_gaussian.DiscreteGaussian`)."""
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
