"""A certifier's other models by role (``--model ROLE=CKPT``, ``runs/roles.py``) and ``--sigma``
lists: what a user types wrong is one line on stderr, exit 2, and no record file; a run with
other models keeps their fingerprints in its identity."""

import json

import pytest
import torch

from conftest import write_checkpoint
from smoothcert.cli.app import main
from smoothcert.errors import SmoothcertError
from smoothcert.runs.roles import load_roles, role_fingerprints

CERTIFY = ["--n0", "20", "--n", "100", "--batch", "64", "--max", "1", "--no-progress",
           "--device", "cpu"]


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("model, says", [
    ("selection", "--model takes ROLE=CKPT, got 'selection'"),
    ("=x.pt", "--model takes ROLE=CKPT, got '=x.pt'"),
    ("core=", "--model takes ROLE=CKPT, got 'core='"),
    ("core=c.pt", "certifier 'certify' takes no other model, not core"),
])
def test_bad_or_unwanted_models_are_one_line(model, says, tmp_path, capsys):
    checkpoint = write_checkpoint(tmp_path / "c.pt")
    err = one_line_error(capsys, ["certify", str(checkpoint), "--model", model, *CERTIFY,
                                  "--out", str(tmp_path / "r.tsv")])
    assert says in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_a_role_given_twice_is_one_line(tmp_path, capsys):
    checkpoint = write_checkpoint(tmp_path / "c.pt")
    err = one_line_error(capsys, ["certify", str(checkpoint), "--model", "a=x.pt", "--model",
                                  "a=y.pt", *CERTIFY, "--out", str(tmp_path / "r.tsv")])
    assert "--model a is given twice" in err


@pytest.mark.parametrize("sigma, says", [
    ("0.5,0.25", "--sigma takes one value with --certifier certify"),
    ("0.5,-1", "expected a number > 0 or a comma-separated list"),
    ("0.5,,", "expected a number > 0 or a comma-separated list"),
    ("nan", "expected a number > 0 or a comma-separated list"),
])
def test_sigma_lists_outside_a_cascade_are_one_line(sigma, says, tmp_path, capsys):
    checkpoint = write_checkpoint(tmp_path / "c.pt")
    assert main(["certify", str(checkpoint), "--sigma", sigma, *CERTIFY,
                 "--out", str(tmp_path / "r.tsv")]) == 2
    assert says in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


class Roles:
    """A certifier stand-in that takes the roles ``a`` and ``b``."""

    name, model_roles = "stand-in", ("a", "b")

    def check_models(self, roles):
        if roles != {"a", "b"}:
            raise SmoothcertError(f"needs a and b, got {sorted(roles)}")


def test_roles_load_as_sources_and_fingerprint_by_role(tmp_path):
    a, b = write_checkpoint(tmp_path / "a.pt"), torch.nn.Linear(4, 2)
    b.num_classes = 2
    sources = load_roles({"b": b, "a": a}, Roles(), "cpu")
    assert list(sources) == ["a", "b"] and sources["b"].num_classes == 2
    prints = role_fingerprints(sources)
    assert prints == {"a": sources["a"].sha256, "b": sources["b"].sha256}
    assert json.loads(json.dumps(prints)) == prints and prints["a"] != prints["b"]
    assert role_fingerprints({}) is None  # runs of one model keep their identity
    with pytest.raises(SmoothcertError, match="needs a and b"):
        load_roles({"a": a}, Roles(), "cpu")
    with pytest.raises(SmoothcertError, match="non-empty name"):
        load_roles({"": a, "a": a, "b": b}, Roles(), "cpu")
