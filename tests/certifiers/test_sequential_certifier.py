"""The sequential certifier on models: the engine program, the runner task and the CLI."""

import numpy as np
import pytest
import torch
from scipy.stats import norm

from conftest import Halfspace, write_checkpoint
from smoothcert import Gaussian
from smoothcert.certifiers.sequential import (
    DEFAULT_TEST,
    Sequential,
    certify_sequential,
    default_radii,
    parse_radii,
)
from smoothcert.cli.app import main
from smoothcert.errors import SmoothcertError
from smoothcert.runs.records import read_manifest, read_records
from smoothcert.smoothing.smoothed import Smoothed
from smoothcert.stats.sequential_tests import SEQUENTIAL_TESTS

pytestmark = pytest.mark.usefixtures("one_thread")

SIGMA = 0.5


def at_distance(d):
    """A point at signed distance d from the halfspace x₀ > 0: p_A = Φ(d/σ), radius = d."""
    x = torch.zeros(1, 2, 2)
    x[0, 0, 0] = d
    return x


def halfspace():
    w = torch.zeros(4)
    w[0] = 1.0
    return Smoothed(Halfspace(w), Gaussian(SIGMA), 2)


@pytest.mark.parametrize("test", sorted(SEQUENTIAL_TESTS))
def test_clear_inputs_get_the_grid_radius_below_their_true_radius(test):
    # True radii 0.6 and 1.1 (p_A = Φ(1.2), Φ(2.2)): the grid points below are 0.5 and 1.0,
    # each at least 0.1 = 0.2σ below, which 100,000 draws resolve.
    radii = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25]
    for distance, expected in ((0.6, 0.5), (1.1, 1.0)):
        c = certify_sequential(halfspace(), at_distance(distance), 100, radii, 0.001, 100_000,
                               1000, torch.Generator().manual_seed(1),
                               SEQUENTIAL_TESTS[test]())
        assert (c.prediction, c.radius, c.abstained) == (1, expected, False)
        assert c.p_lower < norm.cdf(distance / SIGMA) < c.p_upper
        assert c.draws < 100_000 and c.n0 == 100


def test_an_input_on_the_boundary_abstains():
    c = certify_sequential(halfspace(), at_distance(0.0), 100, [0.0, 0.5], 0.001, 100_000, 1000,
                           torch.Generator().manual_seed(2))
    # p_A = ½ exactly: not even radius 0 may be certified.
    assert c.abstained and c.prediction is None and c.radius == 0.0
    assert c.stopped in ("futile", "unreachable", "n_max")


def test_false_certificates_on_the_halfspace_stay_below_alpha():
    # True radius exactly on the grid point 0.5 (p_A = Φ(1)): certifying 0.5 is false.
    # α = 0.2 makes the rate measurable with 100 seeded inputs; the bound holds for each.
    smoothed, false = halfspace(), 0
    for seed in range(100):
        c = certify_sequential(smoothed, at_distance(0.5), 10, [0.0, 0.5], 0.2, 2_000, 2000,
                               torch.Generator().manual_seed(seed))
        false += c.radius >= 0.5
    # Under rate ≤ 0.2, P(≥ 31 of 100) < 0.01: a failure here means the guarantee is broken.
    assert false <= 30


def test_default_grid_stops_at_the_largest_radius_fixed_n_can_reach():
    np.testing.assert_allclose(default_radii(0.25, 0.001, 100_000), [0, 0.25, 0.5, 0.75])
    np.testing.assert_allclose(default_radii(1.0, 0.001, 100_000)[-1], 3.75)
    np.testing.assert_allclose(parse_radii("0.5,0.25", 0.25, 0.001, 10), [0, 0.25, 0.5])
    with pytest.raises(SmoothcertError, match="radii"):
        parse_radii("0.5,abc", 0.25, 0.001, 10)


def test_cli_records_the_draws_and_agrees_with_fixed_n_on_a_trained_free_model(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m.pt")
    common = [str(ckpt), "--max", "4", "--skip", "30", "--n0", "50", "--n", "4000",
              "--batch", "500", "--no-progress"]
    assert main(["certify", *common, "--certifier", "sequential", "--radii", "0,0.1,0.2",
                 "--out", str(tmp_path / "s.tsv")]) == 0
    rows = read_records(tmp_path / "s.tsv")
    assert set(rows.columns_order) >= {"n", "n_max", "p_upper", "stopped", "nA"}
    assert all(0 < n <= 4000 for n in rows["n"]) and set(rows["n_max"]) == {4000}
    assert set(rows["radius"]) <= {0.0, 0.1, 0.2}
    identity = read_manifest(tmp_path / "s.tsv")["identity"]
    assert identity["options"] == {"radii": "0,0.1,0.2", "test": "targeted-patient"}


def test_the_default_test_is_targeted_final():
    """The CLI's and the Python API's default: the fastest test within 0.5 points of fixed-n in
    simulation on a 3σ and a 2σ grid (benchmarks/sequential_frontier.py)."""
    assert Sequential.Options().test == DEFAULT_TEST == "targeted-patient"
    assert "targeted-patient" in SEQUENTIAL_TESTS


@pytest.mark.parametrize("flags, message", [
    (["--radii", "0,-1"], "radii"),
    (["--radii", "x"], "radii"),
    (["--opt", "test=bogus"], "bogus"),
])
def test_bad_sequential_options_exit_2_without_a_file(tmp_path, capsys, flags, message):
    ckpt = write_checkpoint(tmp_path / "m.pt")
    out = tmp_path / "s.tsv"
    code = main(["certify", str(ckpt), "--certifier", "sequential", *flags, "--out", str(out),
                 "--max", "1", "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_radii_flag_is_refused_by_certifiers_without_a_grid(tmp_path, capsys):
    ckpt = write_checkpoint(tmp_path / "m.pt")
    code = main(["certify", str(ckpt), "--radii", "0,0.5", "--out", str(tmp_path / "c.tsv"),
                 "--max", "1", "--no-progress"])
    assert code == 2 and "radii" in capsys.readouterr().err
