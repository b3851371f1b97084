"""CERTIFY (Cohen, Rosenfeld & Kolter 2019, Algorithm 1): a class and a radius per input."""

from __future__ import annotations

from .certifier import CERTIFY_COLUMNS, Certifier, certificate_row, register_certifier


@register_certifier("certify")
class Certify(Certifier):
    """Cohen et al.'s CERTIFY: a class and a radius σΦ⁻¹(p_lower) (L1 for uniform noise).

    :meth:`smoothcert.Smoothed.certify_program` with the run's noise:
    ĉ_A from ``n0`` selection draws, n_A from ``n`` fresh draws, p_lower the one-sided
    Clopper–Pearson bound at level α. Guarantee: with probability ≥ 1−α, the smoothed classifier
    predicts ``predict`` on the ball of ``radius`` around x — σΦ⁻¹(p_lower) in L2 for Gaussian
    noise, 2λ(p_lower − ½) in L1 for uniform noise (Yang et al. 2020) — and ``predict`` −1 is an
    abstention (p_lower < ½).
    """

    columns = CERTIFY_COLUMNS
    needs_n0 = True

    def program(self, run, x, label, idx, generator):
        cfg = run.config
        c = yield from run.smoothed.certify_program(x, cfg.n0, cfg.n, cfg.alpha, generator)
        return certificate_row(c, label)
