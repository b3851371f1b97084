r"""The L-bound certifiers: Campbell, Finlay & Oberman, "Adversarial Boot Camp" (arXiv 2010.02508;
code: github.com/ryancampbell514/HeatSmoothing), Theorem 3.

- ``lbound``: the L-bound of the *soft smoothed classifier* G = E[softmax f(x + δ)], from a
  Monte Carlo estimate of G with a Hoeffding bound; a guarantee with probability ≥ 1−α
  (:func:`certify_lbound`).
- ``lbound-heuristic``: the L-bound computed from f's own softmax at x, as the paper does for its
  HeatSmoothing models (Tables 3 and 5): exact only if f really is a Gaussian average, so its
  records say ``guarantee = heuristic`` (:func:`lbound_heuristic`).

``lbound`` certifies G, not f itself (the deployed deterministic model) at x + e; only the
heuristic speaks of f, and only under its unchecked assumption that f = G. The margin bounds are
in :mod:`smoothcert.stats.margins`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SmoothcertError, check_count, check_probability
from ..noise.gaussian import Gaussian
from ..registry import option
from ..smoothing.smoothed import Smoothed
from ..stats.margins import BOUNDS, lbound_radius, margin, margin_lower_bound
from .certifier import Certifier, register_certifier
from .columns import RUNNER_UP, Column, probability
from .deterministic import clean_scores

CONFIDENCE = "confidence"  # holds with probability ≥ 1−α over the Monte Carlo draws
HEURISTIC = "heuristic"  # holds only under an assumption the certifier cannot check


@dataclass(frozen=True)
class LBoundCertificate:
    """Result of an L-bound certifier: class ``prediction`` and an L2 ``radius`` within which the
    top class of the soft smoothed classifier G(x) = E[softmax f(x + δ)] does not change.

    ``guarantee`` is ``"confidence"`` when this holds with probability ≥ 1−α over the draws, and
    ``"heuristic"`` when it rests on an assumption (see the certifier). On abstention
    ``prediction`` is None and ``radius`` is 0.
    """

    prediction: int | None
    radius: float
    p_top: float  # G_A(x) for the selected class A: its estimate, or f's softmax (heuristic)
    p_runner_up: float  # max_{B≠A} of the same
    runner_up: int  # that class B
    gap_lower: float  # the margin used for the radius (a lower bound on G_A − G_B, or estimate)
    abstained: bool
    n0: int  # selection draws (0: A is the prediction on the clean input)
    n: int  # estimation draws (0 for the heuristic)
    alpha: float | None  # the level of the confidence bound; None for the heuristic
    sigma: float
    bound: str  # lipschitz.BOUNDS, or "model" for the heuristic
    guarantee: str


def certify_lbound(
    smoothed: Smoothed,
    x,
    n: int,
    alpha: float,
    batch_size: int,
    generator=None,
    *,
    n0: int = 0,
    bound: str = "pairwise",
) -> LBoundCertificate:
    """The L-bound of the soft smoothed classifier G(x) = E[softmax f(x + δ)], δ ~ N(0, σ²I),
    from a Monte Carlo estimate with a confidence bound.

    Step 1: select A — argmax f(x) on the clean input when ``n0`` = 0 (default: a HeatSmoothing
    model is trained to approximate G, so its clean prediction is G's top class), else the argmax
    of the mean softmax over ``n0`` selection draws (Salman et al.'s soft classifier).
    Step 2: p̄ = mean softmax f(x + δᵢ) over n *fresh* draws (``engine.soft_scores``).
    Step 3: m_lower = :func:`~smoothcert.stats.margins.margin_lower_bound` (p̄, A, n, α, ``bound``).
    Step 4: abstain if m_lower ≤ 0, else radius σ·√(π/2)·m_lower.

    Guarantee (``bound`` "pairwise" or "top"): A does not depend on the n estimation draws, so
    with probability ≥ 1−α over them G_A(x) − G_B(x) ≥ m_lower for every B ≠ A; then, unless it
    abstains, argmax G(x + e) = A for every ‖e‖₂ < radius (Theorem 3). With ``bound="none"`` the
    radius is the paper's plug-in L-bound and carries no guarantee (``guarantee`` "heuristic").
    This certifies G, the Gaussian average *of f* — for a HeatSmoothing f that is a further
    smoothing of the deployed model. The L-bound is never larger than Cohen et al.'s soft radius
    σ/2·(Φ⁻¹(G_A) − Φ⁻¹(G_B)) (Salman et al.), which would need the same confidence bounds.
    """
    check_count("n", n), check_probability("alpha", alpha), check_count("batch_size", batch_size)
    check_count("n0", n0, minimum=0)
    if bound not in BOUNDS:
        raise SmoothcertError(f"bound must be one of {', '.join(BOUNDS)}, got {bound!r}")
    sigma = _gaussian_sigma(smoothed)
    x = smoothed.prepare_input(x, generator)
    if n0 == 0:
        top = int(clean_scores(smoothed.model, x).argmax())
    else:
        top = int(smoothed.soft_scores(x, n0, batch_size, generator).argmax())
    p_bar = smoothed.soft_scores(x, n, batch_size, generator).cpu().numpy()
    runner_up, _ = margin(p_bar, top)
    gap = margin_lower_bound(p_bar, top, n, alpha, bound)
    guarantee = HEURISTIC if bound == "none" else CONFIDENCE
    return _lbound_certificate(top, p_bar, runner_up, gap, n0, n, alpha, sigma, bound, guarantee)


def lbound_heuristic(smoothed: Smoothed, x) -> LBoundCertificate:
    """The paper's L-bound of a HeatSmoothing model: σ·√(π/2)·(p₍₁₎ − p₍₂₎) with p = softmax f(x)
    of the model on the clean input (one forward pass, no draws; Tables 3 and 5, authors'
    ``test_statistics.py`` without ``--is-cohen``).

    **Heuristic**: it is Theorem 3 applied as if f were the Gaussian average at σ of a classifier
    with outputs in [0, 1]. It holds exactly — argmax f(x + e) = argmax f(x) for every
    ‖e‖₂ < radius — when that is true, and then for f itself, the deployed model; HeatSmoothing only
    approximates it (a loss minimised by training), so no probability of correctness can be
    stated. Records carry ``guarantee = heuristic``; do not mix them with certified accuracy.

    The prediction is argmax f(x); it abstains only on an exact tie of the top two (radius 0).
    The authors measure the margin against the true label, p_y − max_{i≠y} p_i clamped at 0; that
    equals this radius when the prediction is correct and 0 otherwise (``correct`` = 0 here).
    """
    sigma = _gaussian_sigma(smoothed)
    x = smoothed.prepare_input(x)
    p = clean_scores(smoothed.model, x).cpu().numpy()
    top = int(p.argmax())
    runner_up, gap = margin(p, top)
    return _lbound_certificate(top, p, runner_up, gap, 0, 0, None, sigma, "model", HEURISTIC)


def _lbound_certificate(top, p, runner_up, gap, n0, n, alpha, sigma, bound, guarantee):
    abstained = not gap > 0
    return LBoundCertificate(
        prediction=None if abstained else top,
        radius=0.0 if abstained else lbound_radius(gap, sigma),
        p_top=float(p[top]),
        p_runner_up=float(p[runner_up]),
        runner_up=runner_up,
        gap_lower=float(gap),
        abstained=abstained,
        n0=n0,
        n=n,
        alpha=alpha,
        sigma=sigma,
        bound=bound,
        guarantee=guarantee,
    )


def _gaussian_sigma(smoothed: Smoothed) -> float:
    """σ of the smoothing noise; the L-bound's Lipschitz constant √(2/π)/σ is Gaussian's."""
    if not isinstance(smoothed.noise, Gaussian):
        raise SmoothcertError(f"the L-bound needs Gaussian noise, got {smoothed.noise!r}")
    return smoothed.noise.scalar_sigma()


LBOUND_COLUMNS = ("idx", "label", "predict", "radius", "correct", "time",
                  "p_top", "p_runner_up", "runner_up", "gap_lower", "n0", "n", "alpha", "sigma",
                  "bound", "guarantee", "seed")
HEURISTIC_COLUMNS = ("idx", "label", "predict", "radius", "correct", "time",
                     "p_top", "p_runner_up", "runner_up", "sigma", "guarantee", "seed")
SELECTIONS = ("clean", "draws")
LBOUND_RULES = {
    "p_top": probability("p_top"),
    "p_runner_up": probability("p_runner_up"),
    "runner_up": RUNNER_UP,  # here the runner-up's class
    "gap_lower": Column("float", "gap_lower is a finite number <= 1", high=1.0),
    "bound": Column("text", f"bound is one of {', '.join((*BOUNDS, 'model'))}",
                    choices=(*BOUNDS, "model")),
    "guarantee": Column("text", f"guarantee is {CONFIDENCE} or {HEURISTIC}",
                        choices=(CONFIDENCE, HEURISTIC)),
}
"""The rules of the L-bound certifiers' own columns."""


@register_certifier("lbound")
class LBound(Certifier):
    """Campbell et al.'s L-bound of the soft smoothed classifier, with a confidence bound.

    :func:`certify_lbound` on every input with the run's ``n`` and α: ``bound`` is the margin
    bound (:data:`~smoothcert.stats.margins.BOUNDS`), ``select`` picks the class from the clean
    input or from ``n0`` selection draws. Gaussian noise only (its Lipschitz constant)."""

    columns = LBOUND_COLUMNS
    column_rules = LBOUND_RULES
    needs_n0 = True
    noises = ("gaussian",)

    @dataclass(frozen=True)
    class Options:
        bound: str = option("pairwise", f"the margin bound: {', '.join(BOUNDS)}")
        select: str = option("clean", "the class from the clean input or from n0 draws: "
                                      f"{', '.join(SELECTIONS)}")

        def __post_init__(self):
            if self.bound not in BOUNDS or self.select not in SELECTIONS:
                raise SmoothcertError(
                    f"lbound options: bound is one of {', '.join(BOUNDS)} and select one of "
                    f"{', '.join(SELECTIONS)}; got bound={self.bound}, select={self.select}")

    def clean_passes(self) -> int:
        return 1 if self.select == "clean" else 0  # the class from the clean input

    def program(self, run, x, label, idx, generator):
        cfg = run.config
        n0 = cfg.n0 if self.select == "draws" else 0
        c = certify_lbound(run.smoothed, x, cfg.n, cfg.alpha, cfg.batch, generator, n0=n0,
                           bound=self.bound)
        return {**_lbound_row(c, label), "gap_lower": c.gap_lower, "n0": c.n0, "n": c.n,
                "alpha": c.alpha, "bound": c.bound}
        yield  # a program that computes its soft scores itself, without engine requests


@register_certifier("lbound-heuristic")
class LBoundHeuristic(Certifier):
    """Campbell et al.'s L-bound from f's own softmax: one forward pass, no guarantee.

    :func:`lbound_heuristic` on every input."""

    columns = HEURISTIC_COLUMNS
    column_rules = LBOUND_RULES
    noises = ("gaussian",)

    def clean_passes(self) -> int:
        return 1  # its one forward pass, on the clean input

    def program(self, run, x, label, idx, generator):
        return _lbound_row(lbound_heuristic(run.smoothed, x), label)
        yield  # one forward pass of its own, no engine requests


def _lbound_row(c: LBoundCertificate, label: int) -> dict:
    predict = -1 if c.abstained else c.prediction
    return {"predict": predict, "radius": c.radius, "correct": int(predict == label),
            "p_top": c.p_top, "p_runner_up": c.p_runner_up, "runner_up": c.runner_up,
            "sigma": c.sigma, "guarantee": c.guarantee}
