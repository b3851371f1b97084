"""Rotation (Li et al., TSS, CCS 2021, §5.2; the authors' ``Rotation`` in
``semantic/transforms.py``, certified by ``semantic/strict_rotation_aliasing_analyze.py`` and
``strict_rotation_certify.py``).

T(x, θ) rotates x by θ degrees about its centre ((H − 1)/2, (W − 1)/2) with bilinear
interpolation and keeps the inscribed disc (pixels farther than (min(H, W) − 1)/2 from the
centre are set to 0, before and after the noise, as the authors' mask). With probability
≥ 1 − α the smoothed classifier (Gaussian noise σ on the disc; with ``sigma_b`` > 0 also a
brightness shift) predicts its class on every rotation of x by an angle in [−radius, radius]
degrees (and, with ``b`` > 0, every brightness shift |b₁| ≤ b on top: their
``rotation-brightness``), ``radius`` ≤ ``angle``: the certified slices nearest 0, in order
(``sampled.py``, ``certifiers/tss.py``). A rotation by a multiple of 360° is the rotation by
its remainder (the angles are sines and cosines), so ``angle`` is at most 180.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SmoothcertError
from ..registry import option
from . import interpolation
from .base import register_transformation
from .sampled import SampledTransformation, check_smoothing


def _check_angle(name: str, value: float) -> None:
    if not 0.0 < value <= 180.0:
        raise SmoothcertError(f"{name} is the half-width of a range of angles in degrees, in "
                              f"(0, 180], got {value!r}")


@register_transformation("rotation")
class Rotation(SampledTransformation):
    """Rotation by angles in [−angle, angle] degrees (Li et al. 2021, sampling-based
    certification): Gaussian smoothing on the inscribed disc, ``slices`` sampled angles and
    the interpolation bound between them; certifies the angles within ``radius`` of 0."""

    unit = "rotation angle, degrees (+/-)"
    parameters = ("angle",)
    example = "rotation:sigma=0.25,angle=10"

    @dataclass(frozen=True)
    class Options:
        sigma: float = option(0.25, "σ, pixel units: the std of the Gaussian noise on each "
                                    "pixel (the authors' noise_sd: 0.10-0.50 on MNIST)")
        angle: float = option(10.0, "Δ, degrees: certify rotations in [-Δ, Δ], 0 < Δ <= 180 "
                                    "(their --partial)")
        train_angle: float = option(12.5, "degrees: training rotates by angles uniform in "
                                          "[-train_angle, train_angle] (their "
                                          "--rotation_angle: 12.5 to certify 10, 35 for 30)")
        slices: int = option(500, "S: sampled angles, one per slice of [-Δ, Δ] (their "
                                  "--slice counts slices of 360 degrees: S = slice * 2Δ / 360)")
        subslices: int = option(1000, "R: sub-intervals per slice for the interpolation bound "
                                      "(their --subslice)")
        sigma_b: float = option(0.0, "σ_b, pixel units: the std of a brightness shift of every "
                                     "pixel added to the noise (their --noise_b); 0: none")
        b: float = option(0.0, "the brightness shift |b| certified with every angle (their "
                               "--b); needs sigma_b > 0")
        l2: float = option(0.0, "an l2 perturbation ||delta|| <= l2 (pixel units) certified on "
                                "top of every angle (their --l2_r); 0: none")

        def __post_init__(self):
            _check_angle("angle", self.angle)
            _check_angle("train_angle", self.train_angle)
            check_smoothing(self)

    def edges(self):
        """−Δ + 2Δ·j/S for j = 0..S (the last is Δ exactly)."""
        j = torch.arange(self.slices + 1, dtype=torch.float64)
        return -self.angle + (2.0 * self.angle) * j / self.slices

    def geometric(self, x, params):
        return interpolation.rotate(x, params)

    def lipschitz(self, x, edges):
        """(S,) the authors' Lipschitz constants (per degree) of each slice."""
        return interpolation.rotation_lipschitz(x, edges[:-1], edges[1:])

    def slice_bounds(self, x):
        """M_j² from slice j's left end (the authors' aliasing analysis)."""
        self.check_values(x)
        edges = self.edges().to(x.device)
        return interpolation.slice_bounds(x, self.geometric, edges, self.subslices,
                                          self.lipschitz(x, edges))

    def mask(self, h, w, device):
        return interpolation.disc_mask(h, w, device)

    def certified_set(self, distance):
        return min(distance, self.angle), 1.0, 1.0

    def train_range(self):
        return -self.train_angle, self.train_angle

    def check_shape(self, shape):
        """Refuse slices too wide for the bound at this image size (``check_rotation_step``)."""
        interpolation.check_rotation_step(2.0 * self.angle / self.slices, tuple(shape)[-2:])
