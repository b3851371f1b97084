"""PREDICT (Cohen, Rosenfeld & Kolter 2019, Algorithm 1): a class or an abstention per input."""

from __future__ import annotations

from ..stats import binomial_pvalue
from .certifier import Certifier, register_certifier
from .certify import note_too_few_draws
from .columns import CERTIFY_RULES, Relation, count, probability


@register_certifier("predict")
class Predict(Certifier):
    """Cohen et al.'s PREDICT: a class, or an abstention, with no radius.

    :meth:`smoothcert.Smoothed.predict_program` with the run's noise: the top class of ``n``
    votes, or an abstention when the two-sided binomial test of the top two counts has
    p-value > α. Guarantee: a class other than the smoothed classifier's g(x) is
    returned with probability at most α (Cohen et al., Thm. 2).

    Records: ``nA`` and ``nB`` are the votes of the top two classes among the ``n`` draws, as
    Algorithm PREDICT names them (files before manifest version 5 called them ``count`` and
    ``runner_up``; :mod:`smoothcert.upgrade` reads them), ``pvalue`` their test's p-value."""

    columns = ("idx", "label", "predict", "correct", "time",
               "nA", "nB", "pvalue", "n", "alpha", "sigma", "seed")
    column_rules = {"nA": CERTIFY_RULES["nA"], "nB": count("nB"),
                    "pvalue": probability("pvalue")}
    relations = (Relation(("nA", "nB", "n"), lambda a, b, n: a + b > n,
                          lambda a, b, n: f"nA + nB is {a + b}, more than n ({n})"),)

    def check(self, config):
        """A note when ``n`` draws at level α cannot predict a class for any input: n votes of
        n have the two-sided p-value 2·2^(−n), which must be ≤ α (n ≥ log2(2/α))."""
        note_too_few_draws(config, lambda n: best_predict(n, config.alpha), "predict a class for")

    def program(self, run, x, label, idx, generator):
        cfg = run.config
        p = yield from run.smoothed.predict_program(x, cfg.n, cfg.alpha, generator)
        predict = -1 if p.abstained else p.prediction
        return {"predict": predict, "correct": int(predict == label), "nA": p.count,
                "nB": p.runner_up_count, "pvalue": p.pvalue, "n": p.n,
                "alpha": p.alpha, "sigma": cfg.sigma}


def best_predict(n: int, alpha: float) -> str | None:
    """Why PREDICT with ``n`` draws at level ``alpha`` abstains on every input, or None."""
    pvalue = binomial_pvalue(n, 0)  # the best case: every vote for one class
    return None if pvalue <= alpha else f"even {n} votes of {n} have p-value {pvalue:.4g} > alpha"
