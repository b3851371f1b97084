"""CERTIFY (Cohen, Rosenfeld & Kolter 2019, Algorithm 1): a class and a radius per input."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from ..data.registry import DATASETS
from ..noise.base import NOISES
from ..stats import clopper_pearson_lower
from .certifier import CERTIFY_COLUMNS, Certifier, certificate_row, register_certifier

log = logging.getLogger(__name__)


@register_certifier("certify")
class Certify(Certifier):
    """Cohen et al.'s CERTIFY: a class and a radius σΦ⁻¹(p_lower) (L1 for uniform noise).

    :meth:`smoothcert.Smoothed.certify_program` with the run's noise:
    ĉ_A from ``n0`` selection draws, n_A from ``n`` fresh draws, p_lower the one-sided
    Clopper–Pearson bound at level α. Guarantee: with probability ≥ 1−α, the smoothed classifier
    predicts ``predict`` on the ball of ``radius`` around x — σΦ⁻¹(p_lower) in L2 for Gaussian
    noise, 2λ(p_lower − ½) in L1 for uniform noise (Yang et al. 2020) — and ``predict`` −1 is an
    abstention (p_lower < ½). Under the same event ``radius_l1``, ``radius_l2`` and
    ``radius_linf`` are certified in their norms (``noise.radii(p_lower, d)``, d = C·H·W: the
    noise's direct certificate in a norm where it has one, else the best conversion; 0 on
    abstention); the one of the noise's norm is ``radius``.
    """

    columns = CERTIFY_COLUMNS
    needs_n0 = True

    def check(self, config):
        """A note when ``n`` draws at level α cannot certify any input (:func:`best_certify`)."""
        noise, dim = NOISES[config.noise](config.sigma), input_dim(config.dataset)
        note_too_few_draws(config, lambda n: best_certify(
            n, config.alpha, None if noise.needs_dim and dim is None
            else lambda p: noise.radius(p, dim)))

    def program(self, run, x, label, idx, generator):
        cfg = run.config
        c = yield from run.smoothed.certify_program(x, cfg.n0, cfg.n, cfg.alpha, generator)
        return certificate_row(c, label)


def input_dim(dataset: str) -> int | None:
    """The input dimension d = C·H·W of a registered dataset's inputs, or None (an image
    folder: its shape is known once its images are read)."""
    shape = getattr(DATASETS.get(dataset), "input_shape", None)
    return None if shape is None else math.prod(shape)


def best_certify(n: int, alpha: float, radius: Callable[[float], float] | None) -> str | None:
    """Why CERTIFY with ``n`` estimation draws at level ``alpha`` abstains on every input, or
    None when it need not. Its best case is n votes of n for ĉ_A: p_lower = α^(1/n)
    (Clopper–Pearson with k = n), a radius > 0 exactly when p_lower > ½ (n > log2(1/α)).
    ``radius`` None (a noise whose radius needs an unknown input dimension): p_lower alone."""
    p_lower = clopper_pearson_lower(n, n, alpha)
    if p_lower < 0.5:
        return f"even {n} votes of {n} give p_lower {p_lower:.4g} < 1/2"
    if radius is not None and radius(p_lower) <= 0:
        return f"even {n} votes of {n} give radius {radius(p_lower):.3g}"
    return None


def note_too_few_draws(config, best: Callable[[int], str | None],
                       verb: str = "certify") -> None:
    """One note (a logging warning, said before any work) when ``best(config.n)`` says why no
    input can get a certificate (or, for PREDICT, a class) from ``n`` draws at level α, naming
    the smallest n that can (``best`` is monotone: once None, None for every larger n)."""
    why = best(config.n)
    if why is None:
        return
    smallest = _smallest_n(best, config.n)
    fix = f"use --n at least {smallest}" if smallest is not None else "no --n can"
    log.warning("note: --n %d at --alpha %g cannot %s any input: %s, so every row will "
                "abstain; %s", config.n, config.alpha, verb, why, fix)


def _smallest_n(best: Callable[[int], str | None], fails: int) -> int | None:
    """The smallest n > ``fails`` with ``best(n)`` None (doubling, then bisection); None when
    no n up to 2**53 (the largest count the CLI takes) has it."""
    low, high = fails, 2 * fails + 1
    while best(high) is not None:
        if high > 2**53:
            return None
        low, high = high, 2 * high
    while high - low > 1:  # best(low) fails, best(high) works
        mid = (low + high) // 2
        low, high = (low, mid) if best(mid) is None else (mid, high)
    return high
