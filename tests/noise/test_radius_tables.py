"""The differential method's radius tables (``noise/tables.py``): lower bounds of the exact
integral, built in each process that uses them and never read from a file."""

import functools
import hashlib
import json
import math

import numpy as np
import pytest
import torch
from scipy import integrate
from scipy.stats import binom

from smoothcert.noise import NOISES, tables
from smoothcert.noise.exp1 import phi_l1
from smoothcert.noise.laplace import phi_linf
from smoothcert.runs import certify_dataset
from smoothcert.runs.records import read_records
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


def test_a_planted_cache_file_is_never_read(tmp_path, monkeypatch):
    """The attack of issue 45: a laplace ℓ∞ table with radius and slope ×10 and its own sha256
    recomputed, where smoothcert read its cache before Step 21 ($SMOOTHCERT_CACHE, this file name).
    The radius must be the one built in process, and nothing is written there either."""
    monkeypatch.setenv("SMOOTHCERT_CACHE", str(tmp_path))
    monkeypatch.setattr(tables, "_MEMO", {})
    honest = tables.differential_table(phi(3))
    numbers = {"rho": honest.rho.tolist(), "radius": (10 * honest.radius).tolist(),
               "slope": (10 * honest.slope).tolist()}
    planted = {**key(3), **numbers, "sha256": tables._digest(numbers)}
    digest = hashlib.sha256(json.dumps(key(3), sort_keys=True).encode()).hexdigest()[:16]
    (tmp_path / f"laplace-linf-d3-{digest}.json").write_text(json.dumps(planted))
    r = NOISES["laplace"](0.5).direct_radius("linf", np.array([0.6, 0.9]), 3)
    lam = 0.5 / math.sqrt(2)
    np.testing.assert_array_equal(r, lam * honest.lookup([0.6, 0.9]))
    assert [p.name for p in tmp_path.iterdir()] == [f"laplace-linf-d3-{digest}.json"]


def test_a_table_is_built_once_per_process(monkeypatch):
    monkeypatch.setattr(tables, "_MEMO", {})
    first = tables.cached_table(key(), phi())
    again = tables.cached_table(key(), lambda q: pytest.fail("memoized: not rebuilt"))
    assert again is first and len(first.rho) == 4401


def test_recording_names_each_table_looked_up_by_key_and_digest(monkeypatch):
    monkeypatch.setattr(tables, "_MEMO", {})
    with tables.recording() as found:
        NOISES["gaussian"](0.5).radii(0.9, 3)  # closed form: no table
        NOISES["laplace"](0.5).radii(np.array([0.6, 0.9]), 3)
        NOISES["laplace"](0.5).radii(0.7, 3)  # the same table again: named once
    assert [(t["noise"], t["norm"], t["dim"]) for t in found] == [("laplace", "linf", 3)]
    table = tables.differential_table(phi(3))
    numbers = {n: getattr(table, n).tolist() for n in ("rho", "radius", "slope")}
    assert found[0]["sha256"] == tables._digest(numbers) == table.sha256
    assert found[0]["grid"] == tables.GRID and found[0]["version"] == __version__
    with tables.recording() as outside:
        pass
    assert outside == []  # a recording sees only its own lookups


def test_the_noise_radius_is_a_tight_lower_bound_in_process(monkeypatch):
    monkeypatch.setattr(tables, "_MEMO", {})
    r = NOISES["laplace"](0.5).direct_radius("linf", np.array([0.6, 0.9]), 3)
    lam = 0.5 / math.sqrt(2)
    exact = [lam * exact_laplace_linf(3, p) for p in (0.6, 0.9)]
    assert np.all(r <= exact) and np.allclose(r, exact, rtol=2e-4)


@pytest.mark.parametrize("noise, named", [("laplace", [("laplace", "linf", 64)]),
                                          ("exp1", [("exp1", "l1", 64)]), ("gaussian", [])])
def test_a_run_s_manifest_names_the_tables_behind_its_radii(tmp_path, noise, named):
    """The manifest of a certification names each table its radii came from, by key and
    SHA-256 (the digest of the table this process builds); closed forms name none."""
    data = torch.utils.data.TensorDataset(torch.full((2, 1, 8, 8), 0.5),
                                          torch.zeros(2, dtype=torch.long))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    out = tmp_path / "r.tsv"
    certify_dataset(model, data, sigma=0.5, noise=noise, n0=10, n=20, batch=20, num_classes=3,
                    out=out)
    tables_named = read_records(out).manifest.get("radius_tables", [])
    assert [(t["noise"], t["norm"], t["dim"]) for t in tables_named] == named
    for t in tables_named:
        key = {k: v for k, v in t.items() if k != "sha256"}
        assert t["sha256"] == tables._MEMO[json.dumps(key, sort_keys=True)].sha256
