"""Ensemble members checked against each other (models/ensemble.py, runs/inputs.py): members of
another dataset, class names or input shape are refused in one line naming both; members
trained at other σ or noise need --sigma / --noise (the order of the members never picks them),
and the note names every member's; a single path is one member, not its characters; members of
different class counts (modules) are one line, not a torch error."""

import logging

import pytest
import torch
from torch import nn

from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.model_calls import engine_call
from smoothcert.models import build_model
from smoothcert.models.checkpoint import save_checkpoint, versions
from smoothcert.models.ensemble import Ensemble
from smoothcert.runs import certify_dataset

RUN = dict(n0=10, n=40, alpha=0.001, batch=64, seed=4, skip=150)  # 3 of the 359 digits


def member(path, seed=1, *, noise=("gaussian", 0.25), classes=None, dataset="digits"):
    """A digits_cnn checkpoint (10 classes, 1×8×8) trained, says its meta, with ``noise``
    (None: without noise), of class names ``classes`` where given."""
    torch.manual_seed(seed)
    model = build_model("digits_cnn", 10, (1, 8, 8), [0.5], [0.5])
    meta = {"arch": "digits_cnn", "dataset": dataset, "num_classes": 10,
            "input_shape": [1, 8, 8], "mean": [0.5], "std": [0.5],
            "noise": None if noise is None else {"name": noise[0], "sigma": noise[1]},
            "method": {"name": "gaussian", "hparams": {}}, "epoch": 0, "versions": versions(),
            "config": {}}
    if classes is not None:
        meta["classes"] = list(classes)
    return save_checkpoint(path, model, meta)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", "test")


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_members_of_other_sigmas_need_sigma_whatever_their_order(tmp_path, digits, order):
    """Before: σ came from the first member (0.25 one way, 0.5 the other)."""
    paths = [member(tmp_path / "d1.pt", 1), member(tmp_path / "d3.pt", 2, noise=("gaussian", 0.5))]
    ensemble = Ensemble.from_checkpoints([paths[i] for i in order])
    with pytest.raises(SmoothcertError, match="pass --sigma") as err:
        certify_dataset(ensemble, digits, **RUN)
    text = one_line(err)
    assert "d1.pt" in text and "d3.pt" in text and "0.25" in text and "0.5" in text


def test_members_of_other_sigmas_run_at_the_given_sigma_with_a_note(tmp_path, digits, caplog):
    a = member(tmp_path / "d1.pt", 1)
    b = member(tmp_path / "d3.pt", 2, noise=("gaussian", 0.5))
    with caplog.at_level(logging.WARNING):
        rows = certify_dataset(Ensemble.from_checkpoints([b, a]), digits, sigma=0.3, **RUN)
    assert {r["sigma"] for r in rows} == {0.3}
    notes = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(notes) == 1 and "\n" not in notes[0], notes
    assert all(s in notes[0] for s in ("d1.pt", "d3.pt", "0.25", "0.5", "sigma 0.3")), notes


def test_members_of_other_noises_need_noise_and_certify_in_its_norm(tmp_path, digits, caplog):
    """Before: a uniform-trained and a Gaussian-trained member gave an L1 or an L2 certificate
    by their order."""
    g = member(tmp_path / "gauss.pt", 1)
    u = member(tmp_path / "unif.pt", 2, noise=("uniform", 0.25))
    for paths in ([g, u], [u, g]):
        with pytest.raises(SmoothcertError, match="pass --noise") as err:
            certify_dataset(Ensemble.from_checkpoints(paths), digits, **RUN)
        text = one_line(err)
        assert "gauss.pt" in text and "unif.pt" in text and "uniform" in text
    with caplog.at_level(logging.WARNING):
        rows = certify_dataset(Ensemble.from_checkpoints([u, g]), digits, noise="gaussian",
                               **RUN)
    assert {r["sigma"] for r in rows} == {0.25}  # the σ they share
    notes = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(notes) == 1 and "gauss.pt" in notes[0] and "unif.pt" in notes[0], notes


def test_members_that_agree_on_the_noise_need_nothing(tmp_path, digits, caplog):
    a, b = member(tmp_path / "a.pt", 1), member(tmp_path / "b.pt", 2)
    with caplog.at_level(logging.WARNING):
        rows = certify_dataset(Ensemble.from_checkpoints([a, b]), digits, **RUN)
    assert {r["sigma"] for r in rows} == {0.25} and not [
        r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_member_trained_without_noise_needs_sigma(tmp_path, digits):
    a, clean = member(tmp_path / "a.pt", 1), member(tmp_path / "clean.pt", 2, noise=None)
    for paths in ([a, clean], [clean, a]):
        with pytest.raises(SmoothcertError, match="pass --sigma") as err:
            certify_dataset(Ensemble.from_checkpoints(paths), digits, **RUN)
        assert "clean.pt" in one_line(err) and "without noise" in one_line(err)
    rows = certify_dataset(Ensemble.from_checkpoints([clean, a]), digits, sigma=0.25, **RUN)
    assert len(rows) == 3


def test_members_of_other_class_names_are_refused(tmp_path):
    """Before: two image-folder models of different class sets ran as one ensemble."""
    names = [f"c{i}" for i in range(10)]
    a = member(tmp_path / "a.pt", 1, classes=names)
    b = member(tmp_path / "b.pt", 2, classes=names[:9] + ["zebra"])
    c = member(tmp_path / "c.pt", 3, classes=names[::-1])
    with pytest.raises(SmoothcertError, match="must share classes") as err:
        Ensemble.from_checkpoints([a, b])
    text = one_line(err)
    assert "a.pt" in text and "b.pt" in text and "c9" in text and "zebra" in text
    with pytest.raises(SmoothcertError, match="other order") as err:
        Ensemble.from_checkpoints([a, c])
    assert "a.pt" in one_line(err) and "c.pt" in one_line(err)
    unnamed = member(tmp_path / "u.pt", 4)
    with pytest.raises(SmoothcertError, match="must share classes"):
        Ensemble.from_checkpoints([unnamed, a])
    assert len(Ensemble.from_checkpoints([a, member(tmp_path / "a2.pt", 5,
                                                        classes=names)]).members) == 2


def test_cli_refuses_members_of_other_sigmas_and_runs_with_sigma(tmp_path, capsys, caplog):
    a = member(tmp_path / "d1.pt", 1)
    b = member(tmp_path / "d3.pt", 2, noise=("gaussian", 0.5))
    common = ["--n0", "10", "--n", "30", "--skip", "150", "--device", "cpu", "--no-progress"]
    for command in (["certify"], ["predict"]):
        out = tmp_path / "bad.tsv"
        assert main([*command, str(b), str(a), *common[2 if command == ["predict"] else 0:],
                     "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "pass --sigma" in err and "d1.pt" in err, err
        assert not out.exists()
    out = tmp_path / "ok.tsv"
    with caplog.at_level(logging.WARNING, logger="smoothcert.runs.inputs"):
        assert main(["certify", str(b), str(a), *common, "--sigma", "0.25", "--out",
                     str(out)]) == 0
    (note,) = [r.getMessage() for r in caplog.records if r.name == "smoothcert.runs.inputs"]
    assert "d1.pt" in note and "d3.pt" in note and "0.5" in note and "\n" not in note


@pytest.mark.parametrize("single", [str, lambda p: p])
def test_from_checkpoints_takes_one_path_as_one_member(tmp_path, digits, single):
    """Before: a string was walked character by character ("a", ".", "p", "t")."""
    path = member(tmp_path / "a.pt", 1)
    one = Ensemble.from_checkpoints(single(path))
    assert len(one.members) == 1
    assert one.member_sha256 == Ensemble.from_checkpoints([path]).member_sha256
    with pytest.raises(SmoothcertError, match="paths of checkpoints"):
        Ensemble.from_checkpoints(42)


@pytest.mark.parametrize("consensus", [None, 2, "exact"])
def test_modules_of_other_class_counts_are_one_line(consensus):
    """Before: torch.stack's 'stack expects each tensor to be equal size'."""
    members = [nn.Linear(4, 3), nn.Linear(4, 5), nn.Linear(4, 3)]
    ensemble = Ensemble(members, "softmax", consensus=consensus)
    x = torch.randn(6, 4)
    with pytest.raises(SmoothcertError, match="members must return the same classes") as err, \
            torch.no_grad(), engine_call(argmax_only=True):
        ensemble(x)
    assert "member 2 returns 5" in one_line(err) and "member 1 returns 3" in one_line(err)
