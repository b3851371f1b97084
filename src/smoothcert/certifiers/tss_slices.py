"""TSS's sampling-based certification of rotation and scaling (Li et al., CCS 2021, §5.2;
authors' ``semantic/strict_rotation_certify.py`` and ``strict_resize_certify.py``), the
``tss`` certifier's program for a :class:`~smoothcert.transforms.sampled.SampledTransformation`.

ĉ_A is the top class of ``n0`` draws of the smoothing at x itself. Then the S slices of the
certified interval are visited nearest the identity first, a few at a time (:data:`WAVE`): for
slice j, ``n`` fresh draws at its sample T(x, θ_j) give p_j, the one-sided Clopper–Pearson
bound of ĉ_A's votes at level α/S, and the slice is certified when the ℓ2 radius of p_j
exceeds M_j (the interpolation bound, plus the sample's rounding to the input's dtype). The
visit stops at the first slice that is not; ``radius`` is its distance from the identity (the
whole interval when every slice is certified). Guarantee: with probability ≥ 1 − α (a union
bound over the at most S tests; the selection needs none), the smoothed classifier predicts
ĉ_A at every T(x, θ) with θ within ``radius`` of the identity. ``predict`` is −1 (an
abstention, radius 0) when the slice holding the identity is not certified.

The authors' loop differs in three ways, none of which changes what a certified row means:
they select ĉ_A with a binomial test at α and divide α by S + 1; they stop a slice's draws
early once its radius exceeds M_j (here every slice gets its ``n``); and their row says
certified only when all slices are, with a radius column that is the last slice's ℓ2 margin.
Records: ``p_lower`` and ``nA`` are those of the weakest slice tested (the failing one, if any).
"""

from __future__ import annotations

import math

import numpy as np

from ..smoothing.engine import Draws
from ..stats import clopper_pearson_lower
from ..transforms.sampled import SampleSweep

WAVE = 8
"""Slices per request: fewer wasted draws after a failure against fewer round trips."""


def certify_slices(t, cfg, x, label, generator):
    """The program's body (module docstring); yields Draws, returns the row."""
    selection = yield Draws(x, SampleSweep(t, x[None], (cfg.n0,)), (cfg.n0,), generator)
    c_hat = int(np.asarray(selection)[0].argmax())
    bounds = t.slice_bounds(x).cpu().numpy()
    order, inner = t.slice_order()
    level = cfg.alpha / t.slices
    weakest, failed = (math.inf, 0), None
    for start in range(0, len(order), WAVE):
        wave = order[start:start + WAVE]
        samples, rounding = t.samples(x, wave)
        sizes = (cfg.n,) * len(wave)
        counts = yield Draws(x, SampleSweep(t, samples, sizes), sizes, generator)
        for k, j in enumerate(wave):
            n_a = int(np.asarray(counts)[k][c_hat])
            p_lower = clopper_pearson_lower(n_a, cfg.n, level)
            weakest = min(weakest, (p_lower, n_a))
            if not t.radius(p_lower) > math.sqrt(bounds[j]) + float(rounding[k]):
                failed = j
                break
        if failed is not None:
            break
    distance = inner[failed] if failed is not None else math.inf
    radius, low, high = t.certified_set(float(distance))
    abstain = not radius > 0.0
    predict = -1 if abstain else c_hat
    return {"predict": predict, "radius": 0.0 if abstain else radius,
            "correct": int(predict == label), "p_lower": weakest[0], "nA": weakest[1],
            "n0": cfg.n0, "n": cfg.n, "alpha": cfg.alpha,
            "factor_low": 1.0 if abstain else float(low),
            "factor_high": 1.0 if abstain else float(high)}
