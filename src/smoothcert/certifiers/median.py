"""Median (percentile) smoothing of a regression model (Chiang, Curry, Abdelkader, Kumar,
Dickerson & Goldstein, NeurIPS 2020, "Detection as Regression: Certified Object Detection by
Median Smoothing"; authors' code Ping-C/CertifiedObjectDetection).

The smoothed model answers, for each of a regression model's D outputs, the ``percentile`` p of
f(x + G), G ~ N(0, σ²I) (p = ½: the median). From n draws at x the certificate bounds that
percentile at every x + δ, ‖δ‖₂ ≤ ε, for each ε of the grid ``eps``: the order statistics of
:mod:`smoothcert.stats.median` (the paper's indices; the authors' ``estimated_qu_ql`` numbers
exactly), ±inf where no order statistic can bound a side (n too small for ε).

Guarantee (``correction`` "bonferroni", the default): with probability ≥ 1 − α over the n
draws, for every ε of the grid, every output d and every ‖δ‖₂ ≤ ε, the smoothed percentile of
output d at x + δ lies in [lower[ε, d], upper[ε, d]] — α split over both sides of every output
at every ε. ``correction`` "none" is the authors' rule (their ``cert_conf`` = 1 − α for each
one-sided bound): each bound alone holds with probability ≥ 1 − α, a bounding box's 4 outputs
at one ε only with ≥ 1 − 8α. Gaussian noise only (Φ's Lipschitz bound).

No selection pass (no n0): one segment of n draws of the run's noise, forwarded through a
regression model (outputs (B, D)); the runner gives the program the label as a (D,) float32
tensor, recorded as ``target``. Unlike the authors' detector pipeline (sorting and binning
boxes before the median), the D outputs here are the model's own, each smoothed on its own.

Records (one row per input): ``target`` (D) the label, ``median`` (D) the empirical
percentile at x (an estimate, no guarantee), ``eps`` (E) the grid, ``lower``/``upper`` (E × D)
the certified intervals (``-inf``/``inf`` where no order statistic bounds the side), then
``percentile``, ``n``, ``alpha`` and ``sigma``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import SmoothcertError
from ..registry import list_text, number_list, option
from ..smoothing.engine import Draws
from ..stats.median import CORRECTIONS, certify_median, order_indices, side_alpha
from .certifier import Certifier, register_certifier
from .columns import Column, format_vector

log = logging.getLogger(__name__)


def parse_eps(value) -> tuple[float, ...]:
    """The radii from ``"0.1,0.25,0.5"`` (or a number, or a list): finite numbers ≥ 0,
    strictly increasing, at least one; anything else is one line saying what is wrong."""
    radii = number_list("median eps", value, low=0.0)
    if any(a >= b for a, b in zip(radii, radii[1:])):
        raise SmoothcertError(f"median eps must be strictly increasing, got {value}")
    return radii


MEDIAN_RULES = {
    "target": Column("vector", "target is the label: finite numbers separated by commas"),
    "median": Column("vector", "median is the smoothed output: finite numbers separated by "
                               "commas"),
    "eps": Column("vector", "eps is the grid of radii: finite numbers >= 0 separated by commas",
                  low=0.0),
    "lower": Column("vector", "lower is a matrix of numbers or -inf (rows: eps; columns: "
                              "outputs)", infinite=True),
    "upper": Column("vector", "upper is a matrix of numbers or inf (rows: eps; columns: "
                              "outputs)", infinite=True),
    "percentile": Column("float", "percentile is in (0, 1)", low=0.0, high=1.0, low_open=True),
}


@register_certifier("median")
class Median(Certifier):
    """Chiang et al.'s percentile smoothing of a regression model (module doc): per output the
    smoothed percentile and its certified interval at every radius of ``eps``."""

    columns = ("idx", "target", "median", "eps", "lower", "upper", "percentile", "n",
               "alpha", "sigma", "time", "seed")
    column_rules = MEDIAN_RULES
    tasks = ("regression",)
    noises = ("gaussian",)
    needs_n0 = False

    @dataclass(frozen=True)
    class Options:
        percentile: float = option(0.5, "the smoothed percentile of each output, in (0, 1) "
                                        "(0.5: the median, the authors')")
        eps: str = option("0.1,0.25,0.36,0.5", "the l2 radii (input units) to certify, "
                                               "increasing, comma-separated (the authors' "
                                               "default radius: 0.36 at sigma 0.25)",
                     convert=list_text)
        correction: str = option("bonferroni", "alpha over the bounds: bonferroni (all outputs"
                                               " and radii at once) or none (each one-sided "
                                               "bound at alpha, the authors')",
                                 choices=CORRECTIONS)

        def __post_init__(self):
            parse_eps(self.eps)
            if not 0.0 < self.percentile < 1.0:
                raise SmoothcertError(f"median percentile must be in (0, 1), got "
                                      f"{self.percentile}")

    def check(self, config):
        """A note (before any work) naming the radii at which ``n`` draws at level α bound no
        output on some side, even a model of one output: every row's interval is infinite
        there."""
        radii = parse_eps(self.eps)
        level = side_alpha(float(config.alpha), 1, len(radii), self.correction)
        unbounded = [r for r in radii if _unbounded(config.n, self.percentile,
                                                    r / float(config.sigma), level)]
        if unbounded:
            log.warning("note: --n %d at --alpha %g bounds no percentile at eps %s (sigma %g): "
                        "the intervals there are infinite; a larger --n or smaller eps bounds "
                        "them", config.n, config.alpha, ",".join(f"{r:g}" for r in unbounded),
                        config.sigma)

    def start(self, run):
        self._eps = parse_eps(self.eps)

    def program(self, run, x, label, idx, generator):
        cfg = run.config
        x = run.smoothed.prepare_input(x, generator)
        (values,) = yield Draws(x, run.smoothed.noise, (cfg.n,), generator, outputs="values")
        c = certify_median(values, self._eps, float(cfg.sigma), percentile=self.percentile,
                           alpha=float(cfg.alpha), correction=self.correction)
        target = label.detach().cpu().double().numpy().reshape(-1)
        return {"target": format_vector(target), "median": format_vector(c.median),
                "eps": format_vector(c.eps), "lower": format_vector(c.lower),
                "upper": format_vector(c.upper), "percentile": self.percentile, "n": cfg.n,
                "alpha": cfg.alpha, "sigma": cfg.sigma}


def _unbounded(n: int, percentile: float, eps_over_sigma: float, level: float) -> bool:
    found = order_indices(n, percentile, eps_over_sigma, level)
    return found.k_lower == 0 or found.k_upper == n + 1
