"""Off a terminal a run prints a plain progress line now and then (step 13, item 4): before,
``certify`` and ``attack`` printed nothing for minutes when stderr was a log file. The clock and
the interval are injected: no test sleeps."""

from __future__ import annotations

import io

import torch

from conftest import Halfspace
from smoothcert import certify_dataset
from smoothcert.runs import progress
from smoothcert.runs.progress import ProgressLines


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_line_every_interval_with_pace_and_time_left():
    clock, out = Clock(), io.StringIO()
    with ProgressLines(10, 0, "certify r.tsv", interval=30, clock=clock, stream=out) as meter:
        for _ in range(3):  # 3 images in 12 s: no line yet (the interval is 30 s)
            clock.now += 4
            meter.update()
        clock.now += 24  # 4 images in 36 s: 9 s/image, 6 images left
        meter.update()
        for _ in range(5):  # within 30 s of the last line: silent
            clock.now += 1
            meter.update()
        clock.now += 40
        meter.update()  # the last image: the closing line says it
    assert out.getvalue().splitlines() == [
        "certify r.tsv: 10 images to go; a line every 30 s",
        "certify r.tsv: 4/10 images, 9 s/image, 0:00:54 left",
        "certify r.tsv: 10/10 images, 10 in 0:01:21 (8.1 s/image)",
    ]


def test_a_resumed_run_paces_only_its_own_images():
    clock, out = Clock(), io.StringIO()
    meter = ProgressLines(100, 90, "attack a.tsv", interval=5, clock=clock, stream=out)
    clock.now += 20
    meter.update(2)
    meter.close()
    assert out.getvalue().splitlines() == [
        "attack a.tsv: 10 images to go (90 done before); a line every 5 s",
        "attack a.tsv: 92/100 images, 10 s/image, 0:01:20 left",
        "attack a.tsv: 92/100 images, 2 in 0:00:20 (10 s/image)",
    ]


def test_the_runner_prints_lines_to_stderr(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(progress, "INTERVAL", 0.0)  # a line at every image
    model = Halfspace(torch.ones(1, 2, 2), input_shape=(1, 2, 2))
    data = [(torch.full((1, 2, 2), 0.1 * i), 1) for i in range(3)]
    certify_dataset(model, data, sigma=0.5, n0=10, n=50, batch=64, num_classes=2,
                    progress="lines", out=tmp_path / "r.tsv")
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == "certify r.tsv: 3 images to go; a line every 0 s"
    assert lines[1].startswith("certify r.tsv: 1/3 images, ") and lines[1].endswith(" left")
    assert lines[-1].startswith("certify r.tsv: 3/3 images, 3 in 0:00:0")
    assert "\r" not in err  # plain lines, not a bar's carriage returns


def test_one_example_to_go_is_singular():
    """"1 images to go" read wrong; the opening line counts in the singular for one."""
    out = io.StringIO()
    ProgressLines(5, 4, "certify r.tsv", interval=30, clock=Clock(), stream=out)
    assert out.getvalue().splitlines()[0] == (
        "certify r.tsv: 1 image to go (4 done before); a line every 30 s")
