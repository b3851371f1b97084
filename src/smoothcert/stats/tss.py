"""Certificates of TSS's resolvable semantic transformations, from a lower bound p of
P(f(φ(x; θ)) = A) under the smoothing distribution of the transformation's parameters θ
(Li, Weber, Xu, Rimanic, Kailkhura, Xie, Zhang & Li, CCS 2021, "TSS: Transformation-Specific
Smoothing for Robustness Certification"; authors' code AI-secure/semantic-randomized-smoothing,
``semantic/transformers.py`` and ``semantic/transforms.py``; golden numbers from it in
tests/fixtures/tss/).

A transformation φ is *resolvable* when attacking then smoothing is smoothing over other
parameters: φ(φ(x; α); θ) = φ(x; γ(α, θ)). The smoothed classifier at the attacked input then
smooths f(φ(x; ·)) over the law Q_α of γ(α, θ) instead of the law P of θ, and class A is kept
whenever every set of P-mass ≥ p has Q_α-mass > ½ (Neyman–Pearson; the paper's theorem for
resolvable transformations, TSS-R, and its corollary per transformation; the paper was not at
hand here and its theorem numbers differ between versions, so the statements below are derived
from that argument and the authors' functions, and checked in tests/stats/test_tss_*.py).
One function each:

* ``brightness_shift_bound`` — authors' ``BrightnessTransformer.calc_b_bound``;
* ``brightness_radius`` — ``BrightnessTransformer.calc_radius`` after ``set_brightness_scale``;
* ``contrast_range``, ``contrast_radius`` — ``ContrastTransformer.calc_radius`` (its bisection);
* ``blur_radius`` — ``GaussianTransformer`` (uniform), ``ExpGaussianTransformer`` (exponential),
  ``FoldGaussianTransformer`` (folded Gaussian) ``.calc_radius``;
* ``translation_radius`` — ``TranslationTransformer.calc_radius`` (cyclic, ``Translational``);
* ``sampled_l2_radius`` — ``RotationBrightnessNoiseTransformer.calc_radius`` (and the resize
  one): the ℓ2 radius that must cover the interpolation error of rotation and scaling.

Brightness and contrast. φ(x; k, b) = e^k·(x + b) (their ``BrightnessScale`` after
``BrightnessShift``; images in ℝ^d, nothing clipped: the authors' answer in their issue #7),
smoothed over k ~ N(0, σ_k²), b ~ N(0, σ_b²). Since φ(φ(x; k₁, b₁); k, b) =
φ(x; k₁ + k, b₁ + e^{−k₁}·b), Q = N((k₁, b₁), diag(σ_k², e^{−2k₁}σ_b²)). The bound chains two
Neyman–Pearson steps, as their code does: (i) the scale of b changes from σ_b to e^{−k₁}σ_b
(the worst set is |b| ≥ t for k₁ ≥ 0, |b| ≤ t for k₁ < 0), leaving a mass of at least
p_B = 2Φ̄(e^{k₁}Φ⁻¹(1 − p/2)) (k₁ ≥ 0), 2Φ(e^{k₁}Φ⁻¹(½ + p/2)) − 1 (k₁ < 0); (ii) the mean moves
by (k₁, b₁) at the covariance diag(σ_k², e^{−2k₁}σ_b²) (Cohen's theorem in the Mahalanobis
norm): A is kept when (k₁/σ_k)² + (e^{k₁}b₁/σ_b)² < Φ⁻¹(p_B)², i.e.
|b₁| < e^{−k₁}·σ_b·√(Φ⁻¹(p_B)² − (k₁/σ_k)²).

Their code's history, and which version this follows. First σ_b·√(margin) (their comment:
"origin, but I now think it's wrong because of eq.15": for k₁ > 0 it exceeds what step (ii)
justifies), then e^{−k₁}·σ_b·√(margin), and since commit 7a7df33 (Feb 2021, "Thanks to the bug
pointed out by Adel Bibi") min(e^{−k₁}, 1)·σ_b·√(margin), their current code, which we
follow: equal to the chain above for k₁ ≥ 0 and below it for k₁ < 0, so sound wherever the
chain is. It also makes the bound non-increasing in |k₁| on each side of 0 (for k₁ ≥ 0 every
factor decreases; for k₁ < 0 p_B and the margin do), which the minimum over a contrast
interval's two ends (``brightness_radius``) and the bisection (``contrast_range``) need.
(tests/stats/test_tss_soundness.py checks the chain against the exact Neyman–Pearson worst
case over every classifier; there the e^{−k₁} version is sound too, only less conservative.)

Floating point. Every quantity is computed without cancellation: Φ⁻¹(1 − p/2), Φ⁻¹(½ + p/2)
as upper-tail quantiles of p/2 and (1 − p)/2 (exact in float64), 1 − p_B as erf or erfc
(never 1 − a rounded p_B), Φ⁻¹(p_B) as the upper quantile of 1 − p_B; 1 − p, p − ½ and
2 − 2p are exact for p ∈ [½, 1] (Sterbenz). The one subtraction that can cancel,
Φ⁻¹(p_B)² − (k₁/σ_k)², is lowered by 64 ulps of its terms (``_MARGIN_ULPS``) before its root,
so a margin that rounds up near 0 certifies nothing rather than a spurious shift (likewise
the folded Gaussian's Φ⁻¹(½ + p/2) − Φ⁻¹(¾), by 4 ulps). What remains is the last-ulp rounding
of SciPy's quantiles, exp, log and the products (a relative error of a few 1e-16, not rounded
outward, as no radius of smoothcert's noises is). Against a 50-digit reference on the golden
grid no value here is above the exact one by more than 2e-16 (relative); the authors' are off by
up to 2.5e-12 (their rounded 1 − p/2, ½ + p/2 and 2 − 2Φ(·) before Φ⁻¹, at p = 0.99999).
"""

from __future__ import annotations

import math
import numbers
import sys

from scipy import special

from ..errors import (
    SmoothcertError,
    check_in_range,
    check_nonnegative,
    check_positive_finite,
    unknown_name,
)

BLUR_DISTRIBUTIONS = ("uniform", "exponential", "folded-gaussian")
CONTRAST_TOL = 1e-5  # the authors' EPS of ContrastTransformer.calc_radius (log-contrast units)
_MARGIN_ULPS = 64 * sys.float_info.epsilon
_SQRT_HALF = math.sqrt(0.5)
_Q3 = -float(special.ndtri(0.25))  # Φ⁻¹(¾)


def _upper_quantile(q: float) -> float:
    """Φ̄⁻¹(q) = Φ⁻¹(1 − q) without forming 1 − q (accurate for tiny q; +inf at q = 0)."""
    return -float(special.ndtri(q))


def _check_finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise SmoothcertError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _check_p(p_lower: float) -> float:
    return check_in_range("p_lower", p_lower, 0.0, 1.0)


def _check_contrasts(k_low: float, k_high: float) -> tuple[float, float]:
    """The contrast interval [k_low, k_high] as factors: 0 < k_low ≤ 1 ≤ k_high < ∞."""
    k_low = check_in_range("k_low (the smallest contrast factor)", k_low, 0.0, 1.0)
    k_high = check_positive_finite("k_high (the largest contrast factor)", k_high)
    if k_low <= 0.0 or k_high < 1.0:
        raise SmoothcertError(f"the contrast interval must hold 1 with 0 < k_low <= 1 <= "
                              f"k_high, got [{k_low!r}, {k_high!r}]")
    return k_low, k_high


def _lowered_margin(z: float, t: float) -> float:
    """z² − t², lowered by 64 ulps of its terms (``_MARGIN_ULPS``): the one subtraction that
    can cancel, so that a margin rounding up near 0 certifies nothing rather than a spurious
    radius (module docstring)."""
    return z * z - t * t - _MARGIN_ULPS * (z * z + t * t + 1.0)


def _scaled_b_tail(p: float, log_k: float) -> float:
    """1 − p_B: the worst-case mass outside class A once b's scale becomes e^{−k}·σ_b
    (step (i) of the module docstring), for p > ½."""
    if log_k == 0.0:
        return 1.0 - p  # no change of scale; exact
    if log_k > 0.0:  # narrower b: the worst set is |b| ≥ t, t = σ_b·Φ⁻¹(1 − p/2)
        y = math.exp(log_k) * _upper_quantile(p / 2.0)
        return float(special.erf(y * _SQRT_HALF))  # 2Φ(y) − 1
    y = math.exp(log_k) * _upper_quantile((1.0 - p) / 2.0)  # wider b: |b| ≤ t, Φ⁻¹(½ + p/2)
    return float(special.erfc(y * _SQRT_HALF))  # 2Φ̄(y)


def brightness_shift_bound(p_lower: float, log_k: float, sigma_k: float,
                           sigma_b: float) -> float:
    """The largest certified brightness shift at one contrast (authors' ``calc_b_bound``).

    Smoothing: k ~ N(0, σ_k²) (log-contrast), b ~ N(0, σ_b²) (brightness, pixel units), the
    base classifier f sees e^k·(x + b). If P(f(e^k(x + b)) = A) ≥ ``p_lower``, then the smoothed
    classifier returns A at e^{log_k}·(x + b₁) for every shift |b₁| < the returned value:
    σ_b·min(e^{−log_k}, 1)·√(Φ⁻¹(p_B)² − (log_k/σ_k)²), p_B the mass left after b's scale
    becomes e^{−log_k}σ_b (module docstring; Bibi's fix included). 0.0 when nothing is
    certified (p_lower ≤ ½, or the margin is ≤ 0, or σ_k = 0 and log_k ≠ 0: the contrast
    is then not smoothed, where the authors' code divides by zero); +inf at p_lower = 1.
    At log_k = 0 it is σ_b·Φ⁻¹(p_lower): Cohen's radius in one dimension.
    """
    p = _check_p(p_lower)
    log_k = _check_finite("log_k", log_k)
    sigma_k = check_nonnegative("sigma_k", sigma_k)
    sigma_b = check_positive_finite("sigma_b", sigma_b)
    if p <= 0.5 or (sigma_k == 0.0 and log_k != 0.0):
        return 0.0
    tail = _scaled_b_tail(p, log_k)
    if tail >= 0.5:
        return 0.0
    z = _upper_quantile(tail)  # Φ⁻¹(p_B)
    if math.isinf(z):
        return math.inf
    if log_k == 0.0:
        return sigma_b * z
    margin = _lowered_margin(z, log_k / sigma_k)
    if margin <= 0.0:
        return 0.0
    return sigma_b * min(math.exp(-log_k), 1.0) * math.sqrt(margin)


def brightness_radius(p_lower: float, sigma_k: float, sigma_b: float, k_low: float = 1.0,
                      k_high: float = 1.0) -> float:
    """The certified brightness shift for every contrast factor in [k_low, k_high] (authors'
    ``BrightnessTransformer.calc_radius`` after ``set_brightness_scale(k_low, k_high)``).

    With the smoothing of :func:`brightness_shift_bound` and P(f = A) ≥ ``p_lower``, the
    smoothed classifier returns A at c·(x + b) for every contrast c ∈ [k_low, k_high] and every
    brightness shift |b| < the returned value R (pixel units), R = the smaller bound at ln k_low
    and ln k_high: the bound is non-increasing in |ln c| on each side of 0, so its minimum over
    the interval is at an end. With k_low = k_high = 1 (brightness only) R = σ_b·Φ⁻¹(p_lower)
    for any σ_k. 0.0 when nothing is certified.
    """
    k_low, k_high = _check_contrasts(k_low, k_high)
    return min(brightness_shift_bound(p_lower, math.log(k_low), sigma_k, sigma_b),
               brightness_shift_bound(p_lower, math.log(k_high), sigma_k, sigma_b))


def _bisect_side(inner: float, outer: float, certified, tol: float) -> float:
    """The authors' bisection of one side, from ``inner`` (ln 1 = 0) toward ``outer``: the last
    point where ``certified`` held (``inner`` itself when none did), within ``tol`` of where it
    stops holding. It keeps the verified end, never the midpoint or the unverified end."""
    while abs(outer - inner) > tol:
        mid = (inner + outer) / 2.0
        if mid in (inner, outer):  # adjacent floats: a tol below their spacing ends here
            break
        if certified(mid):
            inner = mid
        else:
            outer = mid
    return inner


def contrast_range(p_lower: float, sigma_k: float, sigma_b: float, k_low: float = 0.1,
                   k_high: float = 10.0, tol: float = CONTRAST_TOL) -> tuple[float, float]:
    """The certified interval [lo, hi] of contrast factors (authors' ``ContrastTransformer.
    calc_radius`` after ``set_contrast_scale(k_low, k_high)``; their EPS is ``tol``).

    With the smoothing of :func:`brightness_shift_bound` and P(f = A) ≥ ``p_lower``, the
    smoothed classifier returns A at c·x for every contrast factor c ∈ [lo, hi] ⊂
    [k_low, k_high]. As theirs: bisection in ln c on [ln k_low, 0] and [0, ln k_high] until
    the bracket is ≤ ``tol`` wide, a point counting as certified when its brightness bound
    exceeds ``tol`` (a slack far above the rounding of the bound and of e^{ln c}); lo and hi
    are the last points verified, so [lo, hi] holds only certified contrasts (the bound is
    monotone in |ln c|), at most ``tol`` in ln c inside where the bound reaches ``tol``. The
    arithmetic is theirs, so the interval is theirs (equal on the golden grid; it could differ
    by one step only if their bound and ours, rounded differently, fell on two sides of ``tol``
    at a midpoint, and ours is then still verified). (1.0, 1.0) when p_lower ≤ ½.
    """
    p = _check_p(p_lower)
    k_low, k_high = _check_contrasts(k_low, k_high)
    tol = check_positive_finite("tol", tol)
    check_nonnegative("sigma_k", sigma_k)
    check_positive_finite("sigma_b", sigma_b)
    if p <= 0.5:
        return 1.0, 1.0

    def certified(log_c: float) -> bool:
        return brightness_shift_bound(p, log_c, sigma_k, sigma_b) > tol

    low = _bisect_side(0.0, math.log(k_low), certified, tol)
    high = _bisect_side(0.0, math.log(k_high), certified, tol)
    return math.exp(low), math.exp(high)


def contrast_radius(p_lower: float, sigma_k: float, sigma_b: float, k_low: float = 0.1,
                    k_high: float = 10.0, tol: float = CONTRAST_TOL) -> float:
    """The certified contrast radius min(1 − lo, hi − 1) of :func:`contrast_range` (authors'
    ``ContrastTransformer.calc_radius``): the smoothed classifier returns A at c·x for every
    contrast factor |c − 1| ≤ the returned value (a dimensionless factor). 0.0 when
    p_lower ≤ ½."""
    lo, hi = contrast_range(p_lower, sigma_k, sigma_b, k_low, k_high, tol)
    return min(1.0 - lo, hi - 1.0)


def blur_radius(p_lower: float, distribution: str, scale: float) -> float:
    """The certified Gaussian-blur strength, as a kernel *variance* in pixels² (authors'
    ``GaussianTransformer``, ``ExpGaussianTransformer``, ``FoldGaussianTransformer``).

    Blur: φ(x; α) = x ∗ G_α, a Gaussian kernel of variance α px² (standard deviation √α px:
    their ``cv2.GaussianBlur(x, (0, 0), sqrt(r2))``, reflect-101 borders). Smoothing draws the
    kernel variance r ~ D; since G_α ∗ G_r = G_{α+r}, the smoothed classifier at x ∗ G_α smooths
    over α + r. If P(f(x ∗ G_r) = A) ≥ ``p_lower``, it returns A at x ∗ G_α for every added
    variance 0 ≤ α < R (blur only adds: α ≥ 0). ``distribution`` and ``scale`` (their
    ``noise_sd``) name D, and R is the Neyman–Pearson bound between D and D shifted by α
    (tight: the classifier {r < c} attains it):

    * "uniform": r ~ U[0, scale²] (their ``Gaussian``), R = scale²·(p − ½);
    * "exponential": r ~ Exp with mean λ = scale (rate 1/λ; their ``ExpGaussian``),
      R = −λ·ln(2 − 2p);
    * "folded-gaussian": r ~ |N(0, scale²)| (their ``FoldGaussian``),
      R = scale·(Φ⁻¹(½ + p/2) − Φ⁻¹(¾)).

    0.0 when p_lower ≤ ½ (where their code returns −0.0 or 0); +inf at p_lower = 1 for the
    exponential and folded Gaussian. The certificate holds for a blur that composes exactly
    (G_α ∗ G_r = G_{α+r}: the continuous, or a periodic Fourier-domain, Gaussian); OpenCV's
    truncated discrete kernel composes only approximately.
    """
    p = _check_p(p_lower)
    if distribution not in BLUR_DISTRIBUTIONS:
        raise unknown_name("blur distribution", distribution, BLUR_DISTRIBUTIONS)
    scale = check_positive_finite("scale", scale)
    if p <= 0.5:
        return 0.0
    if distribution == "uniform":
        return scale ** 2.0 * (p - 0.5)
    if distribution == "exponential":
        return -scale * math.log(2.0 - 2.0 * p) if p < 1.0 else math.inf  # 2 − 2p: exact
    quantile = _upper_quantile((1.0 - p) / 2.0)  # Φ⁻¹(½ + p/2), from an exact argument
    if math.isinf(quantile):
        return math.inf
    # The difference cancels as p → ½: lowered by 4 ulps of its larger term (the rounding of
    # the two quantiles and of the subtraction), so that it cannot round up.
    return max(scale * (quantile - _Q3 - 4.0 * sys.float_info.epsilon * quantile), 0.0)


def translation_radius(p_lower: float, sigma: float) -> float:
    """The certified translation, the ℓ2 norm of an integer pixel shift (authors'
    ``TranslationTransformer.calc_radius``: σ·Φ⁻¹(p)).

    Translation: their ``Translational``, a cyclic shift by (round(dx), round(dy)) pixels
    (what leaves one side comes in at the other), smoothed over (dx, dy) ~ N(0, σ²I₂) (σ in
    pixels). For an integer shift a, round(δ + a) = round(δ) + a (but on a null set), so the
    smoothed classifier at the shifted image smooths over N(a, σ²I₂), and Cohen's theorem in
    ℝ² applies: if P(f = A) ≥ ``p_lower``, the smoothed classifier returns A at every cyclic
    shift (dx, dy) ∈ ℤ² of the image with √(dx² + dy²) < the returned value (shifts equal
    modulo the image size are one image: any representative within it is certified).
    0.0 when p_lower ≤ ½ (their code returns σΦ⁻¹(p) < 0 there); +inf at p_lower = 1.
    """
    p = _check_p(p_lower)
    sigma = check_positive_finite("sigma", sigma)
    if p <= 0.5:
        return 0.0
    return sigma * _upper_quantile(1.0 - p)


def sampled_l2_radius(p_lower: float, sigma: float, sigma_b: float = 0.0,
                      b: float = 0.0) -> float:
    """The ℓ2 radius left for the interpolation error of a sampled transformation (rotation,
    scaling; authors' ``RotationBrightnessNoiseTransformer.calc_radius`` and
    ``ResizeBrightnessNoiseTransformer.calc_radius`` after ``set_brightness_shift(b)``).

    Smoothing: ε ~ N(0, σ²I) on the pixels and, with σ_b > 0, a brightness shift β ~ N(0, σ_b²)
    added to every pixel. If P(f(z + ε + β) = A) ≥ ``p_lower`` at a sample z, the smoothed
    classifier returns A at z + δ + b₁ for every ‖δ‖₂ < R and |b₁| ≤ ``b``, with
    R = σ·√(Φ⁻¹(p)² − (b/σ_b)²): Cohen's theorem in the Mahalanobis norm of the joint Gaussian
    of (ε, β), ‖δ‖²/σ² + b₁²/σ_b² < Φ⁻¹(p)². σ_b = 0 (no brightness smoothing; then b must
    be 0) gives σΦ⁻¹(p). 0.0 when nothing is certified; +inf at p_lower = 1. The margin
    Φ⁻¹(p)² − (b/σ_b)² is lowered by 64 ulps of its terms, as :func:`brightness_shift_bound`'s.
    """
    p = _check_p(p_lower)
    sigma = check_positive_finite("sigma", sigma)
    sigma_b = check_nonnegative("sigma_b", sigma_b)
    b = check_nonnegative("b", b)
    if sigma_b == 0.0 and b != 0.0:
        raise SmoothcertError("a brightness shift b > 0 is certified only with brightness "
                              "smoothing: give sigma_b > 0")
    if p <= 0.5:
        return 0.0
    z = _upper_quantile(1.0 - p)  # Φ⁻¹(p), from the exact 1 − p
    if math.isinf(z):
        return math.inf
    if b == 0.0:
        return sigma * z
    margin = _lowered_margin(z, b / sigma_b)
    return sigma * math.sqrt(margin) if margin > 0.0 else 0.0
