"""Radius tables of the differential method (Yang et al. 2020, §4; tonyduan/rs4a
``diffmethod_table`` / ``get_radii_from_convex_table``), computed once per (noise, norm, d,
parameters) in each process that needs one.

The differential method: if Φ(q) (0 < q ≤ ½) is the largest rate at which a set of noise
measure q can gain probability when the input moves at unit speed in the norm, the smoothed
classifier with top-class probability ρ > ½ is constant within the radius

    R(ρ) = ∫_{1−ρ}^{½} dq / Φ(q)      (in units of the noise's scale λ).

Φ is increasing on (0, ½] for every noise here, so g = 1/Φ is decreasing and R is convex in ρ
(R'(ρ) = g(1 − ρ) grows with ρ). The table is a **lower bound** of R at every ρ:

* at its points ρ_j = 1 − q_j, R is summed over a finer grid of q (each table cell cut in
  ``sub`` equal cells) with g taken at each cell's larger end, where the decreasing g is
  smallest (a lower Riemann sum), and the sum is shrunk by :data:`MARGIN` against
  floating-point error;
* between points, :meth:`RadiusTable.lookup` extends from the point ρ_j below ρ along the
  slope g(q_j) = R'(ρ_j): for ρ ≥ ρ_j the integrand on [1 − ρ, q_j] is ≥ g(q_j), so
  R(ρ) ≥ R(ρ_j) + g(q_j)(ρ − ρ_j). This is rs4a's convex-table rule with the chord slope of
  the cell below replaced by the derivative at ρ_j (also a lower bound of the true slope by
  convexity, and a tighter one); beyond the last point the same line is a lower bound too.

Every table is built in the process that uses it (about 0.05 s at d = 784 and d = 150,528,
measured 2026-11-29: rs4a's Φ at ~70,000 points) and memoized there; none is read from disk. A
certificate must not rest on a writable file that anyone could edit (a table cached under a
user folder, even one that carries its own checksum, can be rewritten together with that
checksum), and rebuilding costs less than reading and checking one. A run records each table
it looked up by key and SHA-256 (:func:`recording`, the manifest's ``radius_tables``), so that
a record file names the numbers behind its radii.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..version import __version__

TABLE_FORMAT = 1
GRID = {"q_min": 1e-7, "points": 4001, "near_half": 400, "sub": 16}
"""The q grid: ``points`` table points geometric from ½ down to ``q_min`` (ρ up to 1 − 10⁻⁷,
beyond what 10⁶ draws can certify), ``near_half`` more with ½ − q geometric from 10⁻⁷ to
2·10⁻³ (where R is small, so that a lookup's relative error stays small there too), and each
cell summed over ``sub`` equal finer cells (relative error ≈ 1.2·10⁻⁴ where g ~ 1/q, far less
near ½; built in about 0.1 s at d = 784)."""
MARGIN = 1e-8
"""Relative amount every summed radius and slope is shrunk by (floating-point error of Φ)."""


@dataclass(frozen=True)
class RadiusTable:
    """Lower bounds of a convex radius function R(ρ) (λ = 1), ρ from ½ up (module doc)."""

    rho: np.ndarray  # (N,) increasing, rho[0] = ½
    radius: np.ndarray  # (N,) R(rho_j) from below, radius[0] = 0
    slope: np.ndarray  # (N,) 1/Φ(1 − rho_j) from below: R'(rho_j)

    def lookup(self, p) -> np.ndarray:
        """R(p) from below (float64, shaped like p; 0 where p ≤ ½): the point ρ_j ≤ p and its
        slope, R(ρ_j) + R'(ρ_j)(p − ρ_j) (a lower bound since R is convex)."""
        p = np.asarray(p, dtype=np.float64)
        j = np.clip(np.searchsorted(self.rho, p, side="right") - 1, 0, None)
        r = self.radius[j] + self.slope[j] * (p - self.rho[j])
        return np.where(p > 0.5, r, 0.0)

    @functools.cached_property
    def sha256(self) -> str:
        """SHA-256 of the table's numbers as JSON (``rho``, ``radius``, ``slope`` lists): the
        name a record file gives the table its radii came from."""
        return _digest({name: getattr(self, name).tolist() for name in ("rho", "radius", "slope")})


def differential_table(phi: Callable[[np.ndarray], np.ndarray],
                       grid: dict = GRID) -> RadiusTable:
    """The table of R(ρ) = ∫_{1−ρ}^{½} dq/Φ(q) for an increasing, vectorized Φ on (0, ½]."""
    coarse = _coarse_grid(grid)
    sub = int(grid["sub"])
    steps = np.arange(sub) / sub  # each coarse cell [q_{j+1}, q_j] in ``sub`` equal cells
    q = np.append((coarse[:-1, None] + np.diff(coarse)[:, None] * steps).ravel(), coarse[-1])
    g = 1.0 / np.asarray(phi(q), dtype=np.float64)
    if not (np.all(np.isfinite(g)) and np.all(g > 0) and np.all(np.diff(g) >= -1e-12 * g[1:])):
        raise ArithmeticError("the differential method needs Φ positive and increasing")
    cells = g[:-1] * (q[:-1] - q[1:])  # g at the larger end of each cell: its minimum there
    total = np.concatenate([[0.0], np.cumsum(cells)]) * (1.0 - MARGIN)
    keep = np.arange(0, q.size, sub)
    return RadiusTable(rho=1.0 - q[keep], radius=total[keep], slope=g[keep] * (1.0 - MARGIN))


def _coarse_grid(grid: dict) -> np.ndarray:
    """The table's q points, decreasing from ½ to ``q_min`` (:data:`GRID`)."""
    far = 0.5 * np.geomspace(1.0, 2.0 * grid["q_min"], int(grid["points"]))
    near = 0.5 - np.geomspace(1e-7, 2e-3, int(grid["near_half"]))
    return np.unique(np.concatenate([far, near]))[::-1]


def table_key(noise: str, norm: str, dim: int, params: dict) -> dict:
    """What a table is computed for (noise, norm, d, the noise's parameters, the grid)."""
    return {"method": "differential", "noise": noise, "norm": norm, "dim": int(dim),
            "params": params, "grid": GRID, "format": TABLE_FORMAT, "version": __version__}


def cached_table(key: dict, phi: Callable[[np.ndarray], np.ndarray]) -> RadiusTable:
    """The table for ``key``, built from ``phi`` on first use in this process and memoized
    (by ``key``); each :func:`recording` open at the call notes its key and digest."""
    text = json.dumps(key, sort_keys=True)
    if text not in _MEMO:
        _MEMO[text] = differential_table(phi, key["grid"])
    for seen in _RECORDERS:
        seen[text] = {**key, "sha256": _MEMO[text].sha256}
    return _MEMO[text]


_MEMO: dict[str, RadiusTable] = {}
_RECORDERS: list[dict] = []


@contextmanager
def recording():
    """Collect the tables looked up inside: yields a list, filled on leaving with each table's
    key and ``sha256`` (:attr:`RadiusTable.sha256`), in key order."""
    seen: dict[str, dict] = {}
    found: list[dict] = []
    _RECORDERS.append(seen)
    try:
        yield found
    finally:
        _RECORDERS.remove(seen)
        found.extend(seen[k] for k in sorted(seen))


def tables_behind(noise, dim: int) -> list[dict]:
    """The tables (key and ``sha256``) that ``noise.radii`` looks up at dimension ``dim``: what
    a run's manifest names as ``radius_tables`` (empty for a noise of closed forms, or one
    without radii: ablation's)."""
    radii = getattr(noise, "radii", None)
    with recording() as found:
        if radii is not None:
            radii(0.75, dim)
    return found


def _digest(numbers: dict) -> str:
    return hashlib.sha256(json.dumps(numbers, sort_keys=True).encode()).hexdigest()
