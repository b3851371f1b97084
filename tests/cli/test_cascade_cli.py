"""``certify --certifier cascade`` on the command line: ``--sigma`` lists and one checkpoint per
level; what a user types wrong is one line on stderr, exit 2, and no record file."""

import pytest

from conftest import write_checkpoint
from smoothcert.cli.app import main
from smoothcert.runs.records import read_records

RUN = ["--n0", "10", "--n", "40", "--batch", "40", "--max", "2", "--no-progress",
       "--device", "cpu"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("cascade_cli")
    return [str(write_checkpoint(root / f"{k}.pt")) for k in "ab"]


def test_help_lists_the_cascade_and_its_options(capsys):
    assert main(["certify", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "cascade" in text and "alpha_split" in text and "p0" in text


@pytest.mark.parametrize("extra, says", [
    (["--sigma", "0.25,0.5", "--certifier", "cascade"], "strictly decreasing"),
    (["--sigma", "0.5,0.25,0.1", "--certifier", "cascade"],
     "a cascade over 3 sigmas takes one checkpoint (for every level) or 3"),
    (["--sigma", "0.5,0.25", "--certifier", "certify"],
     "--sigma takes one value with --certifier certify"),
    (["--sigma", "0.5", "--certifier", "cascade"],  # was: a one-level cascade of an ensemble
     "a cascade takes one checkpoint per level, got 2 checkpoints and one sigma"),
    (["--certifier", "cascade"],  # σ from the checkpoints: the same refusal, not "members"
     "a cascade takes one checkpoint per level, got 2 checkpoints and one sigma"),
    (["--sigma", "0.5,0.25", "--certifier", "cascade", "--opt", "sigmas=1.0,0.5"],  # was dropped
     "--sigma 0.5,0.25 and --opt sigmas=1.0,0.5 both give the levels' sigmas"),
])
def test_bad_levels_are_one_line(checkpoints, tmp_path, capsys, extra, says):
    assert main(["certify", *checkpoints, *extra, *RUN, "--out", str(tmp_path / "r.tsv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert not list(tmp_path.iterdir())


def test_one_checkpoint_per_level(checkpoints, tmp_path):
    out = tmp_path / "r.tsv"
    assert main(["certify", *checkpoints, "--sigma", "0.5,0.25", "--certifier", "cascade",
                 *RUN, "--out", str(out)]) == 0
    records = read_records(out)
    identity = records.manifest["identity"]
    assert identity["options"]["sigmas"] == "0.5,0.25" and identity["sigma"] == 0.5
    assert list(identity["models"]) == ["level2"]
    assert len(records) == 2 and records.columns_order[-6:] == (
        "level", "sigma_level", "radius_neg", "predict_clean", "levels_drawn", "seed")

