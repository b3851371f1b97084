"""What long commands write on stderr: progress bars only on a terminal (``--progress
auto|always|never``, ``--no-progress`` = never), and a next step after Ctrl-C that works."""

import pytest

from conftest import write_checkpoint
from smoothcert.cli.app import build_parser, main

CERTIFY = ["--n0", "8", "--n", "32", "--batch", "32", "--max", "3", "--device", "cpu"]
TRAIN = ["--dataset", "digits", "--arch", "digits_cnn", "--method", "gaussian", "--sigma", "0.25",
         "--epochs", "1", "--batch", "64", "--train-size", "200", "--device", "cpu"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "checkpoint.pt")


def certify_stderr(checkpoint, out, capsys, *flags) -> str:
    capsys.readouterr()
    assert main(["certify", str(checkpoint), *CERTIFY, "--out", str(out), *flags]) == 0
    return capsys.readouterr().err


def test_capsys_stderr_is_not_a_terminal(capsys):
    import sys

    assert not sys.stderr.isatty()  # the premise of the "auto" tests below


@pytest.mark.parametrize("flags", [[], ["--progress", "auto"], ["--progress", "never"],
                                   ["--no-progress"]])
def test_certify_draws_no_bar_into_a_log(checkpoint, tmp_path, capsys, flags):
    err = certify_stderr(checkpoint, tmp_path / "r.tsv", capsys, *flags)
    assert "\r" not in err and "img" not in err


def test_certify_draws_bars_when_asked(checkpoint, tmp_path, capsys):
    err = certify_stderr(checkpoint, tmp_path / "r.tsv", capsys, "--progress", "always")
    assert "\r" in err and "3/3" in err and "img" in err


def test_auto_draws_bars_on_a_terminal(checkpoint, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    err = certify_stderr(checkpoint, tmp_path / "r.tsv", capsys, "--progress", "auto")
    assert "\r" in err and "3/3" in err


@pytest.mark.parametrize("flags,bars", [(["--progress", "auto"], False),
                                        (["--progress", "always"], True)])
def test_train_bars_follow_the_flag(tmp_path, capsys, flags, bars):
    assert main(["train", *TRAIN, "--out", str(tmp_path / "run"), *flags]) == 0
    err = capsys.readouterr().err
    assert ("\r" in err) is bars and ("epoch 1/1" in err) is bars
    # the epoch's summary line, bars or not: a log (SLURM, `make demo > log`) shows each epoch
    (line,) = [s for s in err.replace("\r", "\n").splitlines() if "train_acc=" in s]
    assert line.startswith("epoch=1 ")


@pytest.mark.parametrize("command", ["train", "certify", "predict", "attack", "demo"])
def test_every_command_with_bars_takes_the_flag(command):
    parser = build_parser()
    argv = {"train": [command, "--out", "o"], "demo": [command]}.get(
        command, [command, "ckpt", "--out", "o"])
    argv += ["--epsilon", "0.5"] if command == "attack" else []
    assert parser.parse_args([*argv, "--progress", "always"]).progress == "always"
    assert parser.parse_args([*argv, "--no-progress"]).progress == "never"
    assert parser.parse_args(argv).progress == "auto"
    assert parser.parse_args(["analyze", "grad-norms", "ckpt", "--progress", "never"]).progress \
        == "never"


# --------------------------------------------------------------------------- Ctrl-C
def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def test_interrupted_train_says_resume(monkeypatch, tmp_path, capsys):
    """``train`` refuses its own run folder without --resume, so "rerun the same command"
    would be refused: the hint names --resume."""
    import smoothcert.training

    monkeypatch.setattr(smoothcert.training, "train", _interrupt)
    assert main(["train", *TRAIN, "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert "smoothcert train: interrupted" in err and "with --resume to continue" in err


@pytest.mark.parametrize("command", ["certify", "predict", "attack"])
def test_interrupted_run_says_rerun(monkeypatch, checkpoint, tmp_path, capsys, command):
    import smoothcert.runs

    monkeypatch.setattr(smoothcert.runs, "certify_dataset", _interrupt)
    extra = ["--epsilon", "0.5"] if command == "attack" else []
    assert main([command, str(checkpoint), "--out", str(tmp_path / "r.tsv"), *extra]) == 130
    err = capsys.readouterr().err
    assert f"smoothcert {command}: interrupted; rerun the same command to resume" in err
    assert "--resume" not in err


def test_train_hint_is_what_resumes(tmp_path, capsys):
    """The hint's command works: rerun as it was, train is refused; with --resume it runs."""
    argv = ["train", *TRAIN, "--out", str(tmp_path / "run"), "--no-progress"]
    assert main(argv) == 0
    assert main(argv) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0


def test_demo_into_a_log_has_no_carriage_returns(tmp_path, capsys, monkeypatch):
    """`make demo > log 2>&1`: the demo (shrunk to 1 epoch on 200 digits, n = 100) writes lines,
    one per step, and no bar."""
    import dataclasses

    from smoothcert.cli import demo

    monkeypatch.setattr(demo, "TRAIN", dataclasses.replace(demo.TRAIN, epochs=1, train_size=200))
    monkeypatch.setattr(demo, "N", 100)
    assert main(["demo", "--out", str(tmp_path / "demo"), "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "\r" not in out + err
    assert "training the digits CNN" in out and "Certified accuracy" in out
