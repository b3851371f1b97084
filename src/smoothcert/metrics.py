"""Metrics of a smoothed classifier: pure functions of record files (no I/O here).

Conventions (Cohen et al. 2019, ``analyze.py``): an example is *certified at radius r* when the
smoothed classifier's prediction is correct and its certified radius is ``>= r`` (inclusive).
Abstentions (``predict == -1``, radius 0) and wrong predictions count as 0 in certified accuracy
and in the average certified radius (ACR, Zhai et al. 2020), whatever radius was recorded for them.
Every fraction is over *all* examples of the file, abstentions included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import SmoothcertError
from .records import Records

ABSTAIN = -1  # the ``predict`` value of an abstention, as in Cohen et al.'s files
MAX_RADII = 10_000  # a radius grid longer than this is a typo, not a table


# --------------------------------------------------------------------------- per-example columns
def _check_rows(records: Records) -> None:
    if len(records) == 0:
        raise SmoothcertError(f"{records.path} has no rows (only a header); certify some examples")


def correct_mask(records: Records) -> np.ndarray:
    """Boolean, one per example: the smoothed prediction equals the label (never on abstention).

    Uses the ``correct`` column; files without one fall back to ``predict == label``.
    """
    _check_rows(records)
    if "correct" in records:
        return np.asarray(records["correct"]) == 1
    return (records["predict"] == records["label"]) & (records["predict"] != ABSTAIN)


def certified_radii(records: Records) -> np.ndarray:
    """float64, one per example: the radius if the prediction is correct, else 0."""
    correct = correct_mask(records)
    return np.where(correct, np.asarray(records["radius"], dtype=np.float64), 0.0)


# --------------------------------------------------------------------------- the metrics
def certified_accuracy(records: Records, radii: Sequence[float]) -> np.ndarray:
    """Fraction of examples that are correct with radius ``>= r``, for each r in ``radii``.

    Returns float64 of shape ``(len(radii),)`` with values in [0, 1].
    """
    radii = np.asarray(radii, dtype=np.float64).reshape(-1)
    correct = correct_mask(records)
    radius = np.asarray(records["radius"], dtype=np.float64)
    certified = correct[:, None] & (radius[:, None] >= radii[None, :])
    return certified.mean(axis=0, dtype=np.float64)


def certified_accuracy_curve(records: Records) -> tuple[np.ndarray, np.ndarray]:
    """The exact step function r ↦ certified accuracy at r, as breakpoints.

    Returns ``(r, acc)``: r = 0 followed by the sorted distinct positive radii of the correct
    examples; ``acc[i]`` is the certified accuracy at ``r[i]``, which is also its value on the
    whole interval ``(r[i-1], r[i]]`` (the function is non-increasing and left-continuous), and
    it is 0 beyond ``r[-1]``.
    """
    radius = certified_radii(records)
    correct = correct_mask(records)
    breaks = np.unique(np.concatenate([[0.0], radius[correct & (radius > 0)]]))
    return breaks, certified_accuracy(records, breaks)


def average_certified_radius(records: Records) -> float:
    """ACR: mean over all examples of radius · 1[correct] (abstentions and errors count 0)."""
    return float(np.mean(certified_radii(records)))


def abstention_rate(records: Records) -> float:
    """Fraction of examples on which the smoothed classifier abstained (``predict == -1``)."""
    _check_rows(records)
    return float(np.mean(np.asarray(records["predict"]) == ABSTAIN))


def clean_accuracy(records: Records) -> float:
    """Fraction of examples the smoothed classifier gets right (abstentions count as wrong).

    For a CERTIFY file this equals the certified accuracy at radius 0.
    """
    return float(np.mean(correct_mask(records)))


# --------------------------------------------------------------------------- one file in numbers
@dataclass(frozen=True)
class Summary:
    """The headline numbers of one record file.

    ``acr`` is None and ``certified_accuracy`` empty when the file has no radius column (a
    PREDICT file); ``certified_accuracy[i]`` belongs to ``radii[i]``. ``mean_time`` is in seconds
    per example, None when the file has no time column.
    """

    name: str
    count: int
    clean_accuracy: float
    abstention_rate: float
    acr: float | None
    radii: tuple
    certified_accuracy: tuple
    mean_time: float | None

    @property
    def has_radius(self) -> bool:
        return self.acr is not None


def summarize(records: Records, radii: Sequence[float]) -> Summary:
    """All metrics of ``records`` at the given radii (see the module docstring for conventions)."""
    _check_rows(records)
    radii = tuple(float(r) for r in radii)
    has_radius = "radius" in records
    return Summary(
        name=records.name,
        count=len(records),
        clean_accuracy=clean_accuracy(records),
        abstention_rate=abstention_rate(records),
        acr=average_certified_radius(records) if has_radius else None,
        radii=radii,
        certified_accuracy=(
            tuple(float(a) for a in certified_accuracy(records, radii)) if has_radius else ()
        ),
        mean_time=float(np.mean(records["time"])) if "time" in records else None,
    )


# --------------------------------------------------------------------------- radius grids
def parse_radii(text: str) -> tuple[float, ...]:
    """Radii from ``"start:stop:step"`` (stop included, within rounding) or ``"0,0.5,1"``.

    Grid points are ``round(start + i·step, 10)``, so ``"0:0.5:0.1"`` gives exactly
    0, 0.1, 0.2, 0.3, 0.4, 0.5 (no accumulated floating-point error). Radii must be finite,
    non-negative and distinct; anything else raises SmoothcertError.
    """
    text = str(text).strip()
    if not text:
        raise SmoothcertError("radii are empty; give 'start:stop:step' (e.g. 0:1:0.25) or '0,1'")
    radii = _parse_range(text) if ":" in text else tuple(_number(p, text) for p in text.split(","))
    _check_radii(radii, text)
    return radii


def _parse_range(text: str) -> tuple[float, ...]:
    parts = text.split(":")
    if len(parts) != 3:
        raise SmoothcertError(f"radii {text!r}: a range needs exactly 'start:stop:step'")
    start, stop, step = (_number(p, text) for p in parts)
    if step <= 0:
        raise SmoothcertError(f"radii {text!r}: step must be positive, got {step!r}")
    if stop < start:
        raise SmoothcertError(f"radii {text!r}: stop {stop!r} is below start {start!r}")
    count = math.floor((stop - start) / step + 1e-9) + 1  # 1e-9: stop counts despite rounding
    if count > MAX_RADII:
        raise SmoothcertError(f"radii {text!r} give {count} radii; at most {MAX_RADII} allowed")
    return tuple(round(start + i * step, 10) for i in range(count))


def _number(part: str, text: str) -> float:
    try:
        value = float(part)
    except ValueError:
        raise SmoothcertError(f"radii {text!r}: {part.strip()!r} is not a number") from None
    if not math.isfinite(value):
        raise SmoothcertError(f"radii {text!r}: {part.strip()!r} is not a finite number")
    return value


def _check_radii(radii: tuple[float, ...], text: str) -> None:
    negative = [r for r in radii if r < 0]
    if negative:
        raise SmoothcertError(f"radii {text!r}: a radius cannot be negative, got {negative[0]!r}")
    if len(set(radii)) != len(radii):
        raise SmoothcertError(f"radii {text!r}: each radius may appear only once")
