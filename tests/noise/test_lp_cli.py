"""Every ℓp noise trains and certifies from the command line (the noises come from the
registry: nothing in the CLI names them)."""

import contextlib

import numpy as np
import pytest

from conftest import write_checkpoint
from smoothcert.cli.app import main
from smoothcert.noise import NOISES
from smoothcert.runs.records import read_records

NEW = ["laplace", "pareto", "exp-inf", "exp1", "exp2"]


def test_help_lists_every_new_noise(capsys):
    for command in ("certify", "train"):
        with contextlib.suppress(SystemExit):  # argparse's --help may exit
            main([command, "--help"])
        out = capsys.readouterr().out
        assert all(name in out for name in NEW), command


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("lp") / "checkpoint.pt")


@pytest.mark.parametrize("name", NEW)
def test_certify_with_each_new_noise_records_its_radii(name, checkpoint, tmp_path):
    out = tmp_path / f"{name}.tsv"
    assert main(["certify", str(checkpoint), "--noise", name, "--sigma", "0.25", "--n0", "10",
                 "--n", "40", "--batch", "40", "--max", "2", "--no-progress", "--device", "cpu",
                 "--out", str(out)]) == 0
    rec = read_records(out)
    assert len(rec) == 2 and rec.manifest["identity"]["noise"] == name
    noise, ok = NOISES[name](0.25), rec["predict"] >= 0
    expected = np.array([noise.radius(p, 64) if p >= 0.5 else 0.0 for p in rec["p_lower"]])
    np.testing.assert_allclose(rec["radius"][ok], expected[ok], rtol=1e-12)  # digits: d = 64


def test_train_with_a_dimension_dependent_noise(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--dataset", "digits", "--arch", "digits_cnn", "--sigma", "0.25",
                 "--epochs", "1", "--train-size", "200", "--noise", "exp2", "--out", str(out),
                 "--no-progress", "--device", "cpu"]) == 0
    assert (out / "checkpoint.pt").exists()
