"""Radius tables of the differential method (Yang et al. 2020, §4; tonyduan/rs4a
``diffmethod_table`` / ``get_radii_from_convex_table``), computed once per (noise, norm, d,
parameters) and cached as one readable JSON file in the user's cache folder.

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

A cached file is trusted only if its parameters, format, library version and the SHA-256 of
its numbers match and the numbers are shaped like a table (increasing ρ from ½, radii from 0);
anything else, a corrupt file included, is recomputed and replaced atomically. The folder is
``$SMOOTHCERT_CACHE`` if set, else ``~/.cache/smoothcert/radius-tables``; a folder that cannot
be written leaves the table in memory only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io import write_json_atomic
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


def cache_folder() -> Path:
    """``$SMOOTHCERT_CACHE`` if set, else ``~/.cache/smoothcert/radius-tables``."""
    folder = os.environ.get("SMOOTHCERT_CACHE")
    return Path(folder) if folder else Path("~/.cache/smoothcert/radius-tables").expanduser()


def table_key(noise: str, norm: str, dim: int, params: dict) -> dict:
    """What a cached table must have been computed for (every field is checked on load)."""
    return {"method": "differential", "noise": noise, "norm": norm, "dim": int(dim),
            "params": params, "grid": GRID, "format": TABLE_FORMAT, "version": __version__}


def table_path(key: dict) -> Path:
    """The cache file of ``key``: readable name, plus a digest of every field of the key."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_folder() / f"{key['noise']}-{key['norm']}-d{key['dim']}-{digest}.json"


def cached_table(key: dict, phi: Callable[[np.ndarray], np.ndarray]) -> RadiusTable:
    """The table for ``key``, memoized per process (by ``key``) over :func:`load_or_build`."""
    text = json.dumps(key, sort_keys=True)
    if text not in _MEMO:
        _MEMO[text] = load_or_build(key, phi)
    return _MEMO[text]


_MEMO: dict[str, RadiusTable] = {}


def load_or_build(key: dict, phi: Callable[[np.ndarray], np.ndarray]) -> RadiusTable:
    """The table for ``key`` from its cache file if that is sound (module doc), else computed
    from ``phi`` and written there atomically."""
    path = table_path(key)
    table = read_table(path, key)
    if table is None:
        table = differential_table(phi, key["grid"])
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, {**key, **_payload(table)})
        except OSError:
            pass  # a read-only or full cache folder: the table stays in memory
    return table


def _payload(table: RadiusTable) -> dict:
    numbers = {"rho": table.rho.tolist(), "radius": table.radius.tolist(),
               "slope": table.slope.tolist()}
    return {**numbers, "sha256": _digest(numbers)}


def _digest(numbers: dict) -> str:
    return hashlib.sha256(json.dumps(numbers, sort_keys=True).encode()).hexdigest()


def read_table(path: Path, key: dict) -> RadiusTable | None:
    """The table in ``path`` if it was computed for ``key`` and is intact, else None."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        numbers = {name: stored[name] for name in ("rho", "radius", "slope")}
        if any(stored.get(field) != value for field, value in key.items()):
            return None
        if stored.get("sha256") != _digest(numbers):
            return None
        table = RadiusTable(*(np.asarray(numbers[n], dtype=np.float64)
                              for n in ("rho", "radius", "slope")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return table if _well_formed(table, key) else None


def _well_formed(table: RadiusTable, key: dict) -> bool:
    rho, radius, slope = table.rho, table.radius, table.slope
    size = _coarse_grid(key["grid"]).size
    return (rho.ndim == 1 and rho.size == size == radius.size == slope.size
            and bool(np.all(np.isfinite(rho)) and np.all(np.isfinite(radius))
                     and np.all(np.isfinite(slope)))
            and rho[0] == 0.5 and radius[0] == 0.0 and bool(np.all(np.diff(rho) > 0))
            and bool(np.all(np.diff(radius) >= 0)) and bool(np.all(slope > 0)))
