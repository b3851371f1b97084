"""Off a terminal ``train`` prints plain progress lines within an epoch (Step 15, issue 36 item 2):
before, a log showed nothing until the first epoch ended (minutes on CIFAR-10 or ImageNet). The
lines are ``runs/progress.py``'s, as ``certify`` prints them; the interval is set to 0 here (a
line at every batch), so no test sleeps."""

from __future__ import annotations

import re

import pytest

from smoothcert.cli.app import main
from smoothcert.errors import SmoothcertError
from smoothcert.runs import progress
from smoothcert.training import TrainConfig, train

# 1 epoch of digits_cnn on 220 examples at batch 20: 11 steps (the running loss is read every
# 10 steps, as for a bar: a line shows it from step 10 on).
CONFIG = TrainConfig(dataset="digits", arch="digits_cnn", sigma=0.25, epochs=1, batch_size=20,
                     lr=0.05, seed=3, train_size=220)


def test_train_prints_lines_within_the_epoch(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(progress, "INTERVAL", 0.0)
    train(CONFIG, tmp_path / "run", progress="lines")
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err  # plain lines, not a bar
    within = [line for line in lines if line.startswith("epoch 1/1: ")]
    assert [line.split(",")[0] for line in within] == [f"epoch 1/1: {k}/11 batches"
                                                       for k in range(1, 11)]  # not at 11/11
    assert re.fullmatch(r"epoch 1/1: 10/11 batches, [\d.e-]+ s/batch, 0:00:\d\d left, "
                        r"loss=\d\.\d{3}, acc=\d\.\d{3}", within[-1])
    row = next(i for i, line in enumerate(lines) if line.startswith("epoch=1 "))
    assert lines.index(within[-1]) < row  # within the epoch, before its log row


def test_the_cli_prints_lines_off_a_terminal(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(progress, "INTERVAL", 0.0)
    assert main(["train", "--out", str(tmp_path / "run"), "--dataset", "digits", "--arch",
                 "digits_cnn", "--sigma", "0.25", "--epochs", "1", "--batch", "32",
                 "--train-size", "64", "--device", "cpu"]) == 0  # stderr is captured: no TTY
    assert "epoch 1/1: 1/2 batches, " in capsys.readouterr().err


def test_a_bad_progress_mode_is_refused(tmp_path):
    with pytest.raises(SmoothcertError, match="progress must be True, False, 'bar' or 'lines'"):
        train(CONFIG, tmp_path / "run", progress="loud")
    assert not (tmp_path / "run").exists()
