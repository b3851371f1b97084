"""CERTIFY with the runner-up's bound: Cohen et al.'s Theorem 1 with both of its probabilities.

Theorem 1 (Cohen, Rosenfeld & Kolter 2019): if p_A ≤ P(f(x + δ) = c_A) and
p_B ≥ max_{c ≠ c_A} P(f(x + δ) = c) with p_A > p_B, the smoothed classifier g predicts c_A on
the L2 ball of radius σ/2·(Φ⁻¹(p_A) − Φ⁻¹(p_B)). CERTIFY takes p_B = 1 − p_A, which gives
σΦ⁻¹(p_A); when the rest of the mass is spread over several classes (many classes: ImageNet,
CIFAR-100, image folders; or a p_A below ½) an upper bound on the largest other class is much
smaller, and the radius larger.

Per input: ĉ_A from n0 selection draws (as CERTIFY), then n fresh draws, every class counted.
Simultaneous bounds at total level α (a union bound, split before any estimation draw):

* p_lower: the one-sided Clopper–Pearson lower bound on p_A from ĉ_A's count, at α/2;
* for every other class c: the one-sided Clopper–Pearson upper bound on p_c, at α/(2(K−1));
  p_upper is the largest of them, capped by 1 − p_lower (always implied by the first bound).

Every other class is bounded, not only the runner-up of the draws: a bound on the class that
merely looks second would be no bound on max_{c ≠ ĉ_A} p_c when another class has more mass
(``tests/certifiers/test_runner_up.py`` measures that choice failing). Abstains when
p_lower ≤ p_upper. The split costs little: Clopper–Pearson bounds move slowly with their level.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from ..errors import SmoothcertError
from ..smoothing.engine import Draws
from ..stats import clopper_pearson_lower
from .certifier import (
    CERTIFY_COLUMNS,
    Certifier,
    converted_radii,
    radius_columns,
    register_certifier,
)
from .certify import note_too_few_draws
from .columns import RUNNER_UP, Relation, count, probability


@dataclass(frozen=True)
class RunnerUpCertificate:
    """Unless ``abstained``, with probability ≥ 1−α over the draws the smoothed classifier
    predicts ``prediction`` on the L2 ball of ``radius`` = σ/2·(Φ⁻¹(p_lower) − Φ⁻¹(p_upper)).
    ``runner_up`` is the class whose upper bound is p_upper (before the cap), ``count`` and
    ``runner_up_count`` the votes of ĉ_A and of it among the ``n`` estimation draws."""

    prediction: int | None
    radius: float
    abstained: bool
    p_lower: float
    p_upper: float
    count: int
    runner_up: int
    runner_up_count: int
    n: int
    alpha: float
    sigma: float


def clopper_pearson_upper(k, n, alpha):
    """One-sided (1−α) Clopper–Pearson upper bound: 1 − the lower bound of the n − k misses."""
    return 1.0 - clopper_pearson_lower(np.asarray(n) - np.asarray(k), n, alpha)


def runner_up_certificate(c_hat: int, counts, alpha: float, sigma: float
                          ) -> RunnerUpCertificate:
    """The certificate of class ``c_hat`` (chosen before these draws) from the estimation
    draws' ``counts`` (one per class, K ≥ 2), with the bounds of this module's doc."""
    counts = np.asarray(counts, dtype=np.int64)
    n, k = int(counts.sum()), len(counts)
    if k < 2:
        raise SmoothcertError(f"the runner-up's bound needs at least 2 classes, got {k}")
    p_lower = clopper_pearson_lower(int(counts[c_hat]), n, alpha / 2)
    others = np.delete(np.arange(k), c_hat)
    uppers = clopper_pearson_upper(counts[others], n, alpha / (2 * (k - 1)))
    b = int(others[int(np.argmax(uppers))])
    p_upper = min(float(np.max(uppers)), 1.0 - p_lower)
    common = dict(p_lower=p_lower, p_upper=p_upper, count=int(counts[c_hat]), runner_up=b,
                  runner_up_count=int(counts[b]), n=n, alpha=alpha, sigma=sigma)
    if p_lower <= p_upper:
        return RunnerUpCertificate(None, 0.0, True, **common)
    radius = sigma / 2 * (float(norm.ppf(p_lower)) - float(norm.ppf(p_upper)))
    return RunnerUpCertificate(c_hat, radius, False, **common)


@register_certifier("runner-up")
class RunnerUp(Certifier):
    """CERTIFY with p_B bounded from the draws (σ/2·(Φ⁻¹(p_lower) − Φ⁻¹(p_upper)), this
    module's doc): never a smaller p_B than CERTIFY's 1 − p_A, so a larger radius whenever the
    other classes' bounds are well below 1 − p_lower, and a certificate (not an abstention)
    for some p_A below ½. Gaussian noise only (Theorem 1 is the Gaussian's)."""

    columns = CERTIFY_COLUMNS[:-1] + ("runner_up", "nB", "pB_upper", "seed")
    column_rules = {"runner_up": RUNNER_UP, "nB": count("nB"), "pB_upper": probability("pB_upper")}
    relations = (
        Relation(("nA", "nB", "n"), lambda a, b, n: a + b > n,
                 lambda a, b, n: f"nA + nB is {a + b}, more than n ({n})"),
    )
    needs_n0 = True
    noises = ("gaussian",)

    def check(self, config):
        """A note when ``n`` draws at level α cannot certify any input: the best case, n votes
        of n, is the two-class certificate for every number of classes (p_upper is capped at
        1 − p_lower, which is reached with two classes and smaller than the others' bounds
        with more), a radius > 0 exactly when (α/2)^(1/n) > ½, n > log2(2/α)."""
        note_too_few_draws(config, lambda n: best_runner_up(n, config.alpha, config.sigma))

    def program(self, run, x, label, idx, generator):
        cfg, smoothed = run.config, run.smoothed
        x = smoothed.prepare_input(x, generator)
        selection, estimation = yield Draws(x, smoothed.noise, (cfg.n0, cfg.n), generator)
        c = runner_up_certificate(int(selection.argmax()), estimation, cfg.alpha,
                                  smoothed.noise.scalar_sigma())
        predict = -1 if c.abstained else c.prediction
        # one L2 ball (Theorem 1 with both bounds): the other norms are its conversions
        radii = converted_radii(c.radius, smoothed.noise.norm, x.numel())
        return {"predict": predict, "radius": c.radius, "correct": int(predict == label),
                "p_lower": c.p_lower, "nA": c.count, "n0": cfg.n0, "n": c.n,
                "alpha": c.alpha, "sigma": c.sigma, **radius_columns(radii),
                "runner_up": c.runner_up, "nB": c.runner_up_count, "pB_upper": c.p_upper}


def best_runner_up(n: int, alpha: float, sigma: float) -> str | None:
    """Why the runner-up's bound with ``n`` draws at level ``alpha`` abstains on every input,
    or None (:meth:`RunnerUp.check`)."""
    c = runner_up_certificate(0, [n, 0], alpha, sigma)
    if not c.abstained and c.radius > 0:
        return None
    return f"even {n} votes of {n} give p_lower {c.p_lower:.4g} <= p_upper {c.p_upper:.4g}"
