"""Summaries of the dense tasks' record files: certified segmentation (the ``segment``
certifier, Fischer et al. 2021) and median smoothing (``median``, Chiang et al. 2020).

A segmentation file's rows count pixels per image; the dataset's numbers are sums over its
images, as Fischer et al. report them: certified pixel accuracy Σ certified_correct / Σ labelled
(an abstained pixel counts as wrong), the abstention rate Σ abstained / Σ pixels, and certified
mIoU, the mean over the classes present of tp / (tp + fp + fn) from the summed per-class counts
(a pixel that abstains is a false negative of its class). The authors average over all K
classes, an absent one counting 0; the two agree wherever every class occurs, as on their full
test sets, and differ on a few images that miss some. A median file's rows hold per output
the smoothed value and its certified interval at each ε of its grid; a file's numbers at ε are
means over its images and outputs: the interval's width, and the clean error
|median − target| of the smoothed regressor (at ε = 0, no certificate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..certifiers.columns import parse_vector
from ..errors import SmoothcertError
from .tables import Table


def is_segment_records(records) -> bool:
    return all(c in records for c in ("certified_correct", "labelled", "tp"))


def is_median_records(records) -> bool:
    return all(c in records for c in ("median", "lower", "upper", "eps"))


@dataclass(frozen=True)
class SegmentSummary:
    """A segmentation record file's certified pixel accuracy, abstention and mIoU."""

    name: str
    images: int
    pixel_accuracy: float
    abstain_rate: float
    miou: float
    radius: float


def summarize_segment(records) -> SegmentSummary:
    labelled = float(np.sum(records["labelled"]))
    pixels = np.sum(records["certified"]) + np.sum(records["abstained"])
    tp, fp, fn = (np.sum([parse_vector(c) for c in records[k]], axis=0) for k in ("tp", "fp",
                                                                                  "fn"))
    union = tp + fp + fn
    present = (tp + fn) > 0  # classes some labelled pixel has
    miou = float(np.mean(tp[present] / union[present])) if present.any() else float("nan")
    radius = float(records["radius"][0]) if len(records) else float("nan")
    return SegmentSummary(records.name, len(records),
                          float(np.sum(records["certified_correct"])) / labelled if labelled
                          else float("nan"),
                          float(np.sum(records["abstained"])) / pixels if pixels
                          else float("nan"), miou, radius)


def segment_table(records: Sequence) -> Table:
    """One row per segmentation file: images, σ, τ, correction, radius, certified pixel
    accuracy, abstention, certified mIoU."""
    rows = []
    for r in records:
        s = summarize_segment(r)
        first = {k: (r[k][0] if len(r) and k in r else None) for k in ("sigma", "tau",
                                                                       "correction")}
        rows.append((s.name, s.images, first["sigma"], first["tau"], first["correction"],
                     s.radius, s.pixel_accuracy, s.abstain_rate, s.miou))
    return Table(
        keys=("name", "images", "sigma", "tau", "correction", "radius", "pixel_accuracy",
              "abstain_rate", "miou"),
        headers=("name", "images", "σ", "τ", "correction", "radius", "cert. pixel acc",
                 "abstain", "cert. mIoU"),
        styles=("text", "int", "float2", "float2", "text", "float3", "percent", "percent",
                "percent"),
        rows=tuple(rows))


@dataclass(frozen=True)
class MedianSummary:
    """A median-smoothing record file: its ε grid, the mean certified width at each ε and the
    smoothed regressor's mean clean error."""

    name: str
    images: int
    eps: tuple
    width: tuple
    error: float


def summarize_median(records) -> MedianSummary:
    eps = tuple(parse_vector(records["eps"][0]).ravel()) if len(records) else ()
    lower = np.stack([np.atleast_2d(parse_vector(c)) for c in records["lower"]])
    upper = np.stack([np.atleast_2d(parse_vector(c)) for c in records["upper"]])
    median = np.stack([parse_vector(c) for c in records["median"]])
    target = np.stack([parse_vector(c) for c in records["target"]])
    width = tuple(float(w) for w in np.mean(upper - lower, axis=(0, 2)))
    return MedianSummary(records.name, len(records), eps, width,
                         float(np.mean(np.abs(median - target))))


def median_table(records: Sequence) -> Table:
    """One row per median file: images, clean error, then the mean certified width at each ε
    of the first file's grid (``w@ε``; a file of another grid leaves them empty)."""
    summaries = [summarize_median(r) for r in records]
    grid = summaries[0].eps if summaries else ()
    labels = [f"w@{e:g}" for e in grid]
    rows = tuple((s.name, s.images, s.error,
                  *(s.width if s.eps == grid else (None,) * len(grid))) for s in summaries)
    return Table(keys=("name", "images", "clean_error", *labels),
                 headers=("name", "images", "median error", *labels),
                 styles=("text", "int", "float3", *["float3"] * len(grid)), rows=rows)


def dense_table(records: Sequence) -> Table | None:
    """The table of segmentation or median files (all of one kind), None for other files;
    refused in one line when they are mixed with each other or with classification files."""
    kinds = {"segment" if is_segment_records(r) else "median" if is_median_records(r)
             else "other" for r in records}
    if kinds == {"other"}:
        return None
    if len(kinds) > 1:
        raise SmoothcertError("segmentation, median-smoothing and classification record files "
                              "cannot share one table; report them separately")
    return segment_table(records) if kinds == {"segment"} else median_table(records)
