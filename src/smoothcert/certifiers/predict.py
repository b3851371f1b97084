"""PREDICT (Cohen, Rosenfeld & Kolter 2019, Algorithm 1): a class or an abstention per input."""

from __future__ import annotations

from .certifier import Certifier, register_certifier
from .columns import RUNNER_UP, Relation, count, probability


@register_certifier("predict")
class Predict(Certifier):
    """Cohen et al.'s PREDICT: a class, or an abstention, with no radius.

    :meth:`smoothcert.Smoothed.predict_program` with the run's noise: the top class of ``n``
    votes, or an abstention when the two-sided binomial test of the top two counts has
    p-value > α. Guarantee: a class other than the smoothed classifier's g(x) is
    returned with probability at most α (Cohen et al., Thm. 2)."""

    columns = ("idx", "label", "predict", "correct", "time",
               "count", "runner_up", "pvalue", "n", "alpha", "sigma", "seed")
    column_rules = {"count": count("count"), "runner_up": RUNNER_UP,  # the runner-up's votes
                    "pvalue": probability("pvalue")}
    relations = (Relation(("count", "runner_up", "n"), lambda a, b, n: a + b > n,
                          lambda a, b, n: f"count + runner_up is {a + b}, more than n ({n})"),)

    def program(self, run, x, label, idx, generator):
        cfg = run.config
        p = yield from run.smoothed.predict_program(x, cfg.n, cfg.alpha, generator)
        predict = -1 if p.abstained else p.prediction
        return {"predict": predict, "correct": int(predict == label), "count": p.count,
                "runner_up": p.runner_up_count, "pvalue": p.pvalue, "n": p.n,
                "alpha": p.alpha, "sigma": cfg.sigma}
