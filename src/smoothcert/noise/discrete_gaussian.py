"""A noise that keeps the certificate sound in floating point: the discretized Gaussian on the
8-bit grid (Voráček & Hein, "Sound Randomized Smoothing in Floating-Point Arithmetic", ICLR
2023; code: vvoracek/Sound-Randomized-Smoothing, ``certifier.py``).

Why float smoothing is not sound: CERTIFY's guarantee is about E f(x + ε) with ε ~ N(0, σ²I)
real, but what runs is f(fl(x + fl(σ·ε̃))), ε̃ a float. Which floats come out depends on x, not
only on x + ε, so a classifier can tell the noisy inputs of x from those of a point 0.8 away
and the certificate σΦ⁻¹(p) at x (1.26 in the paper) can be false (``tests/noise/test_sound_noise``
builds such a classifier).

The fix, for inputs on the grid {0, 1/255, …, 1} (what an 8-bit image is, and what an attacker
of an 8-bit image can produce): with ε ~ N(0, σ²) real per coordinate, the noisy grid point is

    m + c,   c = round(255·ε) clipped to [−C, C],   C = 255·(k + 1),   k = max(1, ⌊6σ⌋),

the integer m + c clipped to [−255k, 255(k + 1)], and the model sees (m + c)/255 computed in
float32 from that integer. Because m is an integer, m + round(255ε) = round(255·(x + ε)), and the
clip bounds make both clips one clip of that integer: the noisy input is h(x + ε) for the fixed
function h(z) = clip(round(255z))/255 of z = x + ε alone. Smoothing f∘h with the *real* Gaussian
is Cohen et al.'s setting, so their certificate holds exactly — if c is drawn exactly from

    P(c ≤ i) = Φ((2i + 1)/(510σ)),   −C ≤ i < C   (the tails lumped at ±C).

:class:`DiscreteGaussian` draws c exactly, from uniform integers only ("a fair coin"): a uniform
U ∈ [0, 1) is compared with the thresholds Φ((2i + 1)/(510σ)) using its first 31 bits and a
table; the rare draws whose 31 bits do not decide (one in ~10⁶) get more bits, as many as the
comparison with the exact threshold (mpmath, to any precision) needs. No threshold is rounded,
so the noise is the distribution above, not an approximation of it.

Guarantee: if the base classifier f is a function (the same noisy input always gets the same
class) and p_A is a lower bound on P(f(h(x + ε)) = A), then for every x' **on the grid** with
‖x' − x‖₂ < σΦ⁻¹(p_A), the smoothed classifier computed by the same procedure at x' returns A.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

import mpmath
import numpy as np
import torch

from ..errors import SmoothcertError
from .base import Noise, register_noise
from .gaussian import cohen_radius

LEVELS = 255
"""Grid steps per unit: inputs are multiples of 1/255 in [0, 1] (8-bit images)."""
HIGH_BITS = 31
"""Bits of U drawn for every coordinate: the table decides with them but in ~2C/2³¹ of cases."""
BUCKET_BITS = 16
"""The table has 2¹⁶ buckets, indexed by U's first 16 bits."""
EXTRA_BITS = 31
"""Bits added per round to an undecided U (a round is needed with probability ~2⁻³¹)."""
MAX_SIGMA = 16.0
"""The largest σ (pixel units) drawn at. The table holds 2·255·(⌊6σ⌋ + 1) exact thresholds,
each an mpmath Φ at ~110 bits: 0.24 s at σ = 1, 2.9 s at σ = 16 (one core), linear in σ, so
σ = 1000 took minutes and σ = 1e30 never ended. The fast path also needs Φ's thresholds at
most one per 16-bit bucket in the body of Φ, which fails from σ ≈ 100 on (spacing 1/(639σ) <
2⁻¹⁶), and C must fit int32 (σ < 1.4·10⁶). σ = 16 is 16 times the whole pixel range [0, 1],
far beyond any σ smoothing is used at (≤ 1 in the papers)."""


def clip_units(sigma: float) -> int:
    """k = max(1, ⌊6σ⌋) (the authors' ``self.k``): noise beyond ±(k + 1) is lumped there."""
    return max(1, int(6 * sigma))


@functools.lru_cache(maxsize=64)
def threshold(sigma: float, i: int, bits: int) -> int:
    """⌊2^bits · Φ((2i + 1)/(510σ))⌋, exact: mpmath with 64 guard bits beyond ``bits``.

    σ is taken as the exact binary value of the float. The floor could be off only if the
    product were within 2⁻⁶⁴ of an integer; Φ of a rational is irrational, so that needs a
    coincidence of 64 bits.
    """
    with mpmath.workprec(bits + 64 + 16):
        z = mpmath.mpf(2 * i + 1) / (2 * LEVELS * mpmath.mpf(sigma))
        return int(mpmath.floor(mpmath.ldexp(mpmath.ncdf(z), bits)))


@dataclass(frozen=True, eq=False)
class _Table:
    """The 31-bit thresholds t_i = ⌊2³¹·Φ((2i + 1)/(510σ))⌋ (i = −C … C − 1) and, per bucket b
    of U's first 16 bits: ``below[b]``, the thresholds with t_i < b·2¹⁵, and ``single[b]``, the
    t_i of the bucket's one threshold (2³¹ − 1 when it has none). Buckets with two or more
    thresholds lie in the tails: U below ``low`` or from ``high_edge`` on goes the exact way."""

    sigma: float
    limit: int  # C
    high: tuple  # t_i
    below: torch.Tensor  # int32 (2¹⁶,)
    single: torch.Tensor  # int32 (2¹⁶,)
    low: int
    high_edge: int

    @staticmethod
    @functools.lru_cache(maxsize=16)
    def of(sigma: float) -> _Table:
        DiscreteGaussian.check_sigma(sigma)  # a σ far above MAX_SIGMA would never finish
        limit = LEVELS * (clip_units(sigma) + 1)
        high = tuple(threshold(sigma, i, HIGH_BITS) for i in range(-limit, limit))
        width = HIGH_BITS - BUCKET_BITS
        buckets = np.asarray(high, dtype=np.int64) >> width
        edges = np.arange(1 << BUCKET_BITS, dtype=np.int64)
        below = np.searchsorted(buckets, edges, side="left")
        inside = np.searchsorted(buckets, edges, side="right") - below
        single = np.full(1 << BUCKET_BITS, (1 << HIGH_BITS) - 1, dtype=np.int64)
        one = inside == 1
        single[one] = np.asarray(high, dtype=np.int64)[below[one]]
        crowded = np.flatnonzero(inside >= 2)
        middle = (1 << BUCKET_BITS) // 2  # Φ's crowded buckets are its two tails
        low = int(crowded[crowded < middle].max(initial=-1)) + 1
        high_edge = int(crowded[crowded >= middle].min(initial=1 << BUCKET_BITS))
        return _Table(sigma, limit, high, torch.from_numpy(below.astype(np.int32)),
                      torch.from_numpy(single.astype(np.int32)), low << width,
                      high_edge << width)


@functools.lru_cache(maxsize=16)
def _tables_on(table: _Table, device: torch.device) -> tuple:
    return table.below.to(device), table.single.to(device)


def draw_offsets(table: _Table, shape, generator, device) -> torch.Tensor:
    """c ~ the discretized Gaussian (int32, values in [−C, C]), exactly; see the module doc.

    Draws, in order from ``generator``: one 31-bit integer per coordinate, then 31-bit words for
    the undecided coordinates (in index order), one more word per coordinate and round while
    undecided. Reproducible for a given generator state.
    """
    high = torch.empty(shape, dtype=torch.int32, device=device)
    high.random_(0, 1 << HIGH_BITS, generator=generator)
    below, single = _tables_on(table, high.device)
    bucket = (high >> (HIGH_BITS - BUCKET_BITS)).long()
    first = torch.take(single, bucket)
    # thresholds ≤ U, exact unless undecided: a tie in the first bits, or a crowded bucket
    count = torch.take(below, bucket).add_((first < high).int())
    undecided = (first == high).logical_or_(high < table.low)
    undecided = undecided.logical_or_(high >= table.high_edge).view(-1).nonzero().view(-1)
    if undecided.numel():
        exact = _count_exactly(table, high.view(-1)[undecided].tolist(), generator, device)
        count.view(-1)[undecided] = torch.tensor(exact, dtype=count.dtype, device=device)
    return count.sub_(table.limit)


def _count_exactly(table: _Table, highs: list, generator, device) -> list:
    """#{i : t_i ≤ U} for U = (h + V)/2³¹ with the first bits h given and V drawn as needed."""
    counts, open_ = [], []
    for h in highs:
        lo, hi = bisect.bisect_left(table.high, h), bisect.bisect_right(table.high, h)
        counts.append(lo)
        if hi > lo:  # thresholds whose first 31 bits equal h: U's next bits decide
            open_.append((len(counts) - 1, lo, hi, h))
    words = _words(len(open_), generator, device)
    for (slot, lo, hi, h), word in zip(open_, words):
        u = _LazyUniform(h, HIGH_BITS, word, generator, device)
        counts[slot] = lo + sum(1 for j in range(lo, hi)  # position j: i = j − C
                                  if u.at_least(table.sigma, j - table.limit))
    return counts


def _words(count: int, generator, device) -> list:
    if not count:
        return []
    return torch.randint(0, 1 << EXTRA_BITS, (count,), generator=generator,
                         device=device).tolist()


class _LazyUniform:
    """U ∈ [0, 1) known to ``bits`` bits (``value``/2^bits ≤ U < (value + 1)/2^bits); compares
    with a threshold Φ((2i + 1)/(510σ)) exactly, drawing 31 more bits while the known ones tie."""

    def __init__(self, high: int, bits: int, word: int, generator, device):
        self.value, self.bits = (high << EXTRA_BITS) | word, bits + EXTRA_BITS
        self.generator, self.device = generator, device

    def at_least(self, sigma: float, i: int) -> bool:
        while True:
            t = threshold(sigma, i, self.bits)  # ⌊2^bits·T⌋ < 2^bits·T (T irrational)
            if self.value != t:
                return self.value > t
            self.value = (self.value << EXTRA_BITS) | _words(1, self.generator, self.device)[0]
            self.bits += EXTRA_BITS


@register_noise("discrete-gaussian")
class DiscreteGaussian(Noise):
    """The discretized Gaussian on the 8-bit grid, sound in floating point (Voráček & Hein 2023).

    Inputs must lie on the grid {0, 1/255, …, 1} (8-bit images: ToTensor of uint8 data); others
    are refused. The noisy input is clip(m + c)/255 from integers (module doc), so it is exact;
    the radius is Cohen et al.'s σΦ⁻¹(p), valid for perturbations that stay on the grid.
    ``sigma`` is the standard deviation of the underlying real Gaussian (the discretized noise
    has variance σ² + 1/(12·255²) up to the tails). One σ per noise object (float), at most
:data:`MAX_SIGMA` (its exact table grows with σ).

    No soft radius, so data-dependent σ refuses this noise. Its certificate is Cohen's, but
    the soft radius is only usable through reparameterized draws σ·ε, and here (i) the noisy
    input h(x + ε) is piecewise constant in ε, so the gradient of ψ in σ is zero almost
    everywhere and the ascent would only follow the σ/2 factor (σ grows wherever ψ_A > ψ_B,
    whatever the model); (ii) σ·c/255 with c drawn at σ = 1 is not the discretized Gaussian at σ
    (the rounding does not scale), so the optimized draws would not be the certified ones;
    (iii) the exact sampler builds a threshold table per σ, so there is no per-sample σ.
    """

    norm = "l2"
    per_sample_sigma = False  # one exact threshold table per σ
    quantize = False
    max_sigma = MAX_SIGMA
    max_sigma_reason = (f"its exact sampler builds a table of about 3060*sigma exact thresholds "
                        f"(~3 s at sigma {MAX_SIGMA:g}); sigma is in pixel units, where 1 is "
                        "already the whole range of an image")

    def __init__(self, sigma):
        super().__init__(sigma)
        self.table = _Table.of(self.sigma)

    def radius(self, p, dim: int | None = None):
        """Certified L2 radius σ·Φ⁻¹(p) in float64 (Cohen et al.'s, for f∘h; module doc)."""
        return cohen_radius(self.sigma, p)

    def grid_points(self, x: torch.Tensor) -> torch.Tensor:
        """The integers m = 255·x (int32), checking that x is on the grid (or rounding it)."""
        m = torch.round(x.detach() * LEVELS)
        if not self.quantize:
            # Compared with the grid's values rounded once from float64 on the host, not with
            # m / 255 on x's device: CUDA divides by a scalar as a product with its reciprocal,
            # which misses the correctly rounded k/255 for some k and refused true 8-bit images.
            inside = (m >= 0) & (m <= LEVELS)
            grid = (torch.arange(LEVELS + 1, dtype=torch.float64) / LEVELS).to(x.dtype)
            on_grid = grid.to(x.device)[m.clamp(0, LEVELS).long()] == x
            off = ~(inside & on_grid)
            if bool(off.any()):
                raise SmoothcertError(
                    f"noise {self.name!r} needs inputs on the 8-bit grid "
                    f"(multiples of 1/255 in [0, 1]); {int(off.sum())} of {x.numel()} values are "
                    "not: use --noise discrete-gaussian-quantized to round them first")
        return m.clamp_(0, LEVELS).int()

    def check_input(self, x: torch.Tensor) -> None:
        self.grid_points(x)

    def perturb_(self, out: torch.Tensor, x: torch.Tensor, generator=None) -> torch.Tensor:
        """The noisy inputs clip(m + c)/255 into ``out`` (rows of x's shape); returns ``out``."""
        k = clip_units(self.sigma)
        c = draw_offsets(self.table, out.shape, generator, out.device)
        noisy = c.add_(self.grid_points(x)).clamp_(-LEVELS * k, LEVELS * (k + 1))
        return out.copy_(noisy).div_(LEVELS)

    def perturb(self, x: torch.Tensor, generator=None) -> torch.Tensor:
        return self.perturb_(torch.empty_like(x), x, generator)

    def sample(self, like: torch.Tensor, generator=None) -> torch.Tensor:
        """Draws c/255 (float, like ``like``), unclipped: training's noise. Certification
        uses :meth:`perturb_`, whose noisy inputs are exact and clipped."""
        return self.sample_(torch.empty_like(like), generator)

    def sample_(self, out: torch.Tensor, generator=None) -> torch.Tensor:
        c = draw_offsets(self.table, out.shape, generator, out.device)
        return out.copy_(c).div_(LEVELS)


@register_noise("discrete-gaussian-quantized")
class QuantizedDiscreteGaussian(DiscreteGaussian):
    """The discrete Gaussian of the input rounded to the 8-bit grid (digits' 1/16 steps,
    float images): the certificate is that of the rounded input, for perturbations on the grid.
    The noise name in the record says the inputs were rounded."""

    quantize = True


def variance(sigma: float) -> float:
    """Var(c/255) of the discretized Gaussian (its tails at ±C included), float64."""
    table = _Table.of(sigma)
    with mpmath.workdps(30):
        probs = _pmf(sigma, table.limit)
        return float(sum(p * (j / LEVELS) ** 2 for j, p in probs.items()))


def _pmf(sigma: float, limit: int) -> dict:
    cdf = [mpmath.ncdf(mpmath.mpf(2 * i + 1) / (2 * LEVELS * mpmath.mpf(sigma)))
           for i in range(-limit, limit)]
    edges = [mpmath.mpf(0)] + cdf + [mpmath.mpf(1)]
    return {j: edges[j + limit + 1] - edges[j + limit] for j in range(-limit, limit + 1)}


def pmf(sigma: float) -> dict:
    """P(c = j) for j = −C … C (float64): Φ((2j+1)/510σ) − Φ((2j−1)/510σ), tails lumped."""
    DiscreteGaussian.check_sigma(sigma)
    limit = LEVELS * (clip_units(sigma) + 1)
    with mpmath.workdps(30):
        return {j: float(p) for j, p in _pmf(sigma, limit).items()}


__all__ = ["MAX_SIGMA", "DiscreteGaussian", "QuantizedDiscreteGaussian", "clip_units",
           "draw_offsets", "pmf", "threshold", "variance"]
