"""Sequential certification at a grid of radii: CERTIFY's answer per grid radius, far fewer draws.

Per input: ĉ_A from n0 selection draws (as in Cohen et al.'s CERTIFY), then estimation draws in
looks of growing size until :func:`smoothcert.stats.sequential_levels.certify_levels` can tell
which grid radii are certified — stopping as soon as the answer can no longer change, capped at
n_max.

Guarantee (per input): with probability ≥ 1−α over the draws, the returned grid radius r_j
does not exceed the true radius σΦ⁻¹(p_A) of the smoothed classifier at x — no false
certificate; an abstention (``prediction`` None, radius 0) is always allowed. In particular
when level ≥ 0, ĉ_A = g(x) (p_A > ½) with the same probability. Reason: the selection draws are
independent of the estimation draws, and the sequential test's bounds hold simultaneously over
all looks (``smoothcert.stats.sequential_tests``).

The radius is the *grid* radius, not σΦ⁻¹(p_lower): ``report``'s certified accuracy at each
grid radius is then exactly what this certifier decides, while its ACR is computed from grid
radii and is lower than fixed-n CERTIFY's.

Records: CERTIFY's columns — ``nA`` the hits of ĉ_A and ``n`` the estimation draws actually used
— then ``n_max``, ``p_upper`` (the upper bound at the last look) and ``stopped`` (why sampling
ended: all / n_max / unreachable / futile).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import norm

from .. import radii
from ..errors import SmoothcertError, check_count, check_probability
from ..registry import option
from ..smoothing.engine import Draws
from ..smoothing.smoothed import Smoothed
from ..stats.sequential_levels import certify_levels, grid
from ..stats.sequential_tests import SEQUENTIAL_TESTS, SequentialTest
from .certifier import (
    CERTIFY_COLUMNS,
    Certifier,
    converted_radii,
    radius_columns,
    register_certifier,
)
from .columns import Column, Relation, count, probability

RADIUS_STEP = 0.25  # spacing of the default grid, as in Cohen et al.'s and Jeong & Shin's tables
# The default test: the fastest whose simulated certified accuracy stays within 0.5 points of
# fixed-n CERTIFY on a 3σ and a 2σ grid for σ = 0.25 and σ = 0.5 models, 500 images each
# (benchmarks/sequential_frontier.py; docs/BENCHMARKS.md).
DEFAULT_TEST = "targeted-patient"


@dataclass(frozen=True)
class SequentialCertificate:
    """Result of sequential certification at a grid of radii.

    Unless ``abstained``, with probability ≥ 1−α over the draws the smoothed classifier predicts
    ``prediction`` on the whole L2 ball of ``radius`` (a grid radius) around x. On abstention
    ``prediction`` is None and ``radius`` 0. ``draws`` estimation draws were used (≤ ``n_max``),
    ``count`` of them votes for ĉ_A. ``radii``: that L2 ball's radius in every norm
    (:func:`~.certifier.converted_radii`: the grid radius is a claim about one L2 ball, not a
    p_lower, so the other norms are its conversions).
    """

    prediction: int | None
    radius: float
    abstained: bool
    p_lower: float
    p_upper: float
    count: int
    n0: int
    draws: int
    n_max: int
    alpha: float
    sigma: float
    stopped: str
    radii: Mapping[str, float] = field(default_factory=dict)


def sequential_program(smoothed: Smoothed, x, n0: int, radii, alpha: float, n_max: int,
                       generator=None, test: SequentialTest | None = None):
    """Sequential certification of one input as an engine program (see ``sampling.Draws``).

    The first request holds the n0 selection draws and the first look's draws (every class is
    counted, so the look needs not wait for ĉ_A); each later request is the next look's draws.
    """
    check_count("n0", n0), check_count("n_max", n_max), check_probability("alpha", alpha)
    test = test if test is not None else SEQUENTIAL_TESTS[DEFAULT_TEST]()
    sigma = smoothed.noise.scalar_sigma()
    grid_radii, thresholds = grid(radii, sigma)
    x = smoothed.prepare_input(x, generator)
    first = test.looks(n_max)[0]  # the first request holds the selection and the first look
    selection, counts = yield Draws(x, smoothed.noise, (n0, first), generator)
    c_hat = int(selection.argmax())
    levels = certify_levels(test, thresholds, alpha, n_max, (int(selection[c_hat]), n0))
    if next(levels) != first:
        raise AssertionError("a test's aim must not move its first look")  # pragma: no cover
    try:
        while True:
            (counts,) = yield Draws(x, smoothed.noise, (levels.send(int(counts[c_hat])),),
                                    generator)
    except StopIteration as stop:
        o = stop.value
    certified = o.level >= 0
    radius = float(grid_radii[o.level]) if certified else 0.0
    return SequentialCertificate(
        c_hat if certified else None, radius, not certified, o.p_lower, o.p_upper, o.hits, n0,
        o.draws, n_max, alpha, sigma, o.stopped,
        converted_radii(radius, smoothed.noise.norm, x.numel()))


def certify_sequential(smoothed: Smoothed, x, n0: int, radii, alpha: float, n_max: int,
                       batch_size: int, generator=None, test: SequentialTest | None = None
                       ) -> SequentialCertificate:
    """Certify one input at the grid ``radii`` with :func:`sequential_program`."""
    program = sequential_program(smoothed, x, n0, radii, alpha, n_max, generator, test)
    (done,) = smoothed.run([(None, program)], batch_size)
    return done.result


def default_radii(sigma: float, alpha: float, n_max: int) -> np.ndarray:
    """0, 0.25, 0.5, … up to the largest radius fixed-n CERTIFY with n_max draws can reach:
    σΦ⁻¹(α^(1/n_max)), the radius of n_max hits out of n_max (e.g. 0.95 for σ = 0.25,
    α = 0.001, n = 100,000), so every grid radius is one that fixed-n could certify."""
    best = alpha ** (1.0 / n_max)  # p_lower of n_max hits out of n_max
    if best <= 0.5:  # then no radius, not even 0, can be certified
        needed = math.floor(math.log(alpha) / math.log(0.5)) + 1
        raise SmoothcertError(
            f"n = {n_max} draws cannot certify any radius at alpha {alpha}: even {n_max} hits "
            f"of {n_max} give a lower bound of {best:.3g}, not above 1/2; use n >= {needed}")
    reach = sigma * norm.ppf(best)
    return RADIUS_STEP * np.arange(math.floor(reach / RADIUS_STEP) + 1)


def parse_radii(text: str, sigma: float, alpha: float, n_max: int) -> np.ndarray:
    """``"auto"`` (:func:`default_radii`) or radii in the grammar of :mod:`smoothcert.radii`
    (e.g. ``0,0.25,0.5`` or ``0:1:0.25``); 0 is always part of the grid."""
    if text == "auto":
        return default_radii(sigma, alpha, n_max)
    return grid(radii.parse_radii(text), sigma)[0]


SEQUENTIAL_COLUMNS = CERTIFY_COLUMNS[:-1] + ("n_max", "p_upper", "stopped", "seed")

# why the sequential certifier stopped sampling (stats/sequential_levels.py, ``_stop_reason``)
STOP_REASONS = ("all", "n_max", "unreachable", "futile")


@register_certifier("sequential")
class Sequential(Certifier):
    """CERTIFY's answer at a grid of radii, with far fewer draws (stops once it is decided).

    See this module's doc: ``radii`` is ``auto`` or
    a grid (``--radii``), ``test`` the sequential test (:data:`SEQUENTIAL_TESTS`); the run's
    ``n`` is n_max. Gaussian noise, float or the sound discrete one (whose certificate is the
    Gaussian's σΦ⁻¹(p)): the grid's thresholds are Φ(r/σ)."""

    columns = SEQUENTIAL_COLUMNS
    column_rules = {
        "n_max": count("n_max"),
        "p_upper": probability("p_upper"),
        "stopped": Column("text", f"stopped is one of {', '.join(STOP_REASONS)}",
                          choices=STOP_REASONS),
    }
    relations = (
        Relation(("n", "n_max"), lambda n, m: n > m, lambda n, m: f"n is {n}, more than n_max "
                                                                   f"({m})"),
        Relation(("p_lower", "p_upper"), lambda lo, hi: lo > hi,
                 lambda lo, hi: f"p_lower is {lo}, above p_upper ({hi})"),
    )
    needs_n0 = True
    noises = ("gaussian", "discrete-gaussian", "discrete-gaussian-quantized")

    @dataclass(frozen=True)
    class Options:
        radii: str = option("auto", "the grid of radii: auto, or e.g. 0,0.25,0.5 or 0:1:0.25")
        test: str = option(DEFAULT_TEST, f"the sequential test: {', '.join(SEQUENTIAL_TESTS)}")

        def __post_init__(self):
            SEQUENTIAL_TESTS[self.test]  # an unknown name raises with the list of known ones
            parse_radii(self.radii, 1.0, 0.5, 2)

    def check(self, config):
        parse_radii(self.radii, config.sigma, config.alpha, config.n)

    def start(self, run):
        cfg = run.config
        self._grid = parse_radii(self.radii, cfg.sigma, cfg.alpha, cfg.n)
        self._test = SEQUENTIAL_TESTS[self.test]()

    def program(self, run, x, label, idx, generator):
        cfg = run.config
        c = yield from sequential_program(run.smoothed, x, cfg.n0, self._grid, cfg.alpha, cfg.n,
                                          generator, self._test)
        predict = -1 if c.abstained else c.prediction
        return {"predict": predict, "radius": c.radius, "correct": int(predict == label),
                "p_lower": c.p_lower, "nA": c.count, "n0": c.n0, "n": c.draws,
                "alpha": c.alpha, "sigma": c.sigma, **radius_columns(c.radii),
                "n_max": c.n_max, "p_upper": c.p_upper, "stopped": c.stopped}
