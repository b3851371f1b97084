"""Certified segmentation (Fischer, Baader & Vechev, "Scalable Certified Segmentation via
Randomized Smoothing", ICML 2021; authors' code eth-sri/segmentation-smoothing,
``code/multiclassify_utils.py`` ``certify`` and ``tools/test_smoothing.py``).

One row per image. The model maps an image (C, H, W) to logits (K, H, W); the engine draws
``n0`` selection and ``n`` estimation noisy copies under Gaussian noise of the run's σ and
counts each pixel's argmax votes (``Draws(outputs="pixel-votes")``). Per pixel the top class of
the selection votes is tested against the threshold τ with its estimation votes, and the H·W
tests are corrected together (Holm by default, or Bonferroni) at the run's α
(:func:`smoothcert.stats.segmentation.certify_pixels`). Guarantee, per image: with probability
≥ 1−α over its draws, every certified pixel's smoothed class is its recorded class on the whole
ℓ2 ball of radius σΦ⁻¹(τ) (``radius``, the same for every pixel and image); the other pixels
abstain. The authors' defaults: τ 0.75, n0 100, n 1000 (``--n0 100 --n 1000``), α 1e-4, σ 0.25.

Records (:data:`SEGMENT_COLUMNS`): pixel counts over the image (``certified``, ``abstained``:
all pixels; ``labelled``, ``certified_correct``: pixels whose label is not the dataset's
``ignore_index``), ``pixel_accuracy`` = certified_correct / labelled (0 without a labelled
pixel; the authors' certified pixel accuracy), ``abstain_rate`` = abstained / (H·W), and per
class ``tp``, ``fp``, ``fn`` over the labelled pixels (tp_c: certified c and labelled c; fp_c:
certified c, labelled another class; fn_c: labelled c and not certified c, abstentions
included: the authors' confusion matrix with abstention as a class), from which a dataset's
certified mIoU is mean_c Σtp / Σ(tp + fp + fn). The artifact ``map`` (a PNG beside the records,
its hash in ``map_sha256``) is each pixel's certified class, 255 where it abstains.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import norm

from ..errors import SmoothcertError
from ..registry import option
from ..smoothing.engine import Draws
from ..stats.segmentation import (
    CORRECTIONS,
    PixelCertificates,
    certify_pixels,
    check_tau,
    segmentation_radius,
)
from .certifier import Certifier, register_certifier
from .certify import note_too_few_draws
from .columns import Column, Relation, count, format_vector, probability, sha256

ABSTAIN = 255
"""The ``map`` artifact's value of a pixel that abstains (so at most 255 classes)."""

SEGMENT_COLUMNS = ("idx", "labelled", "certified", "certified_correct", "abstained",
                   "pixel_accuracy", "abstain_rate", "tp", "fp", "fn", "tau", "radius", "n0",
                   "n", "alpha", "correction", "sigma", "map_sha256", "time", "seed")


def _per_class(name: str, says: str) -> Column:
    return Column("vector", f"{name} is one count per class ({says}), integers >= 0", low=0)


SEGMENT_RULES = {
    "labelled": count("labelled"),
    "certified": count("certified"),
    "certified_correct": count("certified_correct"),
    "abstained": count("abstained"),
    "pixel_accuracy": probability("pixel_accuracy"),
    "abstain_rate": probability("abstain_rate"),
    "tp": _per_class("tp", "certified with their label"),
    "fp": _per_class("fp", "certified with another class than their label"),
    "fn": _per_class("fn", "labelled with it and not certified with it"),
    "tau": Column("float", "tau is a threshold in [0.5, 1)", low=0.5, high=1.0),
    "correction": Column("text", f"correction is one of {', '.join(CORRECTIONS)}",
                         choices=CORRECTIONS),
    "map_sha256": sha256("map_sha256"),
}


@dataclass(frozen=True)
class SegmentCounts:
    """One image's pixel counts and per-class (K,) tp, fp, fn (module doc)."""

    labelled: int
    certified: int
    certified_correct: int
    abstained: int
    tp: np.ndarray
    fp: np.ndarray
    fn: np.ndarray

    @property
    def pixel_accuracy(self) -> float:
        return self.certified_correct / self.labelled if self.labelled else 0.0


def segment_counts(certificates: PixelCertificates, label: np.ndarray,
                   ignore_index: int | None, num_classes: int) -> SegmentCounts:
    """The counts of one image from its pixels' certificates (m pixels, row-major) and its
    labels (m,) int64 in [0, ``num_classes``) or ``ignore_index`` (None: every pixel is
    labelled)."""
    labelled = np.ones(label.shape, dtype=bool) if ignore_index is None \
        else label != ignore_index
    certified = certificates.certified
    answer = np.where(certified, certificates.classes, -1)  # -1: abstains
    classes = np.arange(num_classes)[:, None]  # (K, 1) against (m,) pixels
    is_label = (label[None, :] == classes) & labelled
    is_answer = (answer[None, :] == classes) & labelled
    tp = (is_label & is_answer).sum(axis=1)
    fp = (~is_label & is_answer).sum(axis=1)
    fn = (is_label & ~is_answer).sum(axis=1)
    return SegmentCounts(int(labelled.sum()), int(certified.sum()), int(tp.sum()),
                         int((~certified).sum()), tp, fp, fn)


def certified_map(certificates: PixelCertificates, shape: tuple) -> np.ndarray:
    """The ``map`` artifact: uint8 (H, W), each pixel's certified class, :data:`ABSTAIN`
    where it abstains."""
    return certificates.prediction(ABSTAIN).astype(np.uint8).reshape(shape)


@register_certifier("segment")
class Segment(Certifier):
    """Fischer et al.'s certified segmentation (module doc): per pixel, the class of the
    ``n0`` selection draws if its ``n`` estimation votes reject p ≤ ``tau`` after the
    ``correction`` over the image's pixels at the run's α; certified on the ℓ2 ball of radius
    σΦ⁻¹(τ). Gaussian noise only."""

    columns = SEGMENT_COLUMNS
    column_rules = SEGMENT_RULES
    relations = (
        Relation(("certified_correct", "certified", "labelled"),
                 lambda k, c, n: (k > c) | (k > n),
                 lambda k, c, n: f"certified_correct is {k} with certified {c} and labelled "
                                 f"{n}; it counts labelled pixels certified with their label"),
        Relation(("radius", "sigma", "tau"),
                 lambda r, s, t: ~np.isclose(r, s * norm.ppf(t), rtol=1e-9, atol=1e-12),
                 lambda r, s, t: f"radius is {r} with sigma {s} and tau {t}; it is "
                                 "sigma * Phi^-1(tau)"),
    )
    tasks = ("segmentation",)
    needs_n0 = True
    noises = ("gaussian",)

    @dataclass(frozen=True)
    class Options:
        tau: float = option(0.75, "a pixel is certified when its top class's probability is "
                                  "shown above tau, in [0.5, 1); radius sigma * Phi^-1(tau) "
                                  "(the authors' default 0.75)")
        correction: str = option("holm", "the multiple-testing correction over an image's "
                                         "pixels: holm (step-down) or bonferroni",
                                 choices=CORRECTIONS)

        def __post_init__(self):
            check_tau(self.tau)

    def radius(self, sigma: float) -> float:
        return segmentation_radius(sigma, self.tau)

    def check_sources(self, sources, num_classes):
        """At most 255 classes: the ``map`` is 8-bit, 255 its abstention (checked here, the
        runner's last check with the run's classes before the record file is opened)."""
        if num_classes > ABSTAIN:
            raise SmoothcertError(f"certifier 'segment' writes 8-bit maps with 255 for "
                                  f"abstention: at most 255 classes, got {num_classes}")

    def start(self, run):
        self._radius = self.radius(run.config.sigma)  # one Φ⁻¹ per run, not per image
        self._note_too_few_draws(run.config, getattr(run.dataset, "input_shape", None))

    def _note_too_few_draws(self, config, shape) -> None:
        """A note when even n votes of n at every pixel cannot pass α / (H·W), H·W the run's
        image size (the dataset's ``input_shape``: a segfolder's ``--image-size``); a dataset
        that states no shape gets none."""
        if shape is None:
            return
        pixels = int(shape[-2]) * int(shape[-1])
        note_too_few_draws(config, lambda n: None if self.tau**n <= config.alpha / pixels
                           else f"n votes of n give p-value tau^n = {self.tau**n:.3g} > "
                                f"alpha / {pixels} pixels")

    def program(self, run, x, label, idx, generator):
        cfg = run.config
        x = run.smoothed.prepare_input(x, generator)
        # the runner has checked the mask: (H, W) integers, classes or the dataset's ignore
        # index (runs/tasks.py: Examples.ignore_index, None where the dataset names none)
        label = torch.as_tensor(label).cpu().numpy().astype(np.int64).reshape(-1)
        counts = yield Draws(x, run.smoothed.noise, (cfg.n0, cfg.n), generator,
                             outputs="pixel-votes")
        selection, estimation = np.asarray(counts)
        c = certify_pixels(selection, estimation, self.tau, cfg.alpha, self.correction)
        s = segment_counts(c, label, getattr(run.dataset, "ignore_index", None),
                           run.smoothed.num_classes)
        return {"labelled": s.labelled, "certified": s.certified,
                "certified_correct": s.certified_correct, "abstained": s.abstained,
                "pixel_accuracy": s.pixel_accuracy, "abstain_rate": s.abstained / label.size,
                "tp": format_vector(s.tp), "fp": format_vector(s.fp), "fn": format_vector(s.fn),
                "tau": self.tau, "radius": self._radius, "n0": cfg.n0, "n": cfg.n,
                "alpha": cfg.alpha, "correction": self.correction, "sigma": cfg.sigma,
                "artifacts": {"map": certified_map(c, tuple(x.shape[-2:]))}}
