"""A run's notes are said only once the run is checked (``runs/notes.py``): on a CUDA machine
every run notes what the CUDA defaults chose, and the library notes another σ than the
training one or too few draws, yet a refused run is still ONE line on stderr and exit code 2.

No GPU is needed: the engine settings are told that the device is CUDA (which is what reaches
the CUDA note), while the model and its run stay on the CPU. Under pytest a logged note goes to
the log capture, not to stderr, so each test reads both; the last one runs the CLI in a
process of its own, where notes reach stderr as they do for a user."""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import write_checkpoint
from smoothcert.cli import dataset_run
from smoothcert.cli.app import main
from smoothcert.models.archs import build_model
from smoothcert.models.checkpoint import model_from_checkpoint, save_checkpoint

RUN = ["--n0", "10", "--n", "50", "--max", "2", "--batch", "64", "--no-progress",
       "--device", "cpu"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A digits classifier trained at σ 0.25, the same without noise (``train --method
    standard``: its σ must be given) and one of ablation smoothing (no noise, encoded inputs)."""
    root = tmp_path_factory.mktemp("notes")
    clf = write_checkpoint(root / "clf.pt")
    model, meta = model_from_checkpoint(clf)
    standard = save_checkpoint(root / "standard.pt", model,
                               {**meta, "noise": None, "method": {"name": "standard"}})
    torch.manual_seed(0)
    abl = build_model("digits_cnn", 10, (1, 8, 8), [0.5], [0.5], input_encoding="ablation")
    ablation = save_checkpoint(root / "abl.pt", abl, {
        **meta, "noise": None, "method": {"name": "ablation", "hparams": {}},
        "input_encoding": "ablation"})
    return {"clf": str(clf), "standard": str(standard), "ablation": str(ablation)}


@pytest.fixture
def cuda_settings(monkeypatch):
    """The engine settings of a CUDA device (channels-last, and its note), on the CPU."""
    real = dataset_run.engine_settings
    monkeypatch.setattr(dataset_run, "engine_settings",
                        lambda args, device_type, draws, shard: real(args, "cuda", draws, shard))
    monkeypatch.setattr(dataset_run, "compiler_available", lambda: True)


def notes(caplog) -> list[str]:
    """The smoothcert notes logged so far."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("smoothcert")]


BAD = {
    "attack --n 0": (["attack", "{clf}", "--epsilon", "0.5", *RUN[2:], "--n", "0"],
                     "n must be an integer >= 1"),
    "no sigma": (["certify", "{standard}", *RUN], "trained without noise; pass --sigma"),
    "segment on a classifier": (["certify", "{clf}", "--certifier", "segment", *RUN],
                                "certifies segmentation, not this classification model"),
    "median on a classifier": (["certify", "{clf}", "--certifier", "median", *RUN],
                               "certifies regression, not this classification model"),
    "another sigma, then refused": (["certify", "{clf}", "--sigma", "0.5", "--certifier",
                                     "segment", *RUN], "certifies segmentation"),
    "ablation band too wide": (["certify", "{ablation}", "--certifier", "ablation", "--opt",
                                "size=9", *RUN[4:]], "wider than the image"),
    "ablation block too large": (["certify", "{ablation}", "--certifier", "ablation", "--opt",
                                  "mode=block", "--opt", "size=9", *RUN[4:]],
                                 "does not fit a 8x8 image"),
    "ablation threshold": (["certify", "{ablation}", "--certifier", "ablation", "--opt",
                            "threshold=2", *RUN[4:]], "threshold is a softmax score"),
    "ablation keep": (["certify", "{ablation}", "--certifier", "ablation", "--opt",
                       "mode=pixels", "--opt", "keep=0", *RUN[4:]], "needs keep >= 1"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_refused_run_is_one_line_without_notes(case, files, tmp_path, cuda_settings,
                                                 caplog, capsys):
    argv, says = BAD[case]
    out = tmp_path / "r.tsv"
    with caplog.at_level(logging.INFO):
        code = main([a.format(**files) for a in argv] + ["--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert notes(caplog) == []  # held while the run was checked, then dropped
    assert not list(tmp_path.iterdir())  # and nothing written


def test_a_file_that_refuses_the_run_is_one_line_too(files, tmp_path, cuda_settings, caplog,
                                                     capsys):
    """The record file is a check too: another configuration on the same --out is refused
    when it is opened, and the notes of the refused rerun are not said."""
    out = tmp_path / "r.tsv"
    assert main(["certify", files["clf"], *RUN, "--out", str(out)]) == 0
    capsys.readouterr(), caplog.clear()
    with caplog.at_level(logging.INFO):
        code = main(["certify", files["clf"], *RUN, "--sigma", "0.5", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "different configuration" in err, err
    assert notes(caplog) == []


def test_a_run_says_its_notes_once_checked(files, tmp_path, cuda_settings, caplog, capsys,
                                          monkeypatch):
    """A good run says the CUDA note and the σ note, after its checks (none had been said when
    its record file was opened), before its first row."""
    from smoothcert.runs import runner

    said_at_open, said_at_row = [], []
    real_open, real_rows = runner._open, runner.run_rows
    monkeypatch.setattr(runner, "_open", lambda *a, **k: (said_at_open.extend(notes(caplog)),
                                                          real_open(*a, **k))[1])
    monkeypatch.setattr(runner, "run_rows", lambda *a, **k: (said_at_row.extend(notes(caplog)),
                                                             real_rows(*a, **k))[1])
    out = tmp_path / "r.tsv"
    with caplog.at_level(logging.INFO):
        assert main(["certify", files["clf"], "--sigma", "0.5", *RUN, "--out", str(out)]) == 0
    assert said_at_open == []
    cuda, sigma = said_at_row
    assert cuda.startswith("note: CUDA defaults for a run of 120 draws: channels-last on")
    assert sigma.startswith("note: certifying with sigma 0.5; the checkpoint")
    assert notes(caplog) == said_at_row and out.exists()
    assert capsys.readouterr().err == ""  # under pytest, notes go to the log capture


SCRIPT = """
import contextlib, io, json, sys
from smoothcert.cli import dataset_run
from smoothcert.cli.app import main
real = dataset_run.engine_settings
dataset_run.engine_settings = lambda args, t, draws, shard: real(args, "cuda", draws, shard)
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        results.append((main(argv), err.getvalue()))
print(json.dumps(results))
"""


def test_on_stderr_as_a_user_sees_it(files, tmp_path):
    """Outside pytest a note is a line on stderr (logging's last resort): the refused run
    prints its error alone, the good one its notes."""
    runs = [["certify", files["clf"], "--sigma", "0.5", "--certifier", "segment", *RUN,
             "--out", str(tmp_path / "bad.tsv")],
            ["certify", files["clf"], "--sigma", "0.5", *RUN, "--out", str(tmp_path / "ok.tsv")]]
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(runs)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).parent)
    assert proc.returncode == 0, proc.stderr
    (bad, bad_err), (ok, ok_err) = json.loads(proc.stdout.splitlines()[-1])
    assert bad == 2 and bad_err.count("\n") == 1 and "error:" in bad_err, bad_err
    assert ok == 0 and [line[:25] for line in ok_err.splitlines()] == [
        "note: CUDA defaults for a", "note: certifying with sig"], ok_err
