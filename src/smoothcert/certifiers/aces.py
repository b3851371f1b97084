"""ACES (Horváth, Müller, Fischer & Vechev 2022, "Robust and Accurate – Compositional
Architectures for Randomized Smoothing", arXiv 2204.00487): certified selection between a
robust smoothed model and an accurate core model.

The ACES model at an input x' is

    A(x') = g_r(x')    where g_s(x') = 1 (the smoothed selection picks the robust model),
            core(x')   where g_s(x') = 0 (it picks the core model),

g_r the robust (certification) model smoothed with the run's Gaussian noise, g_s a binary
base classifier smoothed with the same noise, core an undefended classifier used as it is.
Per input (the run's model is the robust one):

1. selection: n0 draws choose ĉ_s ∈ {0, 1}, ``selection_n`` fresh draws give p_s, the one-sided
   Clopper–Pearson lower bound on P(g_s's base classifier votes ĉ_s) at α_s = ``alpha_split``·α,
   and R_s = σΦ⁻¹(p_s) (abstain when p_s < ½) — CERTIFY of the binary selection;
2. robust: CERTIFY of the run's model at α_r = (1 − ``alpha_split``)·α: class c_r, radius R_r;
3. core: one clean forward of the core model: its class c_core.

Certificate (with probability ≥ 1 − α, a union bound over the two CERTIFYs):

* the selection certified robust (ĉ_s = 1) and the robust model certified: A predicts c_r on the
  L2 ball of radius min(R_s, R_r) (inside R_s the selection keeps the robust model, inside R_r
  the robust model keeps c_r);
* the selection certified core (ĉ_s = 0): A(x) = c_core, certified at radius 0 only (the core
  model is not smoothed);
* the selection abstained but the robust model is certified with c_r = c_core: A(x) = c_r at
  radius 0 whichever model the selection picks (the authors' "not clear what chosen but both are
  correct anyway", ``analyze_utils.get_robust_accuracy_zero``, without the label);
* otherwise −1 (abstain; radius 0).

The authors' analysis also counts, at radius 0, an input whose selection abstained when the
robust model alone is certified correct (their test ``if selection_predict and ...`` is true for
the abstention −1): not a certificate of A, since the selection may pick the core model; here it
is an abstention unless the core model agrees. Their natural accuracy comes from a separate
PREDICT pass (N1 draws of each smoothed model); these rows hold certificates only.

Selection sources (``selection``):

* ``checkpoint``: a binary classifier given as the ``selection`` model (``--model
  selection=SEL.pt``): class 1 = use the robust model, class 0 = use the core model (the authors'
  convention); it must have exactly 2 classes. Its vote is its argmax (the authors' separate
  selection network, ``smooth_selection.py``, also sweeps a threshold on its softmax; the
  argmax is their threshold ½, a tie going to the core model here);
* ``entropy``: the authors' main variant (their ``boundaries``): the base selection votes 1 where
  the entropy of softmax of the robust model's logits, normalized by log K (K classes; in
  [0, 1], scipy's ``entropy(p, base=K)``), is at most ``entropy_threshold`` θ, else 0
  (:class:`EntropySelection`). The authors compute these votes on the certification draws
  themselves (shared draws); here the selection has draws of its own: the engine counts one
  vote per draw and model, so shared draws would need one forward giving both votes. With α
  split between the two bounds, separate draws are as sound as shared ones (the union bound
  holds for any dependence); they cost n0 + ``selection_n`` more forwards of the robust model.

Gaussian noise only (the paper's): the selection's R_s and the robust model's R_r are both L2
radii of that noise. Columns: CERTIFY's (``p_lower``, ``nA``, ``n0``, ``n`` the robust model's;
``alpha`` the total α), the radius in every norm converted from the L2 ball, then ``selected``
(1 robust, 0 core, −1 the selection abstained), ``selection_p_lower``, ``selection_radius``
(R_s of ĉ_s), ``robust_predict``, ``robust_radius``, ``core_predict``. ``report --cost``
counts the robust model's n0 + n draws, the selection's n0 + ``selection_n`` and the core
model's clean pass (:meth:`Aces.row_passes`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..errors import SmoothcertError
from ..registry import option
from ..smoothing.engine import Draws, model_input
from ..smoothing.smoothed import Certificate, certificate
from ..stats import clopper_pearson_lower
from .certifier import (
    CERTIFY_COLUMNS,
    Certifier,
    converted_radii,
    radius_columns,
    register_certifier,
)
from .columns import (
    Column,
    Relation,
    a_class,
    abstention_has_radius_zero,
    distance,
    prediction,
    probability,
)

SELECTIONS = ("checkpoint", "entropy")
CORE, ROBUST = 0, 1  # the selection's classes (the authors' convention)


class EntropySelection(nn.Module):
    """The authors' entropy-based selection as a binary base classifier of the robust model:
    logits (B, 2) with 1 for class 1 (use the robust model) where the normalized entropy of
    softmax(robust(x)) is ≤ ``threshold``, else 1 for class 0 (use the core model), 0 for the
    other class (the argmax is the vote; a tie at θ goes to the robust model, as theirs)."""

    num_classes = 2

    def __init__(self, robust: nn.Module, threshold: float):
        super().__init__()
        self.robust = robust
        self.threshold = float(threshold)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        picks_robust = normalized_entropy(self.robust(x)) <= self.threshold
        return torch.stack([~picks_robust, picks_robust], dim=1).float()


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(softmax(logits)) / log K per row, (B, K) → (B,) in [0, 1] (computed in float32 at
    least, under any autocast)."""
    log_p = torch.log_softmax(logits.float(), dim=1)
    return -(log_p.exp() * log_p).sum(dim=1) / math.log(logits.shape[1])


def counts_certificate(noise, selection_counts, counts, n0: int, alpha: float,
                       dim: int) -> Certificate:
    """CERTIFY's answer from its two count vectors: ĉ the argmax of ``selection_counts`` (the
    first class on a tie), p_lower the one-sided Clopper–Pearson lower bound of its count
    among the ``counts`` at level ``alpha``, then :func:`~smoothcert.smoothing.smoothed.
    certificate` (abstention when p_lower < ½; radius σΦ⁻¹(p_lower) for Gaussian noise)."""
    c_hat = int(np.argmax(selection_counts))
    n, n_a = int(np.sum(counts)), int(counts[c_hat])
    return certificate(noise, c_hat, clopper_pearson_lower(n_a, n, alpha), n_a, n0, n,
                       alpha, dim)


@dataclass(frozen=True)
class AcesAnswer:
    """ACES' answer at one input: ``prediction`` (−1: abstain) on the ball of ``radius``
    (0: at x alone); ``selected`` 1 (robust), 0 (core) or −1 (the selection abstained)."""

    prediction: int
    radius: float
    selected: int


def combine(selection: Certificate, robust: Certificate, core: int) -> AcesAnswer:
    """The ACES certificate (this module's doc) from the smoothed selection's certificate
    (class 1: robust), the robust model's and the core model's clean class. If both
    certificates hold (probability ≥ 1 − α_s − α_r), the ACES model predicts ``prediction``
    on the ball of ``radius``."""
    selected = -1 if selection.abstained else int(selection.prediction)
    if selected == ROBUST and not robust.abstained:
        return AcesAnswer(int(robust.prediction), min(selection.radius, robust.radius), selected)
    if selected == CORE:
        return AcesAnswer(int(core), 0.0, selected)
    if selected == -1 and not robust.abstained and robust.prediction == core:
        return AcesAnswer(int(core), 0.0, selected)  # both branches give it at x
    return AcesAnswer(-1, 0.0, selected)


def aces_row(answer: AcesAnswer, selection: Certificate, robust: Certificate, core: int,
             label: int, alpha: float, norm: str, dim: int) -> dict:
    """The record row's own columns (the runner adds idx, label, time and seed)."""
    robust_predict = -1 if robust.abstained else int(robust.prediction)
    # one ball of the noise's norm (the smaller of two): the other norms are its conversions
    radii = converted_radii(answer.radius, norm, dim)
    return {"predict": answer.prediction, "radius": answer.radius,
            "correct": int(answer.prediction == label), "p_lower": robust.p_lower,
            "nA": robust.count, "n0": robust.n0, "n": robust.n, "alpha": alpha,
            "sigma": robust.sigma, **radius_columns(radii), "selected": answer.selected,
            "selection_p_lower": selection.p_lower, "selection_radius": selection.radius,
            "robust_predict": robust_predict, "robust_radius": robust.radius,
            "core_predict": int(core)}


def _radius_past_either(r, s, q):
    """Rows whose radius exceeds R_s or R_r (it is their minimum, or 0, to the last bit)."""
    return r > np.minimum(s, q)


ACES_COLUMNS = CERTIFY_COLUMNS[:-1] + ("selected", "selection_p_lower", "selection_radius",
                                       "robust_predict", "robust_radius", "core_predict", "seed")


@register_certifier("aces")
class Aces(Certifier):
    """ACES (Horváth et al. 2022): a smoothed selection between the run's model and a core model

    The robust (run's) model's smoothed prediction where a smoothed binary selection is
    certified to pick it, with radius min(R_selection, R_robust); the core model's clean
    prediction at radius 0 where it is certified to pick the core model (this module's doc).
    Models: ``core`` always; ``selection`` for ``selection=checkpoint`` (2 classes, class 1 =
    robust). α is split between the selection's and the robust model's CERTIFY
    (``alpha_split``, the authors' α/2 each). Gaussian noise."""

    columns = ACES_COLUMNS
    column_rules = {
        "selected": Column("int", "selected is 1 (robust), 0 (core) or -1 (abstention)",
                           low=-1, high=1),
        "selection_p_lower": probability("selection_p_lower"),
        "selection_radius": distance("selection_radius"),
        "robust_predict": prediction("robust_predict"),
        "robust_radius": distance("robust_radius"),
        "core_predict": a_class("core_predict"),
    }
    relations = (
        abstention_has_radius_zero("selection_radius", "selected"),
        abstention_has_radius_zero("robust_radius", "robust_predict"),
        Relation(("radius", "selection_radius", "robust_radius"), _radius_past_either,
                 lambda r, s, q: f"radius is {r}, more than min(selection_radius {s}, "
                                 f"robust_radius {q})"),
    )
    needs_n0 = True
    noises = ("gaussian",)
    model_roles = ("selection", "core")

    @dataclass(frozen=True)
    class Options:
        selection: str = option("checkpoint", "the selection: checkpoint (the selection model, "
                                "2 classes, 1 = robust) or entropy (the robust model's "
                                "normalized entropy <= entropy_threshold)", choices=SELECTIONS)
        entropy_threshold: float | None = option(None, "theta in [0, 1] of selection=entropy "
                                                 "(the authors' boundary)")
        alpha_split: float = option(0.5, "the share of alpha for the selection's bound, the "
                                    "rest for the robust model's (authors: 0.5)")
        selection_n: int | None = option(None, "the selection's estimation draws (default: "
                                         "the run's n, as the authors)")

        def __post_init__(self):
            entropy = self.selection == "entropy"
            theta = self.entropy_threshold
            if entropy and (theta is None or not 0.0 <= theta <= 1.0):
                raise SmoothcertError("selection=entropy needs entropy_threshold in [0, 1] (the "
                                      f"normalized entropy's threshold), got {theta!r}")
            if not entropy and theta is not None:
                raise SmoothcertError("entropy_threshold is for selection=entropy; "
                                      "selection=checkpoint reads the selection model")
            if not 0.0 < self.alpha_split < 1.0:
                raise SmoothcertError(f"alpha_split must be in (0, 1), got {self.alpha_split!r}")
            if self.selection_n is not None and self.selection_n < 1:
                raise SmoothcertError(f"selection_n must be >= 1, got {self.selection_n!r}")

    def needed_roles(self) -> tuple[str, ...]:
        """The models this configuration reads: core, and the selection model for
        ``selection=checkpoint``."""
        return ("selection", "core") if self.selection == "checkpoint" else ("core",)

    def check_sources(self, sources: Mapping, num_classes: int) -> None:
        """The selection model has 2 classes; the core model the run's ``num_classes``; no
        model of encoded inputs (:meth:`Certifier.check_sources`)."""
        super().check_sources(sources, num_classes)
        selection = sources.get("selection")
        if selection is not None and selection.num_classes != 2:
            raise SmoothcertError(f"the selection model must have 2 classes (1 = use the "
                                  f"robust model), it has {selection.num_classes}")
        core = sources["core"]
        if core.num_classes != num_classes:
            raise SmoothcertError(f"the core model has {core.num_classes} classes, the robust "
                                  f"(run's) model {num_classes}")

    def clean_passes(self) -> int:
        return 1  # the core model's clean prediction

    def row_passes(self, records):
        """The robust model's n0 + n and the core model's clean pass, plus the selection's
        n0 + selection_n draws (the robust model's again under ``selection=entropy``)."""
        n0, n = (np.asarray(records[c], dtype=np.float64) for c in ("n0", "n"))
        selection = self.selection_n if self.selection_n is not None else n
        return super().row_passes(records) + n0 + selection

    def start(self, run):
        self.check_models(frozenset(run.models))
        self.check_sources(run.models, run.smoothed.num_classes)
        self._core = run.models["core"].model
        self._selection = (run.models["selection"].model if self.selection == "checkpoint"
                           else EntropySelection(run.smoothed.model, self.entropy_threshold))

    def program(self, run, x, label, idx, generator):
        cfg, smoothed = run.config, run.smoothed
        x = smoothed.prepare_input(x, generator)
        alpha_s = self.alpha_split * cfg.alpha
        n_s = self.selection_n if self.selection_n is not None else cfg.n
        first, counts = yield Draws(x, smoothed.noise, (cfg.n0, n_s), generator,
                                    model=self._selection, num_classes=2)
        selection = counts_certificate(smoothed.noise, first[:2], counts[:2], cfg.n0,
                                       alpha_s, x.numel())
        robust = yield from smoothed.certify_program(x, cfg.n0, cfg.n, cfg.alpha - alpha_s,
                                                     generator)
        core = clean_class(self._core, x)
        answer = combine(selection, robust, core)
        return aces_row(answer, selection, robust, core, label, cfg.alpha, smoothed.noise.norm,
                        x.numel())


def clean_class(model: nn.Module, x: torch.Tensor) -> int:
    """The class of one clean forward of ``model`` at x (C, H, W) (the first on a tie)."""
    with torch.inference_mode():
        return int(model(model_input(model, x.unsqueeze(0)))[0].argmax())
