"""Step 13 items 5.3, 5.9 and 4: every bad checkpoint is one line naming the file and what is
wrong, found where it is read: an empty, random or hostile file, a meta with missing, mistyped or
absurd fields, weights that do not fit or are not finite; and a train run folder stands for its
checkpoint.pt."""

from __future__ import annotations

import math
import os
import random

import pytest
import torch

from conftest import write_checkpoint
from smoothcert.cli.app import main
from smoothcert.errors import SmoothcertError
from smoothcert.models import build_model
from smoothcert.models.checkpoint import (
    checkpoint_file,
    load_checkpoint,
    load_weights,
    model_from_checkpoint,
)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("good") / "checkpoint.pt")


def edited(good, path, meta=None, state=None):
    """A copy of the checkpoint ``good`` at ``path`` with its meta and weights changed."""
    payload = torch.load(good, weights_only=True)
    if meta is not None:
        payload["meta"] = meta(dict(payload["meta"]))
    if state is not None:
        payload["state_dict"] = state(dict(payload["state_dict"]))
    torch.save(payload, path)
    return path


def refused(path, *words) -> str:
    """The one-line error of loading ``path`` as certify does."""
    with pytest.raises(SmoothcertError) as caught:
        model_from_checkpoint(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message, message
    assert "weights_only" not in message  # never torch's advice to unpickle code
    for word in words:
        assert word in message, message
    return message


# --------------------------------------------------------------------------- bytes
def test_an_empty_file(tmp_path):
    (tmp_path / "e.pt").write_bytes(b"")
    refused(tmp_path / "e.pt", "is empty")


def test_random_bytes(tmp_path):
    (tmp_path / "r.pt").write_bytes(random.Random(0).randbytes(4096))
    refused(tmp_path / "r.pt", "cannot be read")


class Hostile:
    def __reduce__(self):
        return (os.system, ("touch hostile-ran",))


def test_a_hostile_pickle_never_runs_and_gets_no_advice_to_run_it(tmp_path, monkeypatch):
    """Before: 6 lines with torch's advice to pass weights_only=False."""
    monkeypatch.chdir(tmp_path)
    torch.save({"format": "smoothcert-checkpoint", "meta": Hostile()}, tmp_path / "h.pt")
    refused(tmp_path / "h.pt", "pickled code", "never unpickles")
    assert not (tmp_path / "hostile-ran").exists()


# --------------------------------------------------------------------------- meta
@pytest.mark.parametrize("change, words", [
    (lambda m: {}, ["meta lacks arch, dataset, num_classes"]),
    (lambda m: {k: v for k, v in m.items() if k != "dataset"}, ["meta lacks dataset"]),
    (lambda m: {**m, "noise": {"name": "gaussian", "sigma": "abc"}}, ["meta noise", "sigma"]),
    (lambda m: {**m, "noise": {"name": "gaussian", "sigma": math.nan}}, ["meta noise"]),
    (lambda m: {**m, "noise": {"name": "gaussian", "sigma": -0.5}}, ["meta noise"]),
    (lambda m: {**m, "num_classes": 10**12}, ["num_classes is 1000000000000", "0..1000000"]),
    (lambda m: {**m, "num_classes": 1e12}, ["num_classes is 1000000000000.0"]),
    (lambda m: {**m, "num_classes": "10"}, ["num_classes is '10'"]),
    (lambda m: {**m, "input_shape": [1, 8, -8]}, ["input_shape is [1, 8, -8]"]),
    (lambda m: {**m, "input_shape": [1, 10**9, 10**9]}, ["input_shape"]),
    (lambda m: {**m, "std": [0.0]}, ["meta std is [0.0]", "positive"]),
    (lambda m: {**m, "mean": [0.1, 0.2, 0.3, 0.4]}, ["mean has 4 values for 1 channels"]),
    (lambda m: {**m, "epoch": -1}, ["meta epoch is -1"]),
    (lambda m: {**m, "method": "gaussian"}, ["meta method is 'gaussian'"]),
    (lambda m: {**m, "arch": None}, ["meta arch is None"]),
], ids=["empty", "no-dataset", "sigma-abc", "sigma-nan", "sigma-negative",
        "classes-1e12", "classes-float",
        "classes-str", "negative-side", "huge-input", "std-0", "mean-4", "epoch-1",
        "method-str", "arch-none"])
def test_a_bad_meta_is_one_line_naming_the_field(good, tmp_path, change, words):
    """Before: KeyError 'dataset', ValueError, or "out of memory" when the model was built."""
    path = edited(good, tmp_path / "m.pt", meta=change)
    refused(path, *words)
    with pytest.raises(SmoothcertError):
        load_checkpoint(path)  # refused wherever it is read (train --resume, report --train)


def test_a_bad_meta_through_certify_is_one_line(good, tmp_path, capsys):
    path = edited(good, tmp_path / "m.pt", meta=lambda m: {})
    out = tmp_path / "r.tsv"
    assert main(["certify", str(path), "--n0", "10", "--n", "20", "--max", "1", "--device",
                 "cpu", "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "meta lacks" in err and str(path) in err, err
    assert not out.exists()


# --------------------------------------------------------------------------- weights
def test_weights_that_do_not_fit_are_one_line(good, tmp_path):
    """Before: torch's 3-5 line message."""
    def change(state):
        state.pop(next(iter(state)))
        state["extra.weight"] = torch.zeros(3)
        key = [k for k in state if k.endswith("weight") and k != "extra.weight"][-1]
        state[key] = torch.zeros(7, 7)
        return state

    path = edited(good, tmp_path / "w.pt", state=change)
    refused(path, "do not fit a digits_cnn model", "1 missing", "1 unexpected: extra.weight",
            "is [7, 7] in the file")


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_weights_are_refused(good, tmp_path, bad):
    """Before: a NaN model voted class 0 everywhere and certified it at radius 0.375."""
    def change(state):
        key = next(k for k, v in state.items() if v.is_floating_point())
        state[key] = state[key].clone().view(-1).index_fill(0, torch.tensor([0]), bad) \
            .view_as(state[key])
        return state

    path = edited(good, tmp_path / "n.pt", state=change)
    refused(path, "NaN or inf")


def test_load_weights_names_the_model_and_the_fix():
    model = build_model("digits_cnn", 10, (1, 8, 8), [0.5], [0.5])
    other = build_model("digits_cnn", 3, (1, 8, 8), [0.5], [0.5]).state_dict()
    with pytest.raises(SmoothcertError) as caught:
        load_weights(model, other, "the catrs teacher t.pt", "the student's digits_cnn",
                     fix="train the teacher with the same arch")
    message = str(caught.value)
    assert message.startswith("the weights in the catrs teacher t.pt do not fit the student's")
    assert message.endswith("; train the teacher with the same arch") and "\n" not in message
    load_weights(model, model.state_dict(), "x", "y")  # what fits loads


# --------------------------------------------------------------------------- run folders
def test_a_run_folder_stands_for_its_checkpoint(good, tmp_path):
    """Before: "checkpoint runs/X does not exist" for a train run folder."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(good.read_bytes())
    assert checkpoint_file(run) == run / "checkpoint.pt"
    model, meta = model_from_checkpoint(run)
    assert meta["arch"] == "digits_cnn" and not model.training


def test_a_folder_without_a_checkpoint_says_what_it_holds(tmp_path):
    (tmp_path / "log.tsv").write_text("epoch\n")
    (tmp_path / "config.yaml").write_text("epochs: 1\n")
    with pytest.raises(SmoothcertError, match=f"^{tmp_path} is a folder without a checkpoint.pt "
                                              r"\(it holds config.yaml, log.tsv\)"):
        load_checkpoint(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SmoothcertError, match="it is empty"):
        load_checkpoint(tmp_path / "empty")
    with pytest.raises(SmoothcertError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")
