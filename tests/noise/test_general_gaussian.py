"""The generalized Gaussian noise (noise/general_gaussian.py): its draws (per-coordinate
standard deviation σ, ‖z‖²/s² ~ χ²_(d−2k), uniform directions), its name with parameters in
the registry, its radius (Cohen's at k = 0), and the command line end to end."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from conftest import write_checkpoint
from smoothcert import SmoothcertError
from smoothcert.cli.app import main
from smoothcert.noise import NOISES
from smoothcert.runs.records import read_records


def draws(k, sigma=0.25, shape=(1, 28, 28), count=20000, seed=0):
    noise = NOISES[f"general-gaussian:k={k}"](sigma)
    return noise, noise.sample(torch.zeros(count, *shape), torch.Generator().manual_seed(seed))


def test_draws_have_sigma_per_coordinate_and_the_chi_square_radius():
    noise, z = draws(380)
    flat = z.flatten(1).double()
    assert flat.std().item() == pytest.approx(0.25, rel=0.01)  # 20000·784 draws
    s = noise.scale(784)
    assert s == pytest.approx(0.25 * math.sqrt(784 / 24))
    radius2 = (flat.norm(dim=1) / s) ** 2
    assert stats.kstest(radius2.numpy(), "chi2", args=(24,)).pvalue > 1e-3
    # directions uniform: the first coordinate of z/‖z‖ has mean 0 and variance 1/d
    first = (flat[:, 0] / flat.norm(dim=1)).numpy()
    assert abs(first.mean()) < 5 * math.sqrt(1 / 784 / len(first))
    assert first.var() == pytest.approx(1 / 784, rel=0.05)


def test_draws_follow_the_generator():
    _, a = draws(16, shape=(1, 8, 8), count=5, seed=3)
    _, b = draws(16, shape=(1, 8, 8), count=5, seed=3)
    assert torch.equal(a, b)


def test_the_name_carries_k():
    cls = NOISES["general-gaussian:k=380.0"]
    assert cls is NOISES["general-gaussian:k=380"]
    assert cls.name == "general-gaussian:k=380" and cls.family == "general-gaussian"
    assert NOISES["general-gaussian:k=2.5"].name == "general-gaussian:k=2.5"
    assert "general-gaussian" in NOISES and "general-gaussian:k=380" not in NOISES  # families


@pytest.mark.parametrize("bad", ["general-gaussian:k=-1", "general-gaussian:j=3",
                                 "general-gaussian:k=x", "general-gaussian:k=1,k=2",
                                 "gaussian:k=3", "nope:k=1"])
def test_bad_parameters_are_one_line(bad):
    with pytest.raises(SmoothcertError) as err:
        NOISES[bad]
    assert "\n" not in str(err.value)


def test_k_is_required_and_must_leave_two_degrees_of_freedom():
    with pytest.raises(SmoothcertError, match="needs its parameter k"):
        NOISES["general-gaussian"](0.25)
    with pytest.raises(SmoothcertError, match="d - 2k >= 2"):
        NOISES["general-gaussian:k=392"](0.25).sample(torch.zeros(2, 1, 28, 28))


def test_k_zero_is_the_gaussian_radius():
    noise = NOISES["general-gaussian:k=0"](0.5)
    p = np.array([0.6, 0.9, 0.999])
    expected = 0.5 * stats.norm.ppf(p)
    got = noise.radius(p, 784)
    assert np.all(got <= expected) and np.all(got >= expected - 0.5 * 5e-4)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("gg") / "checkpoint.pt")


def test_certify_and_train_from_the_command_line(checkpoint, tmp_path):
    out = tmp_path / "gg.tsv"
    assert main(["certify", str(checkpoint), "--noise", "general-gaussian:k=16.0", "--sigma",
                 "0.25", "--n0", "10", "--n", "60", "--max", "2", "--no-progress", "--device",
                 "cpu", "--out", str(out)]) == 0
    rec = read_records(out)
    assert rec.manifest["identity"]["noise"] == "general-gaussian:k=16.0"
    noise, ok = NOISES["general-gaussian:k=16"](0.25), rec["predict"] >= 0
    expected = np.array([noise.radius(p, 64) if p >= 0.5 else 0.0 for p in rec["p_lower"]])
    np.testing.assert_allclose(rec["radius"][ok], expected[ok], rtol=1e-12)
    run = tmp_path / "run"
    assert main(["train", "--dataset", "digits", "--arch", "digits_cnn", "--sigma", "0.25",
                 "--epochs", "1", "--train-size", "200", "--noise", "general-gaussian:k=16.0",
                 "--out", str(run), "--no-progress", "--device", "cpu"]) == 0
    assert "general-gaussian:k=16\n" in (run / "config.yaml").read_text()  # canonical


@pytest.mark.parametrize("noise", ["general-gaussian:k=40", "general-gaussian:k=q"])
def test_bad_noise_on_the_command_line_exits_2(noise, checkpoint, tmp_path, capsys):
    code = main(["certify", str(checkpoint), "--noise", noise, "--sigma", "0.25", "--n", "20",
                 "--max", "1", "--no-progress", "--device", "cpu", "--out",
                 str(tmp_path / "x.tsv")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x.tsv").exists()
