"""Scaling (Li et al., "TSS: Transformation-Specific Smoothing for Robustness Certification",
CCS 2021, §5.2; the authors' ``Resize`` in ``semantic/transforms.py``, certified by
``semantic/strict_resize_aliasing_analyze.py`` and ``strict_resize_certify.py``).

T(x, s) scales x by the factor s about its centre c = ((H − 1)/2, (W − 1)/2): output pixel
(i, j) samples x bilinearly at ((i − cy)/s + cy, (j − cx)/s + cx), and a pixel whose sample
point falls outside the image is 0 (the black border of a zoom-out, s < 1); s = 1 is x itself.
There is no mask. Guarantee: with probability ≥ 1 − α the smoothed classifier (Gaussian noise
σ on every pixel; with ``sigma_b`` > 0 also a brightness shift) predicts its class on every
scaling of x by a factor in [factor_low, factor_high] (the record's columns; with ``b`` > 0,
and every brightness shift |b₁| ≤ b on top: their ``resize-brightness``), the certified
slices nearest 1, in order (``sampled.py``, ``certifiers/tss_slices.py``). The record's radius
is the half-width of the interval around 1 they certify (one-sided ranges: its one side).

The S + 1 sampled factors are uniform in 1/s from ``low`` to ``high`` (their default grid,
s_j = 1/(k (c + j)) with k = (1/low − 1/high)/S and kc = 1/high). Each slice's bound M_j is
measured from its right end, and also from its left end where it holds a factor at which
pixels enter the border (``scaling_bound.py``, which gives the bound and its derivation).

Differences from the authors', and why:

* their box's last column is ``floor((1 − s) cx + s (h − 1))`` (h where w is meant); ours uses
  w (the same on the square images they use);
* their ``proc`` returns x for |s − 1| < 10⁻⁶; ours only for s = 1 (a factor just below 1
  already blanks the border rows, as their box formula says);
* their Lipschitz constant looks up the two cells a sample point occupies at a slice's ends;
  ours the four corners of the rectangle they span, which holds every cell the point visits
  (``scaling_bound.py``);
* where float64 rounding puts a grid point on the other side of a dividing point than theirs
  (a grid end a few ulps below 1, a sub-point on a dividing point), the two bounds split the
  jump differently (``tests/transforms/test_scaling_golden.py``);
* their ``--slice`` and ``--subslice`` count points; ``slices`` and ``subslices`` count
  intervals (their README's 1000 and 250 are 999 and 249 here);
* float64 throughout (theirs float32), the bound raised for its rounding; the alternative
  grid uniform in s (their ``--uniform``) is not offered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from ..errors import SmoothcertError
from ..registry import option
from . import scaling_bound
from .base import register_transformation
from .sampled import SampledTransformation, check_smoothing


def float_radius(lo: float | None, hi: float | None) -> float:
    """The record's radius r for the certified factors [lo, hi] (a side given as None is not
    counted): every floating-point factor s with |s − 1| ≤ r lies in [lo, hi]. The exact
    distance min(1 − lo, hi − 1) would write 0.09999999999999998 for [0.9, 1.1] (the float 0.9
    lies above 9/10), and ``report`` would count that row out at r = 0.1; its 12-digit
    rounding is taken where no float factor it adds leaves [lo, hi], the exact one (rounded
    down) elsewhere."""
    sides = []
    if lo is not None:
        sides.append(Fraction(1) - Fraction(lo))
    if hi is not None:
        sides.append(Fraction(hi) - Fraction(1))
    exact = min(sides)
    nice = Fraction(float(f"{float(exact):.12g}"))
    if nice > exact and _floats_within(nice, lo, hi):
        return float(nice)
    down = float(exact)
    return down if Fraction(down) <= exact else math.nextafter(down, 0.0)


def _floats_within(r: Fraction, lo: float | None, hi: float | None) -> bool:
    """Whether every float in [1 − r, 1 + r] (real ends) lies in [lo, hi]."""
    below, above = 1 - r, 1 + r
    first, last = float(below), float(above)
    if Fraction(first) < below:
        first = math.nextafter(first, math.inf)
    if Fraction(last) > above:
        last = math.nextafter(last, -math.inf)
    return (lo is None or first >= lo) and (hi is None or last <= hi)


def _check_range(low_name: str, low: float, high_name: str, high: float) -> None:
    """0 < low ≤ 1 ≤ high, low < high, finite: a range of scale factors around 1."""
    for name, value in ((low_name, low), (high_name, high)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0.0:
            raise SmoothcertError(f"{name} is a scale factor, a finite number > 0 (0 shrinks "
                                  f"the image to a point, < 0 mirrors it), got {value!r}")
    if low > 1.0 or high < 1.0 or not low < high:
        raise SmoothcertError(f"[{low_name}, {high_name}] must be a range of scale factors "
                              f"holding 1 (the identity), {low_name} < {high_name}: "
                              f"{low_name} <= 1 <= {high_name}, got [{low!r}, {high!r}]")


@register_transformation("scaling")
class Scaling(SampledTransformation):
    """Scaling by factors in [low, high] about the centre (Li et al. 2021, sampling-based
    certification): Gaussian smoothing, ``slices`` + 1 sampled factors uniform in 1/s and the
    interpolation bound between them; certifies the factors nearest 1."""

    unit = "scale factor, 1 +/- radius"
    parameters = ("scale",)
    example = "scaling:sigma=0.25,low=0.9,high=1.1"
    identity = 1.0

    @dataclass(frozen=True)
    class Options:
        sigma: float = option(0.25, "σ, pixel units: the std of the Gaussian noise on each "
                                    "pixel (the authors' noise_sd)")
        low: float = option(0.9, "the smallest scale factor certified, 0 < low <= 1 (their "
                                 "sl)")
        high: float = option(1.1, "the largest scale factor certified, high >= 1 (their sr)")
        train_low: float = option(0.85, "training scales by factors uniform in [train_low, "
                                        "train_high] (their train.py --sl)")
        train_high: float = option(1.15, "the largest training factor (their train.py --sr)")
        slices: int = option(999, "S: slices of [low, high], uniform in 1/scale, S + 1 "
                                  "sampled factors (their --slice counts the S + 1)")
        subslices: int = option(249, "R: sub-intervals per slice for the interpolation bound "
                                     "(their --subslice counts the R + 1 points)")
        sigma_b: float = option(0.0, "σ_b, pixel units: the std of a brightness shift of every "
                                     "pixel added to the noise (their --noise_b); 0: none")
        b: float = option(0.0, "the brightness shift |b| certified with every factor (their "
                               "--b); needs sigma_b > 0")
        l2: float = option(0.0, "an l2 perturbation ||delta|| <= l2 (pixel units) certified on "
                                "top of every factor (their --l2_r); 0: none")

        def __post_init__(self):
            _check_range("low", self.low, "high", self.high)
            _check_range("train_low", self.train_low, "train_high", self.train_high)
            check_smoothing(self)

    def edges(self):
        """s_j = 1/(k (c + j)), j = S..0 (increasing), their grid: uniform in 1/s, the ends
        exactly ``low`` and ``high``."""
        count = self.slices
        k = (1.0 / self.low - 1.0 / self.high) / count
        c = count / (self.high / self.low - 1.0)
        j = torch.arange(count, -1, -1, dtype=torch.float64)
        out = 1.0 / (k * (c + j))
        out[0], out[-1] = self.low, self.high
        return out

    def geometric(self, x, params):
        return scaling_bound.scale(x, params)

    def slice_bounds(self, x):
        """M_j² from slice j's right end, and from its left end too where it holds a dividing
        point (the authors' aliasing analysis, ``scaling_bound.py``)."""
        self.check_values(x)
        self.check_shape(tuple(x.shape))
        return scaling_bound.slice_bounds(x, self.edges().to(x.device), self.subslices)

    def anchors(self, shape):
        """The right end of every slice; the left end too where the slice holds a factor at
        which pixels cross the border (the bound measures the points left of it from there)."""
        has, _ = scaling_bound.slice_dividers(self.edges(), tuple(shape)[-2:])
        need = np.zeros((self.slices, 2), dtype=bool)
        need[:, 1] = True
        need[:, 0] = has.numpy()
        return need

    def mask(self, h, w, device):
        return None

    def certified_set(self, distance):
        """Factors [max(low, 1 − δ), min(high, 1 + δ)]; radius the smaller of their distances
        from 1 (of the one side when ``low`` or ``high`` is 1), as :func:`float_radius` writes
        it."""
        lo, hi = max(self.low, 1.0 - distance), min(self.high, 1.0 + distance)
        return float_radius(lo if self.low != 1.0 else None,
                            hi if self.high != 1.0 else None), lo, hi

    def train_range(self):
        return self.train_low, self.train_high

    def check_shape(self, shape):
        """Refuse slices too wide for the bound at this image size, or holding two factors at
        which pixels cross the border (``scaling_bound.check_slices``)."""
        scaling_bound.check_slices(self.edges(), tuple(shape)[-2:])
