"""Paired uncertainty of a difference between two record files: bootstrap intervals and verdicts.

Two smoothed classifiers certified on the same test images differ in ACR (or certified accuracy
at r) by an amount that depends on which images were drawn. The paired bootstrap (Efron &
Tibshirani 1993, ch. 13) resamples *images*, keeping each image's two values together, so the
interval reflects the spread of the per-image differences, not of each file alone: on the same
images two pipelines are strongly correlated and the paired interval is much narrower than two
separate ones. Pure functions of records (no I/O); randomness from an explicit seed.

A claim "B beats A" is decided by where the interval of B − A lies: above 0 (supported), below 0
(reversed) or across 0 (a tie: these images cannot tell the two apart at this level).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import SmoothcertError
from ..runs.records import Records
from .metrics import certified_radii, correct_mask

_CHUNK = 1000  # resamples drawn at once: bounds memory at _CHUNK × examples indices
CLAIMS = {"greater": 1.0, "less": -1.0}  # the claimed sign of second − first


@dataclass(frozen=True)
class Interval:
    """A two-sided interval for a difference ``second − first``.

    ``estimate`` is the statistic's difference on the paired examples themselves; ``low`` and
    ``high`` the percentile bootstrap bounds at confidence ``level`` (the (1−level)/2 and
    (1+level)/2 quantiles of ``resamples`` resampled differences); ``count`` the number of paired
    examples. Nominal coverage: ``level`` asymptotically in ``count``.
    """

    estimate: float
    low: float
    high: float
    level: float
    resamples: int
    count: int

    def covers(self, value: float = 0.0) -> bool:
        """``low <= value <= high``."""
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return (f"{self.estimate:+.3f} [{self.low:+.3f}, {self.high:+.3f}] "
                f"({100 * self.level:g}%)")


def paired_bootstrap(
    first: np.ndarray,
    second: np.ndarray,
    statistic: Callable = np.mean,
    *,
    resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """Percentile bootstrap interval of ``statistic(second) − statistic(first)``.

    ``first`` and ``second`` are per-example values (1-D, the same length, row i of both the
    same example). Each resample draws ``count`` example indices with replacement (one
    ``numpy.random.Generator(PCG64(seed))``, so the interval is a function of the data and the
    seed) and applies ``statistic`` to both columns of the same rows. ``statistic`` must reduce
    the last axis when called as ``statistic(values, axis=-1)`` (``np.mean``, ``np.median``...).
    """
    a, b = _paired_columns(first, second)
    _check_options(resamples, level)
    rng = np.random.Generator(np.random.PCG64(seed))
    diffs = []
    for start in range(0, resamples, _CHUNK):
        rows = rng.integers(0, len(a), size=(min(_CHUNK, resamples - start), len(a)))
        diffs.append(statistic(b[rows], axis=-1) - statistic(a[rows], axis=-1))
    low, high = np.quantile(np.concatenate(diffs), [(1 - level) / 2, (1 + level) / 2])
    estimate = float(statistic(b, axis=-1) - statistic(a, axis=-1))
    return Interval(estimate=estimate, low=float(low), high=float(high), level=level,
                    resamples=resamples, count=len(a))


def verdict(interval: Interval, claimed: str = "greater") -> str:
    """Decide the claim "second is ``claimed`` than first" (``"greater"`` or ``"less"``):
    ``"supported"`` where the whole interval lies strictly on the claimed side of 0, ``"tie"``
    where it covers 0, ``"reversed"`` where it lies strictly on the other side."""
    if claimed not in CLAIMS:
        raise SmoothcertError(f"claimed must be one of {', '.join(CLAIMS)}, got {claimed!r}")
    if interval.covers(0.0):
        return "tie"
    return "supported" if CLAIMS[claimed] * interval.low > 0 else "reversed"


# --------------------------------------------------------------------------- record files
def paired_values(first: Records, second: Records,
                  value: Callable[[Records], np.ndarray]) -> tuple[np.ndarray, ...]:
    """(idx, first's, second's) per-example ``value(records)`` on the examples both files hold,
    paired by ``idx`` and sorted by it."""
    by_idx = [_by_idx(r, value(r)) for r in (first, second)]
    common = sorted(by_idx[0].keys() & by_idx[1].keys())
    if not common:
        raise SmoothcertError(f"{first.path} and {second.path} hold no example in common; "
                              "compare files certified on the same images (same --skip/--max)")
    return (np.asarray(common), *(np.array([d[i] for i in common]) for d in by_idx))


def acr_difference(first: Records, second: Records, **options) -> Interval:
    """Paired bootstrap interval of ACR(second) − ACR(first) on their common examples (an
    example's certified radius is 0 where it is wrong or abstains); ``options`` as
    :func:`paired_bootstrap` (``resamples``, ``seed``, ``level``)."""
    _, a, b = paired_values(first, second, certified_radii)
    return paired_bootstrap(a, b, np.mean, **options)


def certified_accuracy_difference(first: Records, second: Records, radius: float,
                                  **options) -> Interval:
    """Paired bootstrap interval of the difference in certified accuracy at ``radius`` (correct
    with radius ≥ ``radius``, inclusive) on the common examples."""

    def certified(records: Records) -> np.ndarray:
        radii = np.asarray(records["radius"], dtype=np.float64)
        return (correct_mask(records) & (radii >= radius)).astype(np.float64)

    _, a, b = paired_values(first, second, certified)
    return paired_bootstrap(a, b, np.mean, **options)


def _by_idx(records: Records, values: np.ndarray) -> dict:
    by_idx = {int(i): float(v) for i, v in zip(records["idx"], values)}
    if len(by_idx) != len(records):
        raise SmoothcertError(f"{records.path} repeats an idx; merge shards with "
                              "`smoothcert merge`")
    return by_idx


def _paired_columns(first, second) -> tuple[np.ndarray, np.ndarray]:
    a, b = (np.asarray(v, dtype=np.float64) for v in (first, second))
    if a.ndim != 1 or a.shape != b.shape or len(a) < 2:
        raise SmoothcertError(f"paired values must be two 1-D arrays of the same length ≥ 2, "
                              f"got shapes {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise SmoothcertError("paired values must be finite")
    return a, b


def _check_options(resamples: int, level: float) -> None:
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 100:
        raise SmoothcertError(f"resamples must be an integer ≥ 100, got {resamples!r}")
    if not 0.0 < level < 1.0:
        raise SmoothcertError(f"level must be in (0, 1), e.g. 0.95, got {level!r}")
