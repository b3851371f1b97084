"""The radius in every norm (issue 37, Yang et al. 2020): ``radius_l1``, ``radius_l2``,
``radius_linf`` beside ``radius`` in the rows of every certifier whose certificate is a ball of
the noise; their rules; and a file from before them, which resumes in its own header.

Runs certify 4 digits test images (8×8, d = 64) with the upgrade fixtures' checkpoint."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from scipy.stats import norm as gauss

from smoothcert import certify_dataset
from smoothcert.certifiers import CERTIFIERS
from smoothcert.certifiers.columns import RADIUS_COLUMNS
from smoothcert.data.datasets import load_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.noise import NOISES
from smoothcert.runs.records import manifest_path, read_records

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade"
CHECKPOINT = FIXTURES / "checkpoint_v1.pt"
DIM = 64  # digits: 1 × 8 × 8


def certified(certifier="certify", noise="gaussian", out=None, max_count=4, **options):
    return certify_dataset(str(CHECKPOINT), load_dataset("digits", "test"), certifier=certifier,
                           noise=noise, options=options, n0=20, n=300, batch=1000, skip=90,
                           max_count=max_count, out=out)


def test_certify_columns_keep_cohens_first_and_add_every_norm_before_the_seed():
    columns = CERTIFIERS["certify"].columns
    assert columns[:6] == ("idx", "label", "predict", "radius", "correct", "time")
    assert columns[-4:] == (*RADIUS_COLUMNS, "seed")
    assert RADIUS_COLUMNS == ("radius_l1", "radius_l2", "radius_linf")
    from smoothcert.noise.base import NORMS
    assert {c.removeprefix("radius_") for c in RADIUS_COLUMNS} == set(NORMS)  # one per norm


@pytest.mark.parametrize("certifier, options", [
    ("certify", {}), ("deterministic", {}), ("runner-up", {}), ("sequential", {}),
    ("data-dependent", {"num_steps": 2}), ("data-dependent", {"num_steps": 2, "memory": False}),
])
def test_gaussian_rows_hold_the_l2_radius_and_its_conversions(certifier, options):
    # An L2 ball of radius r holds the L1 ball of radius r and the L∞ ball of r/√d.
    rows = certified(certifier, **options)
    assert any(r["radius"] > 0 for r in rows)
    for r in rows:
        assert r["radius_l2"] == r["radius"] and r["radius_l1"] == r["radius"]
        assert r["radius_linf"] == pytest.approx(r["radius"] / math.sqrt(DIM), rel=1e-12)
        if r["predict"] == -1:
            assert r["radius_l1"] == r["radius_l2"] == r["radius_linf"] == 0.0


def test_gaussian_certify_radius_is_sigma_phi_inverse_in_l2_and_over_root_d_in_linf():
    for r in certified():
        if r["predict"] >= 0:
            expected = 0.25 * gauss.ppf(r["p_lower"])
            assert r["radius_l2"] == pytest.approx(expected, rel=1e-12)
            assert r["radius_linf"] == pytest.approx(expected / 8, rel=1e-12)


def test_uniform_rows_hold_the_noises_radius_in_every_norm():
    # radius_l1 is the primary radius 2λ(p − ½) (λ = √3σ); radius_linf is what the noise gives
    # for ℓ∞: rs4a's direct 2λ(1 − (1.5 − p)^(1/d)) where it has it, else the conversion.
    noise = NOISES["uniform"](0.25)
    lam = math.sqrt(3) * 0.25
    rows = [r for r in certified(noise="uniform") if r["predict"] >= 0]
    assert rows
    for r in rows:
        p = r["p_lower"]
        radii = noise.radii(p, DIM)
        assert r["radius_l1"] == r["radius"] == pytest.approx(2 * lam * (p - 0.5), rel=1e-12)
        assert r["radius_l2"] == pytest.approx(radii["l2"], rel=1e-12)
        assert r["radius_linf"] == pytest.approx(radii["linf"], rel=1e-12)
        direct = 2 * lam * (1 - (1.5 - p) ** (1 / DIM))
        converted = r["radius"] / DIM
        assert r["radius_linf"] == pytest.approx(
            direct if "linf" in noise.certified_norms() else converted, rel=1e-9)


def test_every_norm_is_in_the_file_and_reads_back(tmp_path):
    rows = certified(out=tmp_path / "r.tsv")
    records = read_records(tmp_path / "r.tsv")
    assert records.columns_order[-4:] == (*RADIUS_COLUMNS, "seed")
    for column in RADIUS_COLUMNS:
        assert records[column].tolist() == [r[column] for r in rows]


@pytest.fixture(scope="module")
def gaussian_file(tmp_path_factory) -> Path:
    """A certify file of the 4 images (Gaussian noise; the second one abstains)."""
    path = tmp_path_factory.mktemp("records") / "g.tsv"
    rows = certified(out=path)
    assert rows[1]["predict"] == -1 and rows[0]["radius"] > 0
    return path


def edited(source: Path, tmp_path: Path, column: str, value: str, row: int = 0) -> Path:
    """A copy of the record file ``source`` (and its manifest) with one cell changed."""
    path = tmp_path / source.name
    shutil.copy(manifest_path(source), manifest_path(path))
    header, *lines = source.read_text().splitlines()
    cells = lines[row].split("\t")
    cells[header.split("\t").index(column)] = value
    lines[row] = "\t".join(cells)
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


@pytest.mark.parametrize("column, value, row, says", [
    ("radius_linf", "-0.1", 0, "radius_linf is -0.1; a radius_linf is a finite number >= 0"),
    ("radius_l1", "nan", 0, "radius_l1 is nan"),
    ("radius_l2", "0.123", 0, r"radius_l2 is 0.123 but radius is 0\.\d+; radius is the radius in "
                              r"the noise's norm \(l2\)"),
    ("radius_l1", "0.01", 1, "radius_l1 is 0.01 with predict -1; an abstention has radius 0"),
    ("radius_linf", "0.01", 1, "radius_linf is 0.01 with predict -1"),
])
def test_a_radius_column_that_breaks_its_rule_is_one_line(gaussian_file, tmp_path, column,
                                                          value, row, says):
    read_records(gaussian_file)
    with pytest.raises(SmoothcertError, match=f"line {row + 2}: " + says) as err:
        read_records(edited(gaussian_file, tmp_path, column, value, row))
    assert "\n" not in str(err.value)


def test_the_primary_norm_is_the_manifests_noise(tmp_path):
    # A uniform file's radius is ℓ1: there radius_l2 may differ from radius, radius_l1 may not.
    path = tmp_path / "u.tsv"
    rows = certified(noise="uniform", out=path, max_count=1)
    assert rows[0]["radius"] > 0 and rows[0]["radius_l2"] != rows[0]["radius"]
    (tmp_path / "edited").mkdir()
    with pytest.raises(SmoothcertError, match=r"radius_l1 is 0.5 but radius is .*\(l1\)"):
        read_records(edited(path, tmp_path / "edited", "radius_l1", "0.5"))


@pytest.mark.parametrize("name", ["certify_gaussian", "certify_uniform",
                                  "data_dependent_uniform"])
def test_an_old_file_resumes_in_its_own_header(tmp_path, name):
    # A file from before the radius columns, resumed (its last two rows redone): its header
    # and its manifest's columns stay as they were (no radius_*), the new rows have the
    # header's fields, and they equal the rows the old version wrote.
    source = FIXTURES / "records" / f"v4_{name}.tsv"
    out = tmp_path / source.name
    out.write_text("".join(source.read_text().splitlines(keepends=True)[:3]))
    shutil.copy(manifest_path(source), manifest_path(out))
    certifier, noise, options = {"certify_gaussian": ("certify", "gaussian", {}),
                                 "certify_uniform": ("certify", "uniform", {}),
                                 "data_dependent_uniform": ("data-dependent", "uniform",
                                                            {"num_steps": 3})}[name]
    rows = certified(certifier, noise, out=out, **options)
    header, *lines = out.read_text().splitlines()
    assert header == source.read_text().splitlines()[0]
    assert not set(RADIUS_COLUMNS) & set(header.split("\t"))
    assert len(lines) == 4 and all(len(line.split("\t")) == len(header.split("\t"))
                                   for line in lines)
    assert json.loads(manifest_path(out).read_text())["columns"] == header.split("\t")
    assert len(rows) == 4 and not set(RADIUS_COLUMNS) & set(rows[-1])
    timeless = [{k: v for k, v in r.items() if k != "time"} for r in rows]
    eps = float(torch.finfo(torch.float64).eps)  # SciPy versions differ in the last bit
    assert timeless == [pytest.approx({k: v for k, v in r.items() if k != "time"},
                                      rel=16 * eps, abs=16 * eps)
                        for r in read_records(source).rows()]


def test_a_new_file_resumes_with_its_radius_columns(tmp_path):
    out = tmp_path / "r.tsv"
    whole = certified(out=tmp_path / "whole.tsv")
    certified(out=out, max_count=2)
    resumed = certified(out=out)
    timeless = [{k: v for k, v in r.items() if k != "time"} for r in resumed]
    assert timeless == [{k: v for k, v in r.items() if k != "time"} for r in whole]


class Constant(torch.nn.Module):
    """Votes class 0 on every input: p_lower = α^(1/n), the best a run of n draws can give."""

    def forward(self, x):
        return torch.stack([torch.ones(len(x)), torch.zeros(len(x))], dim=1)


@pytest.mark.parametrize("noise", ["gaussian", "uniform"])
def test_smoothed_certify_gives_the_radius_in_every_norm(noise):
    from smoothcert import Smoothed

    x = torch.full((1, 4, 4), 0.5)  # d = 16
    c = Smoothed(Constant(), NOISES[noise](0.25), 2).certify(x, 10, 100, 0.001, 50, 0)
    assert c.p_lower == pytest.approx(0.001 ** (1 / 100), rel=1e-12)
    expected = NOISES[noise](0.25).radii(c.p_lower, 16)
    assert set(c.radii) == {"l1", "l2", "linf"}
    assert c.radii == pytest.approx(expected, rel=1e-12)
    assert c.radii[NOISES[noise].norm] == c.radius
