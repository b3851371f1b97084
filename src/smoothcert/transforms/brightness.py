"""Brightness and contrast (Li et al., TSS, CCS 2021, §5.1 "brightness and contrast"): one
smoothing distribution, two certificates.

The transformation is x → e^k (x + b): a brightness shift b then a contrast factor e^k, as the
authors' ``BrightnessTransformer.process`` composes ``BrightnessScale(BrightnessShift(x))``
(``semantic/transformers.py``; ``semantic/transforms.py`` draws b ~ N(0, σ_b²) and
k ~ N(0, σ_k²)). Pixels are not clipped to [0, 1], as theirs are not: the certificate is for
this family of transformations, whose values may leave the image range.

``brightness`` certifies the shift: with probability ≥ 1 − α the smoothed classifier predicts
its class on every e^k'(x + b') with |b'| < ``radius`` and e^k' in [k_low, k_high] (their
``calc_radius`` with ``set_brightness_scale(k_low, k_high)``; k_low = k_high = 1, the default,
certifies the shift alone). ``contrast`` certifies the contrast factor: the range [lo, hi] of
factors e^k' with a positive shift bound, searched by bisection within [k_low, k_high] (their
``ContrastTransformer.calc_radius``, ``set_contrast_scale(0.1, 10.0)``); ``radius`` is theirs,
min(1 − lo, hi − 1), and the records keep lo and hi (``factor_low``, ``factor_high``). The
bounds are :mod:`smoothcert.stats.tss`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import SmoothcertError, check_nonnegative, check_positive_finite
from ..registry import option
from ..stats.tss import brightness_radius, contrast_radius, contrast_range
from .base import Transformation, register_transformation


def _check_distribution(options) -> None:
    """σ_b > 0, σ_k >= 0, finite; the certified factors 0 < k_low <= 1 <= k_high."""
    check_positive_finite("sigma_b", options.sigma_b)
    check_nonnegative("sigma_k", options.sigma_k)
    if not 0.0 < options.k_low <= 1.0:
        raise SmoothcertError(f"k_low is the smallest contrast factor certified, in (0, 1], got "
                              f"{options.k_low!r}")
    if not (math.isfinite(options.k_high) and options.k_high >= 1.0):
        raise SmoothcertError(f"k_high is the largest contrast factor certified, a finite "
                              f"number >= 1, got {options.k_high!r}")


class _BrightnessContrast(Transformation):
    """The shared distribution: (k, b), k ~ N(0, σ_k²), b ~ N(0, σ_b²), x → e^k (x + b)."""

    parameters = ("k", "b")

    def draw(self, count, generator, device="cpu"):
        """(count, 2) float64: one standard normal pair per row from ``generator`` (one call,
        row-major), scaled to k = σ_k z₀ and b = σ_b z₁."""
        z = torch.randn((count, 2), generator=generator, dtype=torch.float64, device=device)
        return z * torch.tensor([self.sigma_k, self.sigma_b], dtype=torch.float64,
                                device=device)

    def apply(self, x, params):
        """e^k_b (x + b_b) per row, in x's dtype (the factor e^k computed in float64)."""
        shape = (-1,) + (1,) * 3
        k, b = params[:, 0], params[:, 1]
        factor = torch.exp(k).to(device=x.device, dtype=x.dtype).reshape(shape)
        return (x + b.to(device=x.device, dtype=x.dtype).reshape(shape)) * factor


@register_transformation("brightness")
class Brightness(_BrightnessContrast):
    """Brightness shift x → e^k (x + b), b ~ N(0, σ_b²), k ~ N(0, σ_k²) (Li et al. 2021):
    certifies |b'| < radius at contrast factors in [k_low, k_high].

    The default certifies the shift alone (σ_k = 0, k_low = k_high = 1): then the radius is
    σ_b Φ⁻¹(p_lower), Cohen et al.'s bound in the one dimension of b."""

    unit = "brightness shift, pixel units"
    example = "brightness:sigma_b=0.2"

    @dataclass(frozen=True)
    class Options:
        sigma_b: float = option(0.2, "σ_b, pixel units: the std of the brightness shift b "
                                     "(the authors' --noise_b, 0.2 in their README)")
        sigma_k: float = option(0.0, "σ_k: the std of the log contrast factor k (--noise_k); "
                                     "0 draws no contrast change")
        k_low: float = option(1.0, "the smallest contrast factor e^k the shift bound holds "
                                   "for, in (0, 1] (their 1 - bright_scale)")
        k_high: float = option(1.0, "the largest contrast factor e^k the shift bound holds "
                                    "for, >= 1 (their 1 + bright_scale)")

        def __post_init__(self):
            _check_distribution(self)
            if self.sigma_k == 0.0 and (self.k_low, self.k_high) != (1.0, 1.0):
                raise SmoothcertError("a contrast range (k_low, k_high other than 1) is "
                                      "certified only with contrast smoothing: give sigma_k > 0")

    def radius(self, p_lower):
        return brightness_radius(p_lower, self.sigma_k, self.sigma_b, self.k_low, self.k_high)

    def certified_factors(self, p_lower):
        """[k_low, k_high]: the contrast factors the shift bound holds for."""
        return self.k_low, self.k_high


@register_transformation("contrast")
class Contrast(_BrightnessContrast):
    """Contrast factor x → e^k (x + b), k ~ N(0, σ_k²), b ~ N(0, σ_b²) (Li et al. 2021):
    certifies the factors e^k' in a range [lo, hi] around 1, searched within [k_low, k_high].

    ``radius`` is the authors' min(1 − lo, hi − 1); the records keep lo and hi."""

    unit = "contrast factor, 1 ± radius"
    example = "contrast:sigma_k=0.2,sigma_b=0.2"

    @dataclass(frozen=True)
    class Options:
        sigma_b: float = option(0.2, "σ_b, pixel units: the std of the brightness shift b "
                                     "(--noise_b)")
        sigma_k: float = option(0.2, "σ_k > 0: the std of the log contrast factor k "
                                     "(--noise_k, 0.2 in the authors' README)")
        k_low: float = option(0.1, "the bisection's lowest contrast factor, in (0, 1] (the "
                                   "authors' 0.1)")
        k_high: float = option(10.0, "the bisection's highest contrast factor, >= 1 (the "
                                     "authors' 10)")
        tol: float = option(1e-5, "the bisection's tolerance on log factors (the authors' "
                                  "EPS 1e-5)")

        def __post_init__(self):
            check_positive_finite("sigma_k", self.sigma_k)  # no contrast smoothing, no range
            _check_distribution(self)
            if not 0.0 < self.tol < 1.0:
                raise SmoothcertError(f"tol is a bisection tolerance in (0, 1), got "
                                      f"{self.tol!r}")

    def _arguments(self) -> dict:
        return {"k_low": self.k_low, "k_high": self.k_high, "tol": self.tol}

    def radius(self, p_lower):
        return contrast_radius(p_lower, self.sigma_k, self.sigma_b, **self._arguments())

    def certified_factors(self, p_lower):
        """[lo, hi] (:func:`~smoothcert.stats.tss.contrast_range`; (1, 1) for p_lower <= ½)."""
        return contrast_range(p_lower, self.sigma_k, self.sigma_b, **self._arguments())
