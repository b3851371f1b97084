"""The differential method's radius tables (``noise/tables.py``): lower bounds of the exact
integral, computed once and cached as readable JSON, and recomputed when the cache is unsafe."""

import functools
import json
import math
import os

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import binom

from smoothcert.noise import NOISES, tables
from smoothcert.noise.exp1 import phi_l1
from smoothcert.noise.laplace import phi_linf
from smoothcert.version import __version__

P = np.array([0.5, 0.5001, 0.55, 0.6, 0.75, 0.9, 0.99, 0.999, 0.99999, 0.9999999, 0.99999999])


def exact_laplace_linf(dim: int, rho: float) -> float:
    """∫_{1−ρ}^{½} dq/Φ(q) for Laplace ℓ∞ (λ = 1) in closed form: Φ is linear with slope s on
    each piece between the atoms of S = d − 2·Binomial(d, ½), so each piece integrates to
    ln(Φ(b)/Φ(a))/s (or (b − a)/Φ for s = 0). Independent of the table's code."""
    k = np.arange(dim + 1)
    values, mass = dim - 2.0 * k, binom.pmf(k, dim, 0.5)
    edges = np.concatenate([[0.0], np.cumsum(mass)])
    total, gain = 0.0, 0.0  # gain = Φ at the piece's lower end
    for j in range(dim + 1):
        lo, hi = edges[j], min(edges[j + 1], 0.5)
        a, b = max(lo, 1.0 - rho), hi
        if b > a:
            at = gain + values[j] * (a - lo)
            bt = gain + values[j] * (b - lo)
            total += (b - a) / at if values[j] == 0 else math.log(bt / at) / values[j]
        gain += values[j] * mass[j]
        if edges[j + 1] >= 0.5:
            break
    return total


@pytest.mark.parametrize("dim", [1, 2, 5, 16, 64])
def test_laplace_linf_table_is_a_tight_lower_bound_of_the_exact_integral(dim):
    table = tables.differential_table(functools.partial(phi_linf, dim))
    ours = table.lookup(P)
    exact = np.array([exact_laplace_linf(dim, p) for p in P])
    assert ours[0] == 0.0 and np.all(np.diff(ours) > 0)
    assert np.all(ours <= exact)  # sound, beyond the last point (1 − 10⁻⁷) too
    p = P  # within the table's points: ½ < p ≤ 1 − q_min
    inside = (p > 0.5) & (p <= 1 - tables.GRID["q_min"])
    np.testing.assert_allclose(ours[inside], exact[inside], rtol=2e-4)  # tight
    if dim == 1:  # ℓ∞ = ℓ1 in one dimension: Teng et al.'s −ln(2(1 − p))
        np.testing.assert_allclose(exact[1:], -np.log(2 * (1 - P[1:])), rtol=1e-12)


def test_exp1_table_is_a_tight_lower_bound_of_the_quadrature():
    dim, k = 8, 2.0
    table = tables.differential_table(functools.partial(phi_l1, dim, k))
    for p in P[1:8]:
        exact, err = integrate.quad(lambda q: 1.0 / phi_l1(dim, k, q), 1 - p, 0.5,
                                    epsabs=1e-13, epsrel=1e-12, limit=200)
        ours = float(table.lookup(p))
        assert ours <= exact - err and ours >= exact * (1 - 2e-4), (p, ours, exact)


def key(dim=4):
    return tables.table_key("laplace", "linf", dim, {})


def phi(dim=4):
    return functools.partial(phi_linf, dim)


def never(q):
    raise AssertionError("a sound cached table must be read, not recomputed")


def test_a_table_is_written_once_as_readable_json_and_then_read(tmp_path, monkeypatch):
    monkeypatch.setenv("SMOOTHCERT_CACHE", str(tmp_path / "cache"))
    built = tables.load_or_build(key(), phi())
    (path,) = (tmp_path / "cache").iterdir()
    stored = json.loads(path.read_text())
    assert path.name.startswith("laplace-linf-d4-") and path.suffix == ".json"
    assert {stored[f] for f in ("method", "noise", "norm", "dim", "version")} == \
        {"differential", "laplace", "linf", 4, __version__}
    assert stored["grid"] == tables.GRID and len(stored["rho"]) == 4401
    assert not [f for f in os.listdir(tmp_path / "cache") if f.endswith(".tmp")]
    again = tables.load_or_build(key(), never)
    assert np.array_equal(again.radius, built.radius) and np.array_equal(again.rho, built.rho)


@pytest.mark.parametrize("spoil", ["truncated", "other_dim", "inflated", "not_json", "shape"])
def test_an_unsafe_cache_file_is_recomputed_not_trusted(spoil, tmp_path, monkeypatch):
    monkeypatch.setenv("SMOOTHCERT_CACHE", str(tmp_path))
    good = tables.load_or_build(key(), phi())
    path = tables.table_path(key())
    stored = json.loads(path.read_text())
    if spoil == "truncated":
        path.write_text(path.read_text()[:1000])
    elif spoil == "other_dim":  # a table of d = 5 under d = 4's name
        path.write_text(json.dumps({**stored, "dim": 5}))
    elif spoil == "inflated":  # radii doubled: would certify too much; the digest catches it
        path.write_text(json.dumps({**stored, "radius": [2 * r for r in stored["radius"]]}))
    elif spoil == "not_json":
        path.write_bytes(b"\x00\xff" * 10)
    else:  # a consistent digest over numbers that are not a table
        numbers = {"rho": [0.5], "radius": [0.0], "slope": [1.0]}
        path.write_text(json.dumps({**stored, **numbers, "sha256": tables._digest(numbers)}))
    with pytest.raises(AssertionError, match="must be read"):
        tables.load_or_build(key(), never)  # not trusted: recomputation is attempted
    table = tables.load_or_build(key(), phi())
    assert np.array_equal(table.radius, good.radius)
    assert json.loads(path.read_text())["sha256"] == stored["sha256"]  # repaired on disk


def test_an_unwritable_cache_folder_keeps_the_table_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SMOOTHCERT_CACHE", str(blocker / "cache"))
    table = tables.load_or_build(key(), phi())
    assert float(table.lookup(0.9)) > 0 and blocker.read_text() == "not a folder"


def test_the_noise_radius_uses_the_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SMOOTHCERT_CACHE", str(tmp_path))
    monkeypatch.setattr(tables, "_MEMO", {})
    r = NOISES["laplace"](0.5).direct_radius("linf", np.array([0.6, 0.9]), 3)
    assert [p.name.split("-")[:3] for p in tmp_path.iterdir()] == [["laplace", "linf", "d3"]]
    lam = 0.5 / math.sqrt(2)
    exact = [lam * exact_laplace_linf(3, p) for p in (0.6, 0.9)]
    assert np.all(r <= exact) and np.allclose(r, exact, rtol=2e-4)
