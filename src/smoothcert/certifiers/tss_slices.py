"""TSS's sampling-based certification of rotation and scaling (Li et al., CCS 2021, §5.2;
authors' ``semantic/strict_rotation_certify.py`` and ``strict_resize_certify.py``), the
``tss`` certifier's program for a :class:`~smoothcert.transforms.sampled.SampledTransformation`.

ĉ_A is the top class of ``n0`` draws of the smoothing at x itself. Then the S slices of the
certified interval are visited nearest the identity first, a few at a time (:data:`WAVE`).
Slice j's bound M_j is measured from one or both of its ends (its *anchors*: rotation's left
end; scaling's right end, or both where the slice holds a point at which a pixel enters the
image's border). At an anchor θ_k, ``n`` fresh draws at the sample T(x, θ_k) give p_k, the
one-sided Clopper–Pearson bound of ĉ_A's votes at level α/(S + 1), once for every slice that
needs it; the slice is certified when the ℓ2 radius of p_k exceeds M_j plus ``l2`` (plus the
sample's rounding to the input's dtype) at each of its anchors. The visit stops at the first
slice that is not; ``radius`` is its distance from the identity (the whole interval when every
slice is certified).

Guarantee: with probability ≥ 1 − α (a union bound over the at most S + 1 sample points; the
selection needs none), the smoothed classifier predicts ĉ_A at every T(x, θ) + δ with θ within
``radius`` of the identity and ‖δ‖₂ ≤ ``l2`` (and a brightness shift |b₁| ≤ ``b`` where the
transformation has one). ``predict`` is −1 (an abstention, radius 0) when a slice holding the
identity is not certified.

The authors' loop differs in three ways, none of which changes what a certified row means:
they select ĉ_A with a binomial test at α (dividing α by S + 1 for the slices, as here); they
stop a sample's draws early once its radius exceeds M (here every sample gets its ``n``), and
their M is the largest M_j of all slices; and their row says certified only when all slices
are, with a radius column that is the last slice's ℓ2 margin. Records: ``p_lower`` and ``nA``
are those of the weakest sample tested (the failing one, if any).
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
    bounds = np.sqrt(t.slice_bounds(x).cpu().numpy())
    need = t.anchors(tuple(x.shape))
    order, inner = t.slice_order()
    tested: dict[int, tuple[float, int, float]] = {}  # point -> (p_lower, nA, radius left)
    failed = None
    for start in range(0, len(order), WAVE):
        wave = order[start:start + WAVE]
        points = sorted({int(j + side) for j in wave for side in (0, 1) if need[j, side]}
                        - tested.keys())
        if points:
            tested.update((yield from _test_points(t, cfg, x, c_hat, points, generator)))
        failed = next((j for j in wave if not all(
            tested[j + side][2] > bounds[j] for side in (0, 1) if need[j, side])), None)
        if failed is not None:
            break
    radius, low, high = t.certified_set(float(inner[failed]) if failed is not None
                                        else math.inf)
    weakest = min(((p, n_a) for p, n_a, _ in tested.values()), default=(1.0, cfg.n))
    abstain = not radius > 0.0
    predict = -1 if abstain else c_hat
    return {"predict": predict, "radius": 0.0 if abstain else radius,
            "correct": int(predict == label), "p_lower": weakest[0], "nA": weakest[1],
            "n0": cfg.n0, "n": cfg.n, "alpha": cfg.alpha,
            "factor_low": 1.0 if abstain else float(low),
            "factor_high": 1.0 if abstain else float(high)}


def _test_points(t, cfg, x, c_hat, points, generator):
    """{point: (p_lower, nA, the ℓ2 radius less the sample's rounding and ``l2``)} from ``n``
    draws at each sample, at level α/(S + 1)."""
    samples, rounding = t.samples(x, points)
    sizes = (cfg.n,) * len(points)
    counts = np.asarray((yield Draws(x, SampleSweep(t, samples, sizes), sizes, generator)))
    level = cfg.alpha / (t.slices + 1)
    out = {}
    for k, point in enumerate(points):
        n_a = int(counts[k][c_hat])
        p_lower = clopper_pearson_lower(n_a, cfg.n, level)
        out[point] = (p_lower, n_a, t.radius(p_lower) - float(rounding[k]) - t.l2)
    return out
