"""Soundness of TSS's resolvable certificates (``stats/tss.py``): classifiers whose smoothed
probability at every transformed input is computable exactly (closed forms, one-dimensional
quadrature, sums over integer cells), checked over fine grids of the certified parameters,
each test with an unsound control that it catches.

* brightness / contrast: the mean-threshold classifier f(y) = [mean(y) > t] (Gauss–Hermite over
  the log-contrast), and the worst case over *every* classifier (Neyman–Pearson between the
  smoothing law and the attacked one; a 2-pixel image already realizes any function of (k, b));
* blur: a periodic 1-D signal blurred in the Fourier domain (the heat semigroup: blurring by
  variances a then r is blurring by a + r, checked, not assumed) read at one pixel, and random
  unions of intervals of the blur variance;
* translation: an image with one bright pixel, shifted cyclically as the authors'
  ``Translational.proc``, classified by where that pixel lands; the smoothed probability sums
  the Gaussian mass of the integer cells that rounding maps to each shift.
"""

import math

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss
from scipy.optimize import brentq
from scipy.special import ndtr, ndtri
from scipy.stats import norm

from smoothcert.stats.tss import (
    BLUR_DISTRIBUTIONS,
    blur_radius,
    brightness_radius,
    brightness_shift_bound,
    contrast_range,
    translation_radius,
)

INSIDE = 1 - 1e-9  # points of a grid that reach the certified set's edge stay just inside
NODES, WEIGHTS = hermegauss(80)  # ∫ φ(z)·F(z) dz ≈ Σ w F(z), the weights over √(2π)
WEIGHTS = WEIGHTS / math.sqrt(2 * math.pi)

# --- brightness and contrast -------------------------------------------------------------


def mean_threshold_mass(m, t, c, b1, sigma_k, sigma_b):
    """P(f(e^k(x' + b)) = A) for f(y) = [mean(y) > t] at x' = c·(x + b₁), mean(x) = m:
    mean(e^k(x' + b)) = e^k(c(m + b₁) + b) > t ⇔ b > t·e^{−k} − c(m + b₁); Gauss–Hermite in k."""
    inner = ndtr((c * (m + b1) - t * np.exp(-sigma_k * NODES)) / sigma_b)
    return float(WEIGHTS @ inner)


MEAN_CASES = [  # (m, t, sigma_k, sigma_b, k_low, k_high)
    (0.3, 0.0, 0.2, 0.2, 1.0, 1.0),  # a half-plane in b: Cohen's bound is tight here
    (0.5, 0.0, 0.2, 0.2, 0.8, 1.2),
    (0.5, 0.2, 0.2, 0.2, 0.9, 1.1),
    (0.6, 0.1, 0.3, 0.3, 0.8, 1.0),
    (0.8, 0.3, 0.1, 0.4, 0.95, 1.1),
    (0.4, -0.2, 0.2, 0.2, 0.9, 1.1),
]


@pytest.mark.parametrize("m, t, sigma_k, sigma_b, k_low, k_high", MEAN_CASES)
def test_brightness_keeps_the_mean_threshold_classifier(m, t, sigma_k, sigma_b, k_low, k_high):
    p = mean_threshold_mass(m, t, 1.0, 0.0, sigma_k, sigma_b)
    radius = brightness_radius(p, sigma_k, sigma_b, k_low, k_high)
    assert radius > 0.01
    for c in np.linspace(k_low, k_high, 21):
        for b1 in radius * INSIDE * np.linspace(-1.0, 1.0, 41):
            assert mean_threshold_mass(m, t, c, b1, sigma_k, sigma_b) > 0.5, (c, b1)
    if (t, k_low, k_high) == (0.0, 1.0, 1.0):  # control: 5 % more brightness is caught
        assert mean_threshold_mass(m, t, 1.0, -1.05 * radius, sigma_k, sigma_b) < 0.5


@pytest.mark.parametrize("m, t, sigma_k, sigma_b", [(0.5, 0.2, 0.2, 0.2), (0.6, 0.3, 0.3, 0.3),
                                                    (0.4, -0.2, 0.2, 0.2)])
def test_contrast_keeps_the_mean_threshold_classifier(m, t, sigma_k, sigma_b):
    p = mean_threshold_mass(m, t, 1.0, 0.0, sigma_k, sigma_b)
    lo, hi = contrast_range(p, sigma_k, sigma_b)
    assert lo < 0.95 and hi > 1.05
    for c in np.linspace(lo, hi, 201):
        assert mean_threshold_mass(m, t, c, 0.0, sigma_k, sigma_b) > 0.5, c


def worst_mass(p, k1, b1, sigma_k, sigma_b, n=20001):
    """min Q(A) over every set A of the (k, b)-plane with P(A) = p, P = N(0, diag(σ_k², σ_b²)),
    Q = N((k₁, b₁), diag(σ_k², e^{−2k₁}σ_b²)) (the attacked smoothing law). Neyman–Pearson:
    A = {log dQ/dP ≤ t}; in u = k/σ_k, v = b/σ_b, log dQ/dP = μ·w − μ²/2 + g(v), w = ±u,
    μ = |k₁|/σ_k, so for each v the set is a half-line in w (a normal CDF), and the v-integral
    is a trapezoid rule on 20001 points (error below 1e-8 against 400001 points)."""
    if k1 == 0.0:  # a pure shift of b: Cohen's half-plane
        return float(ndtr(ndtri(p) - abs(b1) / sigma_b))
    mu, beta, s = abs(k1) / sigma_k, b1 / sigma_b, math.exp(-k1)
    v = np.linspace(min(-12.0, beta - 12 * s), max(12.0, beta + 12 * s), n)
    h = v[1] - v[0]
    wp = np.exp(-v * v / 2) / math.sqrt(2 * math.pi) * h
    wq = np.exp(-(((v - beta) / s) ** 2) / 2) / (s * math.sqrt(2 * math.pi)) * h
    g = v * v / 2 - (v - beta) ** 2 / (2 * s * s) - math.log(s)

    def cut(t):
        return (t - g) / mu + mu / 2

    t = brentq(lambda t: float(wp @ ndtr(cut(t))) - p, -1e4, 1e4, xtol=1e-13, rtol=1e-15)
    return float(wq @ ndtr(cut(t) - mu))


def naive_contrast_bound(p, sigma_k):
    """Control: Cohen along k alone, forgetting that the contrast rescales b's noise."""
    return sigma_k * norm.ppf(p)


@pytest.mark.parametrize("sigma_k, sigma_b", [(0.2, 0.2), (0.3, 0.3), (1.0, 0.2)])
def test_brightness_contrast_hold_against_every_classifier(sigma_k, sigma_b):
    for p in [0.75, 0.9, 0.99]:
        for k1 in [-0.2, -0.05, 0.0, 0.05, 0.2]:
            b = brightness_shift_bound(p, k1, sigma_k, sigma_b)
            if b > 0:
                assert worst_mass(p, k1, b * INSIDE, sigma_k, sigma_b) > 0.5, (p, k1, b)
                prefix = b * max(math.exp(-k1), 1.0)  # their e^{−k} before Bibi's fix
                assert worst_mass(p, k1, prefix * INSIDE, sigma_k, sigma_b) > 0.5
        lo, hi = contrast_range(p, sigma_k, sigma_b)
        for k1 in [math.log(lo), math.log(hi)]:
            assert worst_mass(p, k1, 0.0, sigma_k, sigma_b) > 0.5, (p, k1)
        # controls, both caught: 5 % more brightness at contrast 1; Cohen along k alone
        assert worst_mass(p, 0.0, 1.05 * brightness_radius(p, sigma_k, sigma_b),
                          sigma_k, sigma_b) < 0.5
        assert worst_mass(p, naive_contrast_bound(p, sigma_k), 0.0, sigma_k, sigma_b) < 0.5
        assert worst_mass(p, -naive_contrast_bound(p, sigma_k), 0.0, sigma_k, sigma_b) < 0.5


# --- Gaussian blur -----------------------------------------------------------------------


def cdf(distribution, scale, x):
    """P(r < x) for the blur-variance law r ~ D (``blur_radius``'s three)."""
    x = np.maximum(np.asarray(x, dtype=float), 0.0)
    if distribution == "uniform":
        return np.minimum(x / scale**2, 1.0)
    if distribution == "exponential":
        return -np.expm1(-x / scale)
    return 2 * ndtr(x / scale) - 1


N = 64
FREQ = np.fft.rfftfreq(N) * 2 * math.pi  # angular frequency per pixel
SIGNAL = 0.3 + np.cos(2 * math.pi * np.arange(N) / N) + 0.6 * np.cos(4 * math.pi * np.arange(N) / N)


def blur(x, variance):
    """A periodic Gaussian blur of kernel variance ``variance`` px² (the heat equation on the
    circle: each Fourier coefficient times exp(−variance·ω²/2)), exactly composable."""
    return np.fft.irfft(np.fft.rfft(x) * np.exp(-variance * FREQ**2 / 2), n=N)


def classify(y, tau):
    return y[0] > tau  # class A while the peak has not blurred below τ


def smoothed_blur(distribution, scale, tau, added):
    """P_r(f(blur(blur(x, added), r)) = A), r ~ D: the variance where the twice-blurred peak
    crosses τ found literally (the peak decreases with the blur), then D's mass below it."""
    attacked = blur(SIGNAL, added)
    if not classify(attacked, tau):
        return 0.0
    edge = brentq(lambda r: blur(attacked, r)[0] - tau, 0.0, 1e4, xtol=1e-12)
    return float(cdf(distribution, scale, edge))


@pytest.mark.parametrize("distribution, scale", [("uniform", 2.0), ("uniform", 5.0),
                                                 ("exponential", 2.0), ("exponential", 10.0),
                                                 ("folded-gaussian", 2.0),
                                                 ("folded-gaussian", 10.0)])
def test_blur_keeps_a_blurred_signal_classifier(distribution, scale):
    assert np.allclose(blur(blur(SIGNAL, 0.7), 1.1), blur(SIGNAL, 1.8), atol=1e-13)
    for p_target in [0.6, 0.9, 0.99]:
        # τ: the peak at the variance below which D has mass p_target, so that P(A) = p_target
        crossing = brentq(lambda x, p=p_target: cdf(distribution, scale, x) - p, 0.0, 1e4)
        tau = blur(SIGNAL, crossing)[0]
        p = smoothed_blur(distribution, scale, tau, 0.0)
        assert p == pytest.approx(p_target, abs=1e-9)
        radius = blur_radius(p, distribution, scale)
        for added in radius * INSIDE * np.linspace(0.0, 1.0, 11):
            assert smoothed_blur(distribution, scale, tau, added) > 0.5, (p, added)
        # control: 5 % more blur is caught
        assert smoothed_blur(distribution, scale, tau, 1.05 * radius) < 0.5


def union_mass(distribution, scale, starts, ends, added=0.0):
    """D's mass of ∪[starts_i, ends_i) after the blur variance grows by ``added``."""
    shifted = (cdf(distribution, scale, ends - added)
               - cdf(distribution, scale, starts - added))
    return float(np.sum(shifted))


@pytest.mark.parametrize("distribution", BLUR_DISTRIBUTIONS)
def test_blur_holds_for_unions_of_variance_intervals(distribution):
    rng = np.random.default_rng(7)
    scale = 3.0
    top = {"uniform": scale**2, "exponential": 8 * scale, "folded-gaussian": 4 * scale}
    caught = 0
    for trial in range(300):
        if trial == 0:  # the tight set {r < c}, for the control
            edges = np.array([0.0, 0.8 * top[distribution]])
        else:
            edges = np.sort(rng.uniform(0.0, top[distribution], 2 * rng.integers(1, 5)))
        starts, ends = edges[0::2], edges[1::2]
        p = union_mass(distribution, scale, starts, ends)
        if p <= 0.5:
            continue
        radius = blur_radius(p, distribution, scale)
        for added in radius * INSIDE * np.linspace(0.0, 1.0, 21):
            assert union_mass(distribution, scale, starts, ends, added) > 0.5 - 1e-12, edges
        caught += union_mass(distribution, scale, starts, ends, 1.05 * radius) < 0.5
    assert caught >= 1  # control: 5 % more blur breaks the tight set


# --- translation -------------------------------------------------------------------------


def their_shift(image, dx, dy):
    """The authors' ``Translational.proc`` (cyclic), on an (H, W) array."""
    h, w = image.shape
    nx, ny = round(dx) % h, round(dy) % w
    out = np.zeros_like(image)
    if nx > 0 and ny > 0:
        out[-nx:, -ny:], out[-nx:, :-ny] = image[:nx, :ny], image[:nx, ny:]
        out[:-nx, -ny:], out[:-nx, :-ny] = image[nx:, :ny], image[nx:, ny:]
    elif ny > 0:
        out[:, -ny:], out[:, :-ny] = image[:, :ny], image[:, ny:]
    elif nx > 0:
        out[-nx:, :], out[:-nx, :] = image[:nx, :], image[nx:, :]
    else:
        out = image
    return out


def cell_masses(sigma, size):
    """P(round(δ) ≡ i mod size) for δ ~ N(0, σ²), i = 0..size−1 (cells beyond 20σ: < 1e-80)."""
    span = int(math.ceil(20 * sigma))
    cells = np.arange(-span, span + 1)
    mass = ndtr((cells + 0.5) / sigma) - ndtr((cells - 0.5) / sigma)
    return np.bincount(cells % size, weights=mass, minlength=size)


def smoothed_map(labels, sigma):
    """G[a] = P(f(T_{round(δ)}(T_a x)) = A) for every cyclic shift a, from the class of each
    shift of x (``labels[u, v]`` = f(T_(u,v) x)): T_δ∘T_a = T_{δ+a} (checked below)."""
    h, w = labels.shape
    weights = np.outer(cell_masses(sigma, h), cell_masses(sigma, w))
    out = np.empty((h, w))
    for a0 in range(h):
        for a1 in range(w):
            out[a0, a1] = np.sum(weights * np.roll(labels, (-a0, -a1), axis=(0, 1)))
    return out


def shifts_within(radius, h, w):
    """Integer shifts with ‖a‖₂ < radius, as cyclic indices."""
    reach = int(math.ceil(radius))
    for a0 in range(-reach, reach + 1):
        for a1 in range(-reach, reach + 1):
            if math.hypot(a0, a1) < radius:
                yield a0 % h, a1 % w


def signed(index, size):
    return (index + size // 2) % size - size // 2  # a cyclic index in [−size/2, size/2)


def translation_sets(size, rng):
    u, v = np.meshgrid(signed(np.arange(size), size), signed(np.arange(size), size),
                       indexing="ij")
    yield "rows", -u <= 10  # the bright pixel lands at −shift: a half-plane of shifts
    yield "diagonal", -(u + v) <= 12
    yield "disk", (u**2 + v**2) <= 40
    for _ in range(3):  # blobs: a disk and random pixels
        yield "blob", ((u - 1) ** 2 + v**2 <= 30) | (rng.random((size, size)) < 0.3)


@pytest.mark.parametrize("sigma, size", [(3.0, 32), (10.0, 64)])
def test_translation_keeps_a_bright_pixel_classifier(sigma, size):
    rng = np.random.default_rng(3)
    image = np.zeros((size, size))
    image[0, 0] = 1.0
    for a, b in [((3, 5), (7, -2)), ((-4, 30), (1, 1))]:  # shifting composes (their rounding)
        once = their_shift(their_shift(image, *a), *b)
        assert np.array_equal(once, their_shift(image, a[0] + b[0], a[1] + b[1]))
    caught = 0
    for name, region in translation_sets(size, rng):
        labels = np.zeros((size, size), dtype=bool)  # f(T_(u,v) x): where the pixel lands
        for u in range(size):
            for v in range(size):
                pos = np.unravel_index(np.argmax(their_shift(image, u, v)), image.shape)
                labels[u, v] = region[pos]
        smoothed = smoothed_map(labels.astype(float), sigma)
        p = smoothed[0, 0]
        radius = translation_radius(min(p, 1.0), sigma)
        for a in shifts_within(radius, size, size):
            assert smoothed[a] > 0.5, (name, a, radius)
        if name == "rows" and sigma == 3.0:  # control: 5 % farther reaches shift (−11, 0)
            assert radius < 11.0 < 1.05 * radius
            caught += any(smoothed[a] < 0.5 for a in shifts_within(1.05 * radius, size, size))
    assert caught == (1 if sigma == 3.0 else 0)
