"""Cascaded smoothing over σ (Jeong & Shin, NeurIPS 2023, "Multi-scale Diffusion Denoised
Smoothing", arXiv 2310.16779; authors' code jh-jeong/smoothing-multiscale, ``certify.py`` and
``third_party/core_mdds.py``).

The classifier. Levels σ_1 > σ_2 > … > σ_K, level k smoothing its model f_k with Gaussian noise
of σ_k: p_k(c; x) = P(f_k(x + σ_k δ) = c). The cascade G answers at the first level k where some
class c has p_k(c; x) ≥ p0 (``p0`` ≥ ½, the authors' ``skip_p``), with that class, and
abstains when no level does.

The certificate at x, answering class c at level k (0-based here, 1-based in the records):

* level k certifies c on the ball of radius σ_k(Φ⁻¹(p_lower) − Φ⁻¹(p0)), p_lower a
  Clopper–Pearson lower bound on p_k(c; x): Φ⁻¹ p_k(c; ·) is 1/σ_k-Lipschitz (Salman et al.
  2019), so p_k(c; x') ≥ p0 there;
* every earlier level j < k must not answer another class anywhere in the ball: with p_B,j an
  upper bound on max_{c' ≠ c} p_j(c'; x), the same Lipschitz argument keeps those classes below
  p0 within σ_j(Φ⁻¹(p0) − Φ⁻¹(p_B,j)); the radius is the smallest of these and level k's.
  (An earlier level that answers c itself somewhere in the ball changes nothing: G is c.)
  ``radius_neg`` is the authors' record of it: max_j σ_j(Φ⁻¹(p_B,j) − Φ⁻¹(p0)) over the
  earlier levels, −100 where there is none (their value); a radius_neg > 0 vetoes the answer
  (an abstention). A bound p_B,j = 1 counts as the largest float below 1 (finite column).

The procedure, per level from σ_1 down: n0 selection draws pick ĉ, n estimation draws bound
p_k(ĉ) at the level's own level β_k (two-sided Clopper–Pearson, each side β_k); lower ≥ p0 →
answer (the certificate above); upper ≥ p0 → stop and abstain (level k may answer ĉ, nothing
certifiable); else go on to the next level (or abstain after the last).

Soundness of the α split (``alpha_split``). An answer at level k is wrong only if level k's
lower bound fails or one of the earlier levels' off-class bounds does; which level answers
depends on the draws, so a union bound must cover every bound any path can use: the K lower
bounds and the K − 1 off-class families.

* ``bonferroni`` (default, sound): each level has α/K; a level that can be an earlier level
  (all but the last) spends α/(2K) on its lower bound and α/(2K) on its off-class family
  (the Clopper–Pearson upper bound of every class at α/(2K·C): one event whatever class c a
  later level answers, ``stats/multinomial.py``), the last level α/K on its lower bound. The
  events cover every path: P(a wrong certificate) ≤ K·α/K = α. One level is CERTIFY with p0
  (p0 = ½: Cohen et al.'s CERTIFY exactly).
* ``paper`` (the authors' ``alpha / (stage + 1)``): every bound used at level k at α/(k+1),
  the earlier levels' off-class bounds recomputed at it. The k + 1 bounds of one path add up
  to α, but a path's bounds are not the only ones that can fail: the rule is NOT sound.
  Counterexample (``tests/certifiers/test_cascade_soundness.py`` sums the binomial law of the
  draws exactly): level 1 votes A with probability p0 exactly (then every certificate with a
  radius > 0, of A or of another class, is wrong: G changes at x itself), level 2 always
  votes B. A false certificate comes from level 1's lower bound failing (probability ≈ α)
  *or*, disjointly, from level 1's upper bound falling below p0 (probability ≈ α) followed by
  an off-class bound on A below p0 at level 2's α/2 (likely, given the first). With α = 0.1,
  p0 = 0.8, n = 200: 1.13α with exact off-class bounds, 1.84α with the authors' Goodman bound
  (its two-group branch, below), against 0.28α for ``bonferroni``.

``off_class``: ``clopper-pearson`` (default, exact) or ``goodman`` (the authors':
``stats.multinomial.authors_off_class_upper``, Goodman's χ² intervals after pooling small
counts — approximate, and its two-group branch bounds the wrong class; for reproducing their
numbers). Both are computed at the off-class level of the split above (``paper``: the
authors' α/(k+1), their Goodman at two-sided 2·α/(k+1)).

Models: one per level (``checkpoint_roles``: ``certify A.pt B.pt C.pt --sigma 1,0.5,0.25``,
roles ``level2`` … ``levelK``; the run's model is level 1), or one for all: a run's
``Denoised`` model whose denoiser has ``with_sigma`` (a one-shot ``DiffusionDenoiser``) denoises
level k at σ_k's timestep (the authors' one diffusion model at every σ); any other model is
used as it is at every level. ``predict_clean`` is the authors' ``pred_uc``: the answer where
the cascade answers, else the last level's model's argmax on the clean input (the authors run
their classifier alone there, without the denoiser; ours is the level-K model, denoiser at
σ_K's timestep included). No magnitude factor: the authors' ``magnitude = 2`` converts σ to
their [−1, 1] pixels; ours are in [0, 1].

Records: CERTIFY's columns with ``sigma`` the run's (level 1's) σ, ``p_lower`` and ``nA`` of
the answering level (of the last level drawn where none answered), ``n0`` and ``n`` per level
(an input that reached level k drew k·(n0 + n)); then ``level`` (1-based, 0: none answered),
``sigma_level`` (its σ, 0: none), ``radius_neg`` and ``predict_clean``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm
from torch import nn

from ..denoisers.composition import Denoised
from ..errors import SmoothcertError
from ..noise.base import NOISES
from ..registry import list_text, number_list, option
from ..smoothing.engine import Draws
from ..stats import clopper_pearson_lower
from ..stats.multinomial import authors_off_class_upper, off_class_upper
from .certifier import (
    CERTIFY_COLUMNS,
    Certifier,
    converted_radii,
    radius_columns,
    register_certifier,
)
from .columns import Column, Relation, distance, prediction
from .deterministic import clean_scores

NO_EARLIER_BOUND = -100.0
"""``radius_neg`` where no earlier level bounds the radius (the authors' value)."""
SPLITS = ("bonferroni", "paper")
OFF_CLASS = ("clopper-pearson", "goodman")
_BELOW_ONE = float(np.nextafter(1.0, 0.0))


def parse_sigmas(value) -> tuple[float, ...]:
    """The levels' σ from ``"1.0,0.5,0.25"`` (or a number, or a list; empty or None: none
    given), each a finite number > 0, strictly decreasing; anything else is one line."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return ()
    sigmas = number_list("cascade sigmas", value, low=0.0, low_open=True)
    if any(a <= b for a, b in zip(sigmas, sigmas[1:])):
        raise SmoothcertError(f"cascade sigmas must be strictly decreasing (largest first), "
                              f"got {value}")
    return sigmas


@dataclass(frozen=True)
class LevelDraws:
    """One level's draws: its σ, the class ``selected`` by its n0 selection draws and the
    ``counts`` (C,) of its n estimation draws."""

    sigma: float
    selected: int
    counts: np.ndarray


@dataclass(frozen=True)
class CascadeCertificate:
    """Unless ``prediction`` is None (an abstention, radius 0), with probability ≥ 1−α over the
    draws of every level (``bonferroni`` split) the cascade G answers ``prediction`` on the L2
    ball of ``radius`` around x. ``level``: the 1-based level that answered (0: none);
    ``sigma``: its σ (0: none); ``radius_neg``: the module doc's; ``p_lower`` and ``count``:
    the answering level's bound and votes, or the last level drawn's on abstention."""

    prediction: int | None
    radius: float
    level: int
    sigma: float
    radius_neg: float
    p_lower: float
    count: int


@dataclass(frozen=True)
class CascadeRule:
    """The decisions of a cascade of ``levels`` levels at total level ``alpha``."""

    levels: int
    alpha: float
    p0: float = 0.5
    split: str = "bonferroni"
    off_class: str = "clopper-pearson"

    def own_level(self, k: int) -> float:
        """The level of level k's (0-based) own bounds on its selected class (each side)."""
        if self.split == "paper":
            return self.alpha / (k + 1)
        last = k == self.levels - 1
        return self.alpha / self.levels / (1 if last else 2)

    def off_level(self, k: int) -> float:
        """The level of the earlier levels' off-class bounds when level k answers."""
        if self.split == "paper":
            return self.alpha / (k + 1)
        return self.alpha / (2 * self.levels)

    def bounds(self, draws: LevelDraws, k: int) -> tuple[float, float]:
        """(lower, upper) Clopper–Pearson bounds on the selected class's probability."""
        n, votes, level = int(draws.counts.sum()), int(draws.counts[draws.selected]), \
            self.own_level(k)
        upper = 1.0 - clopper_pearson_lower(n - votes, n, level)
        return clopper_pearson_lower(votes, n, level), upper

    def goes_on(self, draws: LevelDraws, k: int) -> bool:
        """Whether the cascade draws the next level after level k's draws: neither an answer
        (lower ≥ p0) nor a stop (upper ≥ p0), and a level left."""
        return k + 1 < self.levels and self.bounds(draws, k)[1] < self.p0

    def off_radius(self, draws: LevelDraws, c: int, level: float) -> float:
        """σ_j(Φ⁻¹(p_B) − Φ⁻¹(p0)) of an earlier level for an answer c (the authors'
        ``off_class_upper_radius``)."""
        if self.off_class == "goodman":
            upper = authors_off_class_upper(draws.counts, draws.selected, c, level)
        else:
            upper = off_class_upper(draws.counts, c, level)
        return draws.sigma * (float(norm.ppf(min(upper, _BELOW_ONE))) - float(norm.ppf(self.p0)))

    def certificate(self, drawn: Sequence[LevelDraws]) -> CascadeCertificate:
        """The certificate once the cascade has stopped after the levels ``drawn``."""
        k, last = len(drawn) - 1, drawn[-1]
        lower, _ = self.bounds(last, k)
        count = int(last.counts[last.selected])
        if lower < self.p0:
            return CascadeCertificate(None, 0.0, 0, 0.0, NO_EARLIER_BOUND, lower, count)
        radius = last.sigma * (float(norm.ppf(lower)) - float(norm.ppf(self.p0)))
        offs = [self.off_radius(d, last.selected, self.off_level(k)) for d in drawn[:-1]]
        radius_neg = max(offs, default=NO_EARLIER_BOUND)
        radius = min(radius, -radius_neg) if offs else radius
        if radius < 0:  # an earlier level may answer another class at x itself: vetoed
            return CascadeCertificate(None, 0.0, 0, 0.0, radius_neg, lower, count)
        return CascadeCertificate(last.selected, radius, k + 1, last.sigma, radius_neg, lower,
                                  count)


def run_cascade(rule: CascadeRule, draw) -> CascadeCertificate:
    """The cascade on per-level draws: ``draw(k)`` gives level k's :class:`LevelDraws` (a plain
    function; the certifier's program does the same through the engine)."""
    drawn = [draw(0)]
    while rule.goes_on(drawn[-1], len(drawn) - 1):
        drawn.append(draw(len(drawn)))
    return rule.certificate(drawn)


@dataclass(frozen=True)
class Level:
    """A level as the program draws it: σ, its noise, and the model (None: the run's)."""

    sigma: float
    noise: object
    model: nn.Module | None
    num_classes: int | None


CASCADE_RULES = {
    "level": Column("int", "level is the cascade level that answered (1 = the largest "
                           "sigma), or 0 where none did", low=0),
    "sigma_level": distance("sigma_level"),
    "radius_neg": Column("float", "radius_neg is a finite number (-100: no earlier level)"),
    "predict_clean": prediction("predict_clean"),
    "levels_drawn": Column("int", "levels_drawn is the levels whose n0 + n draws were made, "
                                  "an integer >= 1", low=1),
}


@register_certifier("cascade")
class Cascade(Certifier):
    """Jeong & Shin's cascade over σ, largest first (module doc): the answer of the first
    level whose top class reaches p0, certified against every earlier level's other classes.
    Gaussian noise only (the Φ⁻¹ Lipschitz bound). The run's σ is the first level's; the
    other levels are ``sigmas`` (``--sigma 1.0,0.5,0.25`` on the command line)."""

    columns = CERTIFY_COLUMNS[:-1] + ("level", "sigma_level", "radius_neg", "predict_clean",
                                      "levels_drawn", "seed")
    column_rules = CASCADE_RULES
    relations = (
        Relation(("level", "predict"), lambda lv, p: (lv == 0) != (p == -1),
                 lambda lv, p: f"level is {lv} with predict {p}; a cascade abstains (-1) "
                               "exactly when no level answered (0)"),
        Relation(("level", "sigma_level"), lambda lv, s: (lv == 0) != (s == 0),
                 lambda lv, s: f"sigma_level is {s} with level {lv}; it is 0 exactly where "
                               "no level answered"),
    )
    needs_n0 = True
    noises = ("gaussian",)
    sigma_list_option = "sigmas"

    @dataclass(frozen=True)
    class Options:
        sigmas: str = option("", "the levels' sigma, largest first, comma-separated; the "
                                 "first is the run's sigma (empty: the run's sigma alone)",
                             convert=list_text)
        p0: float = option(0.5, "a level answers when its top class has probability >= p0 "
                                "(the authors' skip_p), in [0.5, 1)")
        alpha_split: str = option("bonferroni", "alpha per level: bonferroni (sound, alpha/K)"
                                                " or paper (alpha/k at level k, not sound)",
                                  choices=SPLITS)
        off_class: str = option("clopper-pearson", "the earlier levels' bound on the other "
                                                   "classes: clopper-pearson (exact) or "
                                                   "goodman (the authors')", choices=OFF_CLASS)

        def __post_init__(self):
            parse_sigmas(self.sigmas)
            if not 0.5 <= self.p0 < 1:
                raise SmoothcertError(f"cascade p0 must be in [0.5, 1), got {self.p0}")

    def level_sigmas(self, sigma: float) -> tuple[float, ...]:
        """The levels' σ for a run at ``sigma``: ``sigmas``, or the run's σ alone."""
        return parse_sigmas(self.sigmas) or (float(sigma),)

    def _count(self) -> int:
        return len(parse_sigmas(self.sigmas)) or 1

    def roles(self) -> tuple[str, ...]:
        return tuple(f"level{k}" for k in range(2, self._count() + 1))

    def checkpoint_roles(self, count: int) -> tuple[str, ...] | None:
        """One checkpoint for every level, or one per level (level 1 the run's); several
        checkpoints for one level are refused: they would make a one-level cascade of their
        ensemble, which no one asking for a cascade means."""
        levels = self._count()
        if count == 1:
            return None
        if levels == 1:
            raise SmoothcertError(f"a cascade takes one checkpoint per level, got {count} "
                                  "checkpoints and one sigma: give each level's sigma, largest "
                                  f"first (--sigma S1,...,S{count}), or certify their ensemble "
                                  "with --certifier certify")
        if count != levels:
            raise SmoothcertError(f"a cascade over {levels} sigmas takes one checkpoint (for "
                                  f"every level) or {levels} (one per level), got {count}")
        return self.roles()

    def check_models(self, roles: frozenset) -> None:
        """No other model (one for every level) or exactly ``level2`` … ``levelK``."""
        if roles and roles != set(self.roles()):
            want = ", ".join(self.roles()) or "none (one level)"
            raise SmoothcertError(f"a cascade over {self._count()} levels takes a model for "
                                  f"every level after the first ({want}) or none, got "
                                  f"{', '.join(sorted(roles))}")

    def check(self, config):
        """The first level is the run's σ."""
        sigmas = parse_sigmas(self.sigmas)
        if sigmas and not math.isclose(sigmas[0], float(config.sigma), rel_tol=1e-12):
            raise SmoothcertError(f"cascade sigmas start at {sigmas[0]} but the run's sigma is "
                                  f"{config.sigma}; the first level is the run's sigma")

    def clean_passes(self) -> int:
        return 1  # predict_clean: at most one forward on the clean input

    def row_passes(self, records):
        """levels_drawn·(n0 + n), plus the clean forward of ``predict_clean`` where the cascade
        abstained; None for a file from before the ``levels_drawn`` column."""
        if "levels_drawn" not in records:
            return None
        per_level = np.asarray(records["n0"], dtype=np.float64) + records["n"]
        clean = np.asarray(records["predict"]) == -1
        return np.asarray(records["levels_drawn"], dtype=np.float64) * per_level + clean

    def start(self, run):
        """The levels' noises and models, built once per run."""
        sigmas = self.level_sigmas(run.config.sigma)
        self._rule = CascadeRule(len(sigmas), run.config.alpha, self.p0, self.alpha_split,
                                 self.off_class)
        self._levels = [Level(sigmas[0], run.smoothed.noise, None, None)]
        for k, sigma in enumerate(sigmas[1:], start=2):
            self._levels.append(Level(sigma, NOISES[run.config.noise](sigma),
                                      *_level_model(run, k, sigma)))

    def program(self, run, x, label, idx, generator):
        cfg = run.config
        x = run.smoothed.prepare_input(x, generator)
        drawn = []
        for k, level in enumerate(self._levels):
            selection, estimation = yield Draws(x, level.noise, (cfg.n0, cfg.n), generator,
                                                model=level.model,
                                                num_classes=level.num_classes)
            drawn.append(LevelDraws(level.sigma, int(selection.argmax()), estimation))
            if not self._rule.goes_on(drawn[-1], k):
                break
        c = self._rule.certificate(drawn)
        predict = -1 if c.prediction is None else c.prediction
        clean = predict if predict >= 0 else self._clean(run, x)
        radii = converted_radii(c.radius, "l2", x.numel())
        return {"predict": predict, "radius": c.radius, "correct": int(predict == label),
                "p_lower": c.p_lower, "nA": c.count, "n0": cfg.n0, "n": cfg.n,
                "alpha": cfg.alpha, "sigma": cfg.sigma, **radius_columns(radii),
                "level": c.level, "sigma_level": c.sigma, "radius_neg": c.radius_neg,
                "predict_clean": clean, "levels_drawn": len(drawn)}

    def _clean(self, run, x) -> int:
        """The last level's model's argmax on the clean input."""
        model = self._levels[-1].model or run.smoothed.model
        return int(clean_scores(model, x).argmax())


def _level_model(run, k: int, sigma: float) -> tuple[nn.Module | None, int | None]:
    """Level k's model and classes: its own checkpoint (role ``level<k>``), else the run's
    denoised model with its diffusion denoiser at σ's timestep, else None (the run's)."""
    source = run.models.get(f"level{k}")
    if source is not None:
        return source.model, source.num_classes
    model = run.smoothed.model
    if isinstance(model, Denoised) and hasattr(model.denoiser, "with_sigma"):
        return Denoised(model.denoiser.with_sigma(sigma), model.classifier), None
    return None, None
