"""The ``ablation`` certifier: Levine & Feizi's ablation smoothing, against patches and ℓ0 attacks.

Patches (NeurIPS 2020, "(De)Randomized Smoothing for Certifiable Defense against Patch Attacks";
authors' code: alevine0/patchSmoothing, ``utils_band.py`` / ``utils_block.py:
predict_and_certify``). ``mode=column``: the base classifier sees one band of ``size`` = b
columns, the rest ablated; ``mode=block``: one b×b block. Both wrap around the image's edges.
The smoothed classifier visits EVERY position once (W bands, or H·W blocks: deterministic, no
Monte Carlo, no α, no seed), counts for each class the positions whose softmax score for it is
>= ``threshold`` θ (several classes or none per position: the engine's threshold votes) and
predicts the top count, the lowest class index among equal counts. ``radius`` is the largest
patch side m whose every placement provably leaves the prediction unchanged:
nA − nB > 2Δ, or = 2Δ with the predicted class's index below the runner-up's, Δ = m + b − 1
(column) or (m + b − 1)² (block) (:mod:`smoothcert.stats.ablation`); 0 when even m = 1 fails.
The certificate is exact: it holds with certainty for the model that ran.

ℓ0 (AAAI 2020, "Robustness Certificates for Sparse Adversarial Attacks by Randomized Ablation";
authors' code: alevine0/randomizedAblation, ``utils.py: certify``). ``mode=pixels``: the base
classifier sees ``keep`` = k of the H·W pixels drawn without replacement (every channel of a kept
pixel), from the run's generator of the input; argmax votes, as the authors' ``avg_hard_forward``
(θ is unused). As CERTIFY: ĉ_A from ``n0`` selection draws, n_A among ``n`` fresh draws,
p_lower their one-sided Clopper–Pearson bound at α; ``radius`` is the largest ρ with
p_lower − Δ(ρ) > ½, Δ(ρ) = 1 − C(d − ρ, k)/C(d, k), d = H·W: with probability ≥ 1 − α the smoothed
classifier predicts ``predict`` on every input that differs from x in at most ``radius``
pixels. It abstains (``predict`` −1, radius 0) when p_lower <= ½. (The authors record radius 0
both then and for p_lower > ½ with no pixel certified; here the second is a prediction with
radius 0.)

The base model must carry the authors' input encoding (``model.input_encoding == "ablation"``:
``train --method ablation`` builds it): an ablated pixel is NaN in pixel space
(:mod:`smoothcert.smoothing.ablation`), which only that first layer reads. ``--noise`` and
``--sigma`` mean nothing here: no noise is drawn (``uses_noise`` False).

Records: Cohen et al.'s columns (``radius`` in pixels: a patch side, or a number of pixels;
:meth:`AblationCertifier.radius_norm`), then ``nA``, ``nB`` (the top and runner-up counts in the
order above), ``n`` (positions swept, or estimation draws), ``p_lower`` (pixels: the
Clopper–Pearson bound; patches: nA/n, the top class's exact share of the positions, of which it
is trivially a lower bound) and ``n0`` (pixels: selection draws; patches: 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..data.registry import DATASETS
from ..errors import SmoothcertError
from ..registry import option
from ..smoothing.ablation import MODES, Ablation, RandomAblation, Sweep
from ..smoothing.engine import Draws
from ..stats import clopper_pearson_lower
from ..stats.ablation import l0_radius, patch_radius, top_two
from .certifier import Certifier, register_certifier
from .columns import count

ENCODING = "ablation"
"""The ``input_encoding`` a model of ablation smoothing carries (``models.encodings``)."""
PATCH_THRESHOLD = 0.2
"""θ: the authors' ``--threshhold`` default in every ``certify_*_{band,block}.py`` (MNIST,
CIFAR-10, ImageNet)."""


@register_certifier("ablation")
class AblationCertifier(Certifier):
    """Levine & Feizi's ablation smoothing: the largest certified patch side (column, block:
    exact) or number of changed pixels (pixels, ℓ0).

    Column and block sweep every position, deterministic; pixels is CERTIFY's Monte Carlo with
    probability ≥ 1 − α. The module doc states both guarantees."""

    @dataclass(frozen=True)
    class Options:
        mode: str = option("column", "what the base classifier keeps: one band of columns, one "
                           "block, or random pixels (the l0 certificate)", choices=MODES)
        size: int = option(4, "b, pixels: band width (column) or block side (block); the "
                           "authors' default 4")
        keep: int = option(45, "k: pixels kept of H*W (pixels); the AAAI paper's MNIST k=45")
        threshold: float = option(PATCH_THRESHOLD, "theta in [0, 1]: a band or block votes for "
                                  "every class whose softmax score is >= theta (column, block)")

        def __post_init__(self):
            if not 0.0 <= self.threshold <= 1.0:
                raise SmoothcertError(f"threshold is a softmax score in [0, 1], got "
                                      f"{self.threshold!r}")
            Ablation(self.mode, self.size, self.keep)  # size or keep >= 1 for the mode
            unused = {"pixels": ("size", "threshold")}.get(self.mode, ("keep",))
            for name in unused:  # a value that would be silently ignored is refused
                if getattr(self, name) != _DEFAULTS[name]:
                    raise SmoothcertError(f"{name} is not an option of mode {self.mode!r}; "
                                          f"drop it")

    columns = ("idx", "label", "predict", "radius", "correct", "time",
               "nA", "nB", "n", "p_lower", "n0", "seed")
    column_rules = {"nB": count("nB")}
    needs_n0 = True  # pixels' selection draws (column and block take none: their n0 is 0)
    uses_noise = False

    def setup(self) -> None:
        self.ablation = Ablation(self.mode, self.size, self.keep)

    def radius_norm(self) -> str:
        """``radius`` is a patch side (column, block) or a number of pixels (pixels)."""
        return "ℓ0, pixels changed" if self.mode == "pixels" else "patch side, pixels"

    def check(self, config) -> None:
        """A band, block or ``keep`` that does not fit the registered dataset's images."""
        spec = DATASETS.get(config.dataset)
        if spec is not None:
            self.ablation.check(spec.input_shape)

    def check_model(self, model, input_shape) -> None:
        """Refuse a model without the ablation encoding, and an ablation that does not fit
        ``input_shape`` (C, H, W; None: the model's ``input_shape``, where it has one), before
        any record is written."""
        if getattr(model, "input_encoding", None) != ENCODING:
            raise SmoothcertError("certifier 'ablation' needs a model that reads ablated pixels "
                                  "(input_encoding 'ablation'); train it with --method ablation")
        shape = input_shape if input_shape is not None else getattr(model, "input_shape", None)
        if shape is not None:
            self.ablation.check(shape)

    def program(self, run, x, label, idx, generator):
        x = run.smoothed.prepare_input(x)
        self.ablation.check(x.shape)
        if self.mode == "pixels":
            row = yield from self._pixels(run, x, generator)
        else:
            row = yield from self._patches(x)
        return {**row, "correct": int(row["predict"] == label)}

    def _patches(self, x):
        """Every band or block position once, threshold votes; the exact patch certificate."""
        n = self.ablation.positions(x.shape)
        (counts,) = yield Draws(x, Sweep(self.ablation), (n,), threshold=self.threshold)
        t = top_two(counts)
        radius = patch_radius(t, self.mode, self.size, min(x.shape[-2:]))
        # no class reaches θ at any position: the authors' argmax of zeros says class 0; we
        # abstain instead, so that such an image never counts as a correct class-0 prediction
        predict = t.top if t.count > 0 else -1
        return {"predict": predict, "radius": radius, "nA": t.count, "nB": t.runner_up_count,
                "n": n, "p_lower": t.count / n, "n0": 0}

    def _pixels(self, run, x, generator):
        """CERTIFY's two segments with random pixel ablation, then the ℓ0 radius."""
        cfg = run.config
        noise = RandomAblation(self.ablation)
        selection, estimation = yield Draws(x, noise, (cfg.n0, cfg.n), generator)
        c_hat = int(selection.argmax())
        n_a = int(estimation[c_hat])
        n_b = int(max(c for i, c in enumerate(estimation) if i != c_hat))
        p_lower = clopper_pearson_lower(n_a, cfg.n, cfg.alpha)
        rho = l0_radius(p_lower, x.shape[-2] * x.shape[-1], self.keep)
        predict = -1 if rho is None else c_hat
        return {"predict": predict, "radius": 0 if rho is None else rho, "nA": n_a, "nB": n_b,
                "n": cfg.n, "p_lower": p_lower, "n0": cfg.n0}


_DEFAULTS = AblationCertifier.option_defaults()
