"""Soundness of the cascade's certificates (``certifiers/cascade.py``), at the level of vote
counts, where the true cascade is known in closed form.

The world: inputs move along one direction s = w·x (‖w‖ = 1); level k's model votes class 1
iff w·z ≥ t_k (t_k = ±∞: a constant model), so p_k(1; s) = Φ((s − t_k)/σ_k) and the true
cascade G(s) answers at the first level with a class of probability ≥ p0. G changes only where
some p_k(c; s) crosses p0, at s = t_k ± σ_k Φ⁻¹(p0): its robust radius at s₀ is the distance to
the nearest such point where G differs (a ball of radius r holds every s in [s₀ − r, s₀ + r]).

A certificate is false when it answers a class other than G(s₀) or a radius past that radius.
Checked: (1) Monte Carlo over fixed generators, the default rule's false rate ≤ α within three
binomial standard deviations, and a point-estimate control that exceeds it; (2) exactly (the
binomial law of the draws summed), the ``paper`` split of α exceeding α on the module doc's
counterexample, while ``bonferroni`` stays below it.
"""

import math

import numpy as np
import pytest
from scipy.stats import binom, norm

from smoothcert.certifiers.cascade import CascadeRule, LevelDraws, run_cascade

SIGMAS = (1.0, 0.5, 0.25)


def probs(s, t, sigma):
    """(p(0), p(1)) of the halfspace level at s."""
    p1 = 1.0 if t == -math.inf else 0.0 if t == math.inf else float(norm.cdf((s - t) / sigma))
    return np.array([1.0 - p1, p1])


def true_cascade(s, ts, p0):
    """G(s): the class of the first level reaching p0, or −1."""
    for t, sigma in zip(ts, SIGMAS):
        p = probs(s, t, sigma)
        if p.max() >= p0:
            return int(p.argmax())
    return -1


def true_radius(s0, ts, p0):
    """The distance from s₀ to the nearest s where G differs from G(s₀)."""
    answer, edges = true_cascade(s0, ts, p0), []
    for t, sigma in zip(ts, SIGMAS):
        if math.isfinite(t):
            edges += [t + sigma * norm.ppf(p0), t - sigma * norm.ppf(p0)]
    distances = [abs(e - s0) for e in edges
                 if any(true_cascade(e + d, ts, p0) != answer for d in (-1e-9, 1e-9))]
    return min(distances, default=math.inf)


class PointEstimates(CascadeRule):
    """The unsound control: the vote frequencies taken as the bounds."""

    def bounds(self, draws, k):
        p = draws.counts[draws.selected] / draws.counts.sum()
        return p, p

    def off_radius(self, draws, c, level):
        p = np.delete(draws.counts, c).max() / draws.counts.sum()
        return draws.sigma * (norm.ppf(min(p, 1 - 1e-16)) - norm.ppf(self.p0))


def false_rate(rule, s0, ts, p0, trials, n0=20, n=200, seed=0):
    rng = np.random.default_rng(seed)
    answer, radius = true_cascade(s0, ts, p0), true_radius(s0, ts, p0)
    ps = [probs(s0, t, sigma) for t, sigma in zip(ts, SIGMAS)]

    def draw(k):
        selection, counts = rng.binomial(n0, ps[k][1]), rng.binomial(n, ps[k][1])
        return LevelDraws(SIGMAS[k], int(selection > n0 - selection),
                          np.array([n - counts, counts]))

    wrong = answered = 0
    for _ in range(trials):
        c = run_cascade(rule, draw)
        if c.prediction is not None:
            answered += c.radius > 0
            wrong += c.prediction != answer or c.radius > radius + 1e-12
    return wrong / trials, answered / trials


# s₀ and thresholds: a knife edge at level 1 (p_1 = p0, level 2 always class 0), an answer at
# level 2 whose radius the first level caps, an answer at level 3 after two undecided levels.
SCENARIOS = [
    (0.0, (-1.0 * norm.ppf(0.7), math.inf, math.inf)),
    (0.1, (0.0, -0.8, math.inf)),
    (0.05, (0.0, 0.03, -0.3)),
]


@pytest.mark.parametrize("s0, ts", SCENARIOS)
def test_false_certificates_stay_below_alpha(s0, ts):
    alpha, p0, trials = 0.1, 0.7, 200
    rate, answered = false_rate(CascadeRule(3, alpha, p0), s0, ts, p0, trials)
    assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / trials)
    assert answered > (0.0 if s0 == 0.0 else 0.5)  # certificates with radii, not abstentions


def test_point_estimates_give_false_certificates_the_test_catches():
    alpha, p0, trials = 0.1, 0.7, 200
    s0, ts = SCENARIOS[0]
    rate, _ = false_rate(PointEstimates(3, alpha, p0), s0, ts, p0, trials)
    assert rate > alpha + 3 * math.sqrt(alpha * (1 - alpha) / trials)


def exact_false_probability(rule, p0, n=200, n0=100):
    """The exact probability of a false certificate on the counterexample: level 1 votes A
    (class 0) with probability p0 exactly, level 2 always B; every certificate with a radius
    > 0 is false (G changes at s₀ itself), whichever way G breaks the tie at p0."""
    pmf = binom.pmf(np.arange(n + 1), n, p0)
    select_a = binom.sf(math.ceil(n0 / 2) - 1, n0, p0)  # argmax ties go to class 0
    always_b = LevelDraws(0.5, 1, np.array([0, n]))
    total = 0.0
    for selected, p_selected in ((0, select_a), (1, 1 - select_a)):
        for votes in np.nonzero(pmf > 1e-15)[0]:
            first = LevelDraws(1.0, selected, np.array([votes, n - votes]))
            drawn = [first, always_b] if rule.goes_on(first, 0) else [first]
            c = rule.certificate(drawn)
            if c.prediction is not None and c.radius > 0:
                total += p_selected * pmf[votes]
    return total


def test_the_papers_alpha_split_is_not_sound_and_bonferroni_is():
    """α = 0.1, p0 = 0.8, n = 200: the authors' rule (α/k, Goodman) gives false certificates
    with probability 1.84α, α/k with exact off-class bounds 1.13α; the Bonferroni split
    0.28α (exact sums: no sampling tolerance)."""
    alpha, p0 = 0.1, 0.8
    authors = exact_false_probability(CascadeRule(2, alpha, p0, "paper", "goodman"), p0)
    paper = exact_false_probability(CascadeRule(2, alpha, p0, "paper"), p0)
    ours = exact_false_probability(CascadeRule(2, alpha, p0), p0)
    assert authors > 1.5 * alpha and paper > 1.1 * alpha
    assert ours < 0.5 * alpha
