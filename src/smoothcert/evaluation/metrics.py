"""Metrics of a smoothed classifier: pure functions of record files (no I/O here).

Conventions (Cohen et al. 2019, ``analyze.py``): an example is *certified at radius r* when the
smoothed classifier's prediction is correct and its certified radius is ``>= r`` (inclusive).
Abstentions (``predict == -1``, radius 0) and wrong predictions count as 0 in certified accuracy
and in the average certified radius (ACR, Zhai et al. 2020), whatever radius was recorded for them.
Every fraction is over *all* examples of the file, abstentions included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import SmoothcertError
from ..radii import MAX_RADII, parse_radii  # noqa: F401  (one grammar, re-exported)
from ..runs.records import Records

ABSTAIN = -1  # the ``predict`` value of an abstention, as in Cohen et al.'s files


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
    per example, None when the file has no time column. ``adjusted`` counts the certificates
    that the memory-based certifier (data-dependent smoothing) changed; None when the file has no
    ``adjusted`` column. ``sigma`` is (min, mean, max) of the ``sigma`` column (σ_x per example
    for data-dependent files, one σ otherwise); None when the file has no such column or no row.
    """

    name: str
    count: int
    clean_accuracy: float
    abstention_rate: float
    acr: float | None
    radii: tuple
    certified_accuracy: tuple
    mean_time: float | None
    adjusted: int | None = None
    sigma: tuple | None = None

    @property
    def has_radius(self) -> bool:
        """Whether the file certifies radii (CERTIFY-like) rather than only predicting."""
        return self.acr is not None

    @property
    def sigma_varies(self) -> bool:
        """Whether the file's rows hold more than one σ (a data-dependent file's σ_x)."""
        return self.sigma is not None and self.sigma[0] != self.sigma[2]


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
        adjusted=int(np.sum(records["adjusted"])) if "adjusted" in records else None,
        sigma=_sigma_range(records),
    )


def _sigma_range(records: Records) -> tuple | None:
    """(min, mean, max) of the ``sigma`` column as floats; None without the column or rows."""
    if "sigma" not in records or not len(records):
        return None
    sigma = np.asarray(records["sigma"], dtype=np.float64)
    low, high = float(sigma.min()), float(sigma.max())
    return low, low if low == high else float(sigma.mean()), high  # one σ: exactly it


# --------------------------------------------------------------------------- cost
def forward_passes(records: Records) -> np.ndarray | None:
    """Forward passes of base classifiers per example. An ensemble's file counts its
    members' passes: the ``member_passes`` column the run measured (votes, soft scores and
    clean forwards), or, in a file written before that column, the passes of one model below
    times the members (None with a K-consensus of K below the members, whose skips were not
    recorded). Any other file: its certifier's count (``Certifier.row_passes``: n0 + n, the
    selection and the estimation draws, plus its clean passes, ``Certifier.clean_passes``;
    DSRS adds its Q draws, ACES its selection's, a cascade counts the levels it drew; CERTIFY's
    for a file without a manifest). Not counted: a data-dependent file's σ-optimization steps,
    a denoiser's passes. None where the file cannot say (Cohen et al.'s files keep only the
    radius; a cascade file from before its ``levels_drawn`` column)."""
    if "member_passes" in records:
        return np.asarray(records["member_passes"], dtype=np.float64)
    identity = (records.manifest or {}).get("identity") or {}
    draws = _certifier(identity).row_passes(records)
    ensemble = identity.get("ensemble")
    if draws is None or not isinstance(ensemble, dict):
        return draws
    members = len(ensemble.get("members") or ())
    if ensemble.get("consensus") not in (None, members):  # K = M skips nothing
        return None
    return draws * members


def _certifier(identity: dict):
    """The identity's certifier with its options (CERTIFY without a manifest: Cohen et al.'s
    files)."""
    from ..certifiers import CERTIFIERS
    from ..certifiers.certifier import build_certifier

    name = identity.get("certifier") or "certify"
    return build_certifier(CERTIFIERS[name], identity.get("options") or {})


# --------------------------------------------------------------------------- two files compared
@dataclass(frozen=True)
class Agreement:
    """Two record files of the same examples compared example by example at each radius.

    ``first_only[i]`` counts the examples that ``first`` certifies at ``radii[i]`` (correct with
    radius ≥ r) and ``second`` does not; ``second_only[i]`` the reverse; ``both[i]`` those both
    certify. Two certifiers can have the same certified accuracy while disagreeing on which
    examples they certify; these counts show it.

    ``acr_difference`` is the paired mean of (second's − first's) certified radius over the
    examples, i.e. ACR(second) − ACR(first), and ``acr_difference_se`` its standard error
    (sample standard deviation of the per-example differences / √count; NaN for one example):
    a difference of a few standard errors is not an accident of which examples were drawn.
    """

    first: str
    second: str
    count: int
    radii: tuple
    both: tuple
    first_only: tuple
    second_only: tuple
    acr_difference: float
    acr_difference_se: float

    @property
    def agreement(self) -> float:
        """The fraction of (example, radius) pairs on which the two files say the same."""
        disagree = sum(self.first_only) + sum(self.second_only)
        return 1.0 - disagree / (self.count * len(self.radii))


def certified_agreement(first: Records, second: Records, radii: Sequence[float]) -> Agreement:
    """Per radius, which examples ``first`` and ``second`` certify (see :class:`Agreement`).

    The files must hold the same examples (the same ``idx`` values, in any order).
    """
    radii = tuple(float(r) for r in radii)
    a, b = (_radius_by_idx(r) for r in (first, second))
    if a.keys() != b.keys():
        raise SmoothcertError(f"{first.path} and {second.path} hold different examples; "
                              "compare files of the same examples (same --skip/--max)")
    idx = sorted(a)
    ra, rb = np.array([a[i] for i in idx]), np.array([b[i] for i in idx])
    a, b = (_certified_at(r, radii) for r in (ra, rb))
    return Agreement(first=first.name, second=second.name, count=len(idx), radii=radii,
                     both=_per_radius(a & b), first_only=_per_radius(a & ~b),
                     second_only=_per_radius(~a & b),
                     **_paired_difference(np.maximum(rb, 0.0) - np.maximum(ra, 0.0)))


def _certified_at(radius: np.ndarray, radii: tuple) -> np.ndarray:
    """(example, radius) → certified: correct (radius ≥ 0 here) with radius ≥ r."""
    return (radius[:, None] >= 0.0) & (radius[:, None] >= np.asarray(radii)[None, :])


def _paired_difference(diff: np.ndarray) -> dict:
    se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("nan")
    return {"acr_difference": float(diff.mean()), "acr_difference_se": se}


def _per_radius(mask: np.ndarray) -> tuple:
    return tuple(int(v) for v in mask.sum(axis=0))


def _radius_by_idx(records: Records) -> dict:
    """idx → the radius if the prediction is correct, else −1 (never certified)."""
    _check_certify(records, "comparing certificates")
    radius = np.where(correct_mask(records), certified_radii(records), -1.0)
    by_idx = {int(i): r for i, r in zip(records["idx"], radius)}
    if len(by_idx) != len(records):
        raise SmoothcertError(f"{records.path} repeats an idx; merge shards with "
                              "`smoothcert merge`")
    return by_idx


# --------------------------------------------------------------------------- σ-envelope
def _check_certify(records: Records, what: str) -> None:
    if "radius" not in records:
        raise SmoothcertError(f"{what} needs CERTIFY record files; {records.path} has no radius "
                              "column")


def certified_accuracy_envelope(records_list: Sequence[Records], radii) -> np.ndarray:
    """The σ-envelope: at each radius, the best certified accuracy over the files (Cohen et al.
    and Salman et al. draw it over models trained and certified at several σ).

    Returns float64 of shape ``(len(radii),)``: ``max_i certified_accuracy(records_i, r)``.
    """
    if not records_list:
        raise SmoothcertError("the envelope needs at least one record file")
    for r in records_list:
        _check_certify(r, "the envelope")
    return np.max([certified_accuracy(r, radii) for r in records_list], axis=0)


def envelope_curve(records_list: Sequence[Records]) -> tuple[np.ndarray, np.ndarray]:
    """The envelope as an exact step function, like :func:`certified_accuracy_curve`.

    Between two consecutive breakpoints of the union of the files' breakpoints every file's
    curve is constant, so the maximum evaluated at those breakpoints is exact.
    """
    for r in records_list:
        _check_certify(r, "the envelope")
    breaks = np.unique(np.concatenate([certified_accuracy_curve(r)[0] for r in records_list]))
    return breaks, certified_accuracy_envelope(records_list, breaks)


# --------------------------------------------------------------------------- p_A distribution
def pa_hat(records: Records) -> np.ndarray:
    """p̂_A per example (float64 in [0, 1]) from CERTIFY records, as in Sun et al. 2024, Fig. 3.

    Sun, Mao, Müller & Vechev plot the distribution of p_A *of the true label*, the probability
    that a noisy copy is classified as y (their ``p_correct``): ``P(p_A ≥ ½)`` is then the clean
    accuracy and hard inputs sit near 0. A CERTIFY record keeps ``nA``, the count of the class
    ĉ_A it selected, among ``n`` draws, so:

    - prediction = label: ĉ_A = y and p̂_A = nA/n exactly;
    - a wrong class (not abstained): ĉ_A ≠ y, so y's frequency is at most 1 − nA/n (< ½ since
      the certificate holds); we use that bound (exact with two classes);
    - an abstention: ĉ_A is not recorded; we use nA/n, exact when ĉ_A = y.
    """
    _check_rows(records)
    for column in ("nA", "n"):
        if column not in records:
            raise SmoothcertError(f"p̂_A needs smoothcert CERTIFY records with nA and n; "
                                  f"{records.path} has no column {column!r}")
    p = np.asarray(records["nA"], dtype=np.float64) / np.asarray(records["n"], dtype=np.float64)
    predict = np.asarray(records["predict"])
    wrong = (predict != ABSTAIN) & (predict != np.asarray(records["label"]))
    return np.where(wrong, 1.0 - p, p)


def ecdf(values, at) -> np.ndarray:
    """The empirical CDF of ``values`` at each point of ``at``: the fraction of values ≤ t."""
    values = np.sort(np.asarray(values, dtype=np.float64).reshape(-1))
    if values.size == 0:
        raise SmoothcertError("the empirical CDF of no values is undefined")
    at = np.asarray(at, dtype=np.float64)
    return np.searchsorted(values, at, side="right") / values.size


def pa_ecdf(records: Records) -> tuple[np.ndarray, np.ndarray]:
    """The ECDF of :func:`pa_hat` as breakpoints: the distinct values t and F(t) = P(p̂_A ≤ t)."""
    p = pa_hat(records)
    points = np.unique(p)
    return points, ecdf(p, points)


# --------------------------------------------------------------------------- attack records
def is_attack_records(records: Records) -> bool:
    """Whether a record file holds attack outcomes (``success`` and ``distance`` columns)."""
    return "success" in records and "distance" in records


def attacked_mask(records: Records) -> np.ndarray:
    """The examples that were attacked: the smoothed prediction on the clean input is the label.

    The others (clean error or abstention) count as already broken at distance 0 and are left
    out of the attack statistics, as in Campbell et al.'s attack curves (``data[data > 0]``).
    """
    _check_rows(records)
    return np.asarray(records["predict_clean"]) == np.asarray(records["label"])


def attack_distances(records: Records) -> np.ndarray:
    """float64, one per attacked example: the distance at which PREDICT flipped, +inf where the
    attack failed (its minimal distance lies beyond what was tried)."""
    attacked = attacked_mask(records)
    success = np.asarray(records["success"])[attacked] == 1
    return np.where(success, np.asarray(records["distance"], dtype=np.float64)[attacked], np.inf)


def attack_success(records: Records, distances: Sequence[float]) -> np.ndarray:
    """The attack curve at ``distances``: the fraction of attacked examples flipped within
    distance d (``≤ d``, inclusive like radii), shape ``(len(distances),)``; NaN if none."""
    d = attack_distances(records)
    at = np.asarray(distances, dtype=np.float64).reshape(-1)
    if d.size == 0:
        return np.full(at.shape, np.nan)
    return (d[:, None] <= at[None, :]).mean(axis=0, dtype=np.float64)


def attack_curve(records: Records) -> tuple[np.ndarray, np.ndarray]:
    """The attack curve as breakpoints: 0 and the sorted distinct finite distances, with the
    fraction of attacked examples flipped within each (a right-continuous step function)."""
    d = attack_distances(records)
    breaks = np.unique(np.concatenate([[0.0], d[np.isfinite(d)]]))
    return breaks, attack_success(records, breaks)


@dataclass(frozen=True)
class AttackSummary:
    """The headline numbers of one attack record file (Campbell et al., Tables 3 and 5).

    ``success_rate``, the distances and ``attacked_at`` are over the attacked examples (clean
    prediction = label). ``median_distance`` counts failed attacks as +inf (so it is exact
    whenever more than half succeed, and +inf otherwise); ``mean_distance`` is over the
    successful ones. Each is None when no example was attacked (or, for the mean, flipped).
    """

    name: str
    attack: str | None
    count: int
    clean_accuracy: float
    success_rate: float | None
    median_distance: float | None
    mean_distance: float | None
    distances: tuple
    attacked_at: tuple


def summarize_attack(records: Records, distances: Sequence[float]) -> AttackSummary:
    d = attack_distances(records)
    finite = d[np.isfinite(d)]
    options = ((records.manifest or {}).get("identity") or {}).get("options") or {}
    return AttackSummary(
        name=records.name,
        attack=options.get("attack"),
        count=len(records),
        clean_accuracy=float(np.mean(attacked_mask(records))),
        success_rate=float(np.mean(np.isfinite(d))) if d.size else None,
        median_distance=float(np.median(d)) if d.size else None,
        mean_distance=float(np.mean(finite)) if finite.size else None,
        distances=tuple(float(r) for r in distances),
        attacked_at=tuple(None if np.isnan(v) else float(v)
                          for v in attack_success(records, distances)),
    )
