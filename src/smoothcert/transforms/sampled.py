"""The base class of TSS's *sampled* transformations, rotation and scaling (Li et al., TSS, CCS
2021, §5.2, "sampling-based certification"; authors' ``semantic/strict_rotation_certify.py``,
``strict_resize_certify.py``).

These are not resolvable, so the smoothed classifier smooths over pixel noise only:
g(z) = argmax_c P(f(m ⊙ (z + ε + β)) = c), ε ~ N(0, σ²I), β ~ N(0, σ_b²) a brightness shift
of every pixel (σ_b = 0: none), m the transformation's mask (rotation: the inscribed disc;
scaling: none). The certified set is an interval of the transformation's parameter around
the identity (angles [−Δ, Δ]; scale factors [low, high]), cut into S equal slices
[θ_j, θ_{j+1}]. For each slice the interpolation bound M_j (:mod:`.interpolation`) bounds how
far any T(x, θ), θ in the slice, lies from the sample T(x, θ_j), and g is certified at the
sample for an ℓ2 radius above M_j + ``l2`` (:func:`smoothcert.stats.tss.sampled_l2_radius`;
with brightness, together with every shift |b₁| ≤ ``b``): the certificate then also holds for
every additive perturbation δ of ‖δ‖₂ ≤ ``l2`` on top of the transformation (the authors'
``--l2_r``; 0 by default). ``certifiers/tss.py`` runs the slices.

Training (``methods/transform.py``, the authors' ``strict-rotation-noise`` and ``resize``
modes): each example is transformed with a parameter drawn uniformly from the training range
(a little wider than the certified one, as theirs), then ε (and β) are added and the mask
applied. Draws from the generator, in order: the parameters (one uniform float64 per row),
the pixel noise (one normal per value, in the input's dtype), then β (one normal per row)
where σ_b > 0.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np
import torch

from ..errors import SmoothcertError, check_count, check_nonnegative, check_positive_finite
from ..stats.tss import sampled_l2_radius
from .base import Transformation


def check_smoothing(options) -> None:
    """σ > 0; σ_b ≥ 0; b ≥ 0 only with σ_b > 0; slices and subslices counts >= 1; l2 ≥ 0."""
    check_positive_finite("sigma", options.sigma)
    check_nonnegative("sigma_b", options.sigma_b)
    check_nonnegative("b", options.b)
    if options.sigma_b == 0.0 and options.b != 0.0:
        raise SmoothcertError("a brightness shift b > 0 is certified only with brightness "
                              "smoothing: give sigma_b > 0")
    check_count("slices", options.slices, 1, 10**7)
    check_count("subslices", options.subslices, 1, 10**6)
    check_nonnegative("l2", options.l2)


class SampledTransformation(Transformation):
    """A transformation certified at S sampled parameters with TSS's interpolation bound.

    Subclasses set :attr:`identity`, and implement :meth:`edges` (the S + 1 slice ends),
    :meth:`geometric` (T in float64), :meth:`slice_bounds` (M_j² per slice, from
    :mod:`.interpolation`), :meth:`mask`, :meth:`certified_set` and :meth:`train_range`;
    :meth:`anchors` says which ends of a slice its bound is measured from."""

    sampled: ClassVar[bool] = True
    identity: ClassVar[float] = 0.0
    """The parameter that leaves the image as it is (0 degrees, scale 1)."""

    @abc.abstractmethod
    def edges(self) -> torch.Tensor:
        """(S + 1,) float64: the ends of the S slices of the certified interval, increasing."""

    @abc.abstractmethod
    def geometric(self, x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) float64: T(x, θ_b) for ``params`` (B,), masked."""

    @abc.abstractmethod
    def slice_bounds(self, x: torch.Tensor) -> torch.Tensor:
        """(S,) float64 M_j²: every T(x, θ), θ in slice j, lies within ℓ2 distance M_j of one
        of the slice's anchors (:meth:`anchors`) — of each anchor, when the slice has one."""

    def anchors(self, shape) -> np.ndarray:
        """(S, 2) bool: whether slice j needs its left and its right end certified, for inputs
        of ``shape`` (C, H, W). By default its left end (θ_j), as rotation's bound measures
        from it."""
        need = np.zeros((self.slices, 2), dtype=bool)
        need[:, 0] = True
        return need

    @abc.abstractmethod
    def mask(self, h: int, w: int, device) -> torch.Tensor | None:
        """(H, W) float64 mask m the smoothing applies, or None (no mask)."""

    @abc.abstractmethod
    def certified_set(self, distance: float) -> tuple[float, float, float]:
        """(radius, factor_low, factor_high) of the record when every slice nearer the
        identity than ``distance`` (parameter units) is certified."""

    @abc.abstractmethod
    def train_range(self) -> tuple[float, float]:
        """The interval training draws parameters from, uniformly."""

    def radius(self, p_lower):
        """The ℓ2 radius certified at a sample (what the interpolation error must stay
        under); the record's radius is :meth:`certified_set`'s."""
        return sampled_l2_radius(p_lower, self.sigma, self.sigma_b, self.b)

    def check_values(self, x: torch.Tensor) -> None:
        """The bound's |T_p(θ) − T_p(θ')| ≤ max(T_p(θ), T_p(θ')) needs pixel values >= 0."""
        if bool((x < 0).any()) or not bool(torch.isfinite(x).all()):
            raise SmoothcertError(f"transformation {self.name!r} bounds its interpolation error "
                                  "for images with finite pixel values >= 0 (pixel space); "
                                  "this input has others")

    def slice_order(self) -> np.ndarray:
        """The slices by their distance from the identity, nearest first (stable)."""
        edges = self.edges().numpy()
        inner = np.maximum(np.maximum(edges[:-1] - self.identity, self.identity - edges[1:]), 0)
        return np.argsort(inner, kind="stable"), inner

    def draw(self, count, generator, device="cpu"):
        """(count, 1) float64 parameters, uniform on :meth:`train_range` (training)."""
        low, high = self.train_range()
        u = torch.rand((count, 1), generator=generator, dtype=torch.float64, device=device)
        return low + (high - low) * u

    def apply(self, x, params):
        """T(x, θ_b) per row, masked, in x's dtype (no noise)."""
        return self.geometric(x, params[:, 0]).to(x.dtype)

    def add_noise_(self, out: torch.Tensor, generator) -> torch.Tensor:
        """``out`` (B, C, H, W) <- m ⊙ (out + ε + β): the smoothing's draws (module doc)."""
        out.add_(torch.randn(out.shape, generator=generator, dtype=out.dtype,
                             device=out.device).mul_(self.sigma))
        if self.sigma_b > 0.0:
            beta = torch.randn(out.shape[0], generator=generator, dtype=out.dtype,
                               device=out.device)
            out.add_(beta.mul_(self.sigma_b).reshape(-1, 1, 1, 1))
        mask = self.mask(*out.shape[-2:], out.device)
        return out.mul_(mask.to(out.dtype)) if mask is not None else out

    def perturb_(self, out, x, generator=None):
        """g's smoothing at x itself: m ⊙ (x + ε + β), B rows."""
        return self.add_noise_(out.copy_(x.expand_as(out)), generator)

    def transform(self, x, generator=None):
        """Training: T at a parameter drawn from :meth:`train_range`, then the noise."""
        return self.add_noise_(self.apply(x, self.draw(x.shape[0], generator, x.device)),
                               generator)

    def samples(self, x: torch.Tensor, points) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples T(x, θ_k) at the slice ends of indices ``points`` in x's dtype, and each
        one's ℓ2 distance from its float64 value (the rounding the model's input adds to the
        interpolation error)."""
        edges = self.edges().to(x.device)
        exact = self.geometric(x, edges[torch.as_tensor(points, device=x.device)])
        cast = exact.to(x.dtype)
        rounding = (cast.to(torch.float64) - exact).flatten(1).norm(dim=1)
        return cast, rounding


class SampleSweep:
    """The engine's stand-in for a noise that draws ``sizes[k]`` noisy copies of sample k of
    ``samples`` (K, C, H, W) in turn, through the transformation's :meth:`add_noise_`. One
    object per request (it keeps a cursor)."""

    def __init__(self, transformation: SampledTransformation, samples: torch.Tensor, sizes):
        self.transformation, self.samples = transformation, samples
        self.ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
        self.cursor = 0

    def perturb_(self, out: torch.Tensor, x: torch.Tensor, generator=None) -> torch.Tensor:
        rows = np.arange(self.cursor, self.cursor + out.shape[0])
        self.cursor += out.shape[0]
        which = torch.as_tensor(np.searchsorted(self.ends, rows, side="right"),
                                device=self.samples.device)
        out.copy_(self.samples[which])
        return self.transformation.add_noise_(out, generator)
