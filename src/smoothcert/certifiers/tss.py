"""The ``tss`` certifier: Li et al.'s transformation-specific smoothing (TSS, CCS 2021; authors'
code AI-secure/semantic-randomized-smoothing, ``semantic/core.py: SemanticSmooth.certify``
with a transformer's ``calc_radius``, ``semantic/certify.py``).

The smoothed classifier is g(x) = argmax_c P_θ(f(T(x, θ)) = c), θ drawn from the
transformation's smoothing distribution (``transform``: a name of
:data:`smoothcert.transforms.TRANSFORMS` with its parameters, ``brightness:sigma_b=0.2``). As
CERTIFY (Cohen et al. 2019): ĉ_A from ``n0`` selection draws, n_A among ``n`` fresh draws, p_lower
their one-sided Clopper–Pearson bound at α, and ``radius`` = the transformation's radius of
p_lower (:mod:`smoothcert.stats.tss`). Guarantee: with probability ≥ 1 − α, g predicts
``predict`` on every transformation of x in the certified set — a brightness shift |b| <
radius at contrast factors in [factor_low, factor_high], contrast factors in [factor_low,
factor_high], a blur of variance < radius, a cyclic shift of ℓ2 length < radius pixels. It
abstains (``predict`` −1, radius 0) where the radius is not positive (p_lower <= ½, or a
contrast margin that eats the shift bound). The authors abstain below a radius of 10⁻⁶ and
run their n draws in batches, keeping the last batch's bound: the same bound on all n.

Rotation and scaling are not resolvable: for them (``Transformation.sampled``) the smoothed
classifier adds Gaussian pixel noise instead, and the program is TSS's sampling-based
certification (``tss_slices.py``): ``radius`` is the certified range of angles (degrees) or
scale factors (1 ± radius, the factors in ``factor_low``, ``factor_high``), with the same
guarantee and α.

The run draws no noise of its own: the transformation is the smoothing distribution (a sampled
one's pixel noise is one of its parameters), so the run's ``--noise``/``--sigma`` are none
(``uses_noise`` False, as ablation smoothing) and its parameters live in the identity's
``options.transform``, written in one canonical text
(:func:`smoothcert.transforms.canonical_name`: every parameter, defaults included).

Records: Cohen et al.'s columns (``radius`` in the transformation's unit: :meth:`radius_norm`,
which ``report`` shows), then ``p_lower``, ``nA``, ``n0``, ``n``, ``alpha``, and
``factor_low``, ``factor_high``: the factors the certificate covers — contrast factors e^k
(contrast: the certified range; brightness: [k_low, k_high]) or scale factors (scaling); 1 and
1 for blur, translation, rotation and abstentions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data.registry import DATASETS
from ..errors import SmoothcertError
from ..registry import option
from ..smoothing.engine import Draws
from ..stats import clopper_pearson_lower
from ..transforms import Transformation, build_transformation, canonical_text
from ..transforms.base import how_to_name
from .certifier import Certifier, register_certifier
from .certify import best_certify, note_too_few_draws
from .columns import Column, Relation
from .tss_slices import certify_slices


@register_certifier("tss")
class TSS(Certifier):
    """Li et al., CCS 2021 (TSS): CERTIFY over a semantic transformation's parameters; the
    radius is a brightness shift, a contrast range, a blur variance or a shift in pixels.

    Holds with probability ≥ 1 − α (module doc); −1 is an abstention."""

    @dataclass(frozen=True)
    class Options:
        transform: str = option("", "the transformation and its smoothing parameters, "
                                    "NAME:KEY=VALUE,... (--transform; listed under --transform "
                                    "NAME); required", convert=canonical_text)

        def __post_init__(self):
            if self.transform is None:
                raise SmoothcertError(f"no transformation given: {how_to_name()}")

    columns = ("idx", "label", "predict", "radius", "correct", "time",
               "p_lower", "nA", "n0", "n", "alpha", "factor_low", "factor_high", "seed")
    column_rules = {
        "factor_low": Column("float", "factor_low is a contrast or scale factor in (0, 1]",
                             low=0.0, high=1.0, low_open=True),
        "factor_high": Column("float", "factor_high is a finite contrast or scale factor >= 1",
                              low=1.0),
    }
    relations = (Relation(("factor_low", "factor_high", "predict"),
                          lambda lo, hi, p: (p == -1) & ((lo != 1) | (hi != 1)),
                          lambda lo, hi, p: f"factor_low, factor_high are {lo}, {hi} with "
                                            "predict -1; an abstention certifies no factor"),)
    needs_n0 = True
    uses_noise = False

    def setup(self) -> None:
        self.transformation = build_transformation(self.transform) if self.transform else None

    def required(self) -> Transformation:
        """The transformation, or one SmoothcertError line saying how to name one."""
        if self.transformation is None:
            raise SmoothcertError(f"certifier 'tss' needs a transformation: {how_to_name()}")
        return self.transformation

    def radius_norm(self) -> str:
        """The transformation's unit (e.g. "brightness shift, pixel units")."""
        return self.transformation.unit if self.transformation is not None else \
            "transformation's own unit"

    def check(self, config) -> None:
        """No transformation, one that does not fit the dataset's images, or a note when ``n``
        draws at level α cannot certify any input."""
        t = self.required()
        shape = getattr(DATASETS.get(config.dataset), "input_shape", None)
        if shape is not None:
            t.check_shape(shape)
        level = config.alpha / (t.slices + 1) if t.sampled else config.alpha
        note_too_few_draws(config, lambda n: best_certify(n, level, t.radius))

    def check_model(self, model: torch.nn.Module, input_shape) -> None:
        """Refuse a model of encoded inputs (ablation smoothing's) and a transformation that
        does not fit ``input_shape`` (C, H, W; None: the model's, where it says one)."""
        encoding = getattr(model, "input_encoding", None)
        if encoding is not None:
            raise SmoothcertError(f"the model reads {encoding}-encoded inputs (trained with "
                                  f"--method {encoding}); certify it with --certifier "
                                  f"{encoding}, not 'tss'")
        shape = input_shape if input_shape is not None else getattr(model, "input_shape", None)
        if shape is not None:
            self.required().check_shape(shape)

    def program(self, run, x, label, idx, generator):
        cfg, t = run.config, self.required()
        x = run.smoothed.prepare_input(x)
        t.check_input(x)
        if t.sampled:
            return (yield from certify_slices(t, cfg, x, label, generator))
        selection, estimation = yield Draws(x, t, (cfg.n0, cfg.n), generator)
        c_hat = int(selection.argmax())
        n_a = int(estimation[c_hat])
        p_lower = clopper_pearson_lower(n_a, cfg.n, cfg.alpha)
        radius = float(t.radius(p_lower))
        abstain = not radius > 0.0
        low, high = (1.0, 1.0) if abstain else t.certified_factors(p_lower)
        predict = -1 if abstain else c_hat
        return {"predict": predict, "radius": 0.0 if abstain else radius,
                "correct": int(predict == label), "p_lower": p_lower, "nA": n_a,
                "n0": cfg.n0, "n": cfg.n, "alpha": cfg.alpha,
                "factor_low": float(low), "factor_high": float(high)}
