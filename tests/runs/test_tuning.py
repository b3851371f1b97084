"""runs/tuning.py: the batch a run measures on its model before its first row, and the note on
what bf16 would take, on a fake clock (the model stands for the device, as in
tests/smoothing/test_probe.py); then a whole run on the CPU: the rows are those of any batch."""

import dataclasses
import logging

import pytest
import torch
from torch import nn

from conftest import Clock, TimedDevice
from smoothcert import Gaussian, certify_dataset
from smoothcert.data.datasets import load_dataset
from smoothcert.runs import RunConfig
from smoothcert.runs.tuning import duration, tuned
from smoothcert.smoothing.probe import BATCHES, Tuning
from smoothcert.smoothing.smoothed import Smoothed

pytestmark = pytest.mark.usefixtures("one_thread")


CFG = RunConfig(certifier="certify", checkpoint_sha256="x", dataset="d", split="test",
                sigma=0.25, n=100_000, alpha=0.001, batch=1000, seed=0, n0=100)
X = torch.full((1, 4, 4), 0.5)
DRAWS = 100 * 100_100  # 100 images


def run_tuned(caplog, tune, fits=None, draws=DRAWS, cfg=CFG):
    clock = Clock()
    model = TimedDevice(clock, fits=fits)
    smoothed = Smoothed(model, Gaussian(0.25), 3)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        out = tuned(cfg, smoothed, X, draws, tune, clock)
    return out, [r.getMessage() for r in caplog.records], model


def test_the_fastest_batch_is_taken_and_said(caplog):
    cfg, (note,), _ = run_tuned(caplog, Tuning(BATCHES))
    assert cfg == dataclasses.replace(CFG, batch=4096)
    # 4096 rows: 14.1 ms, 3.44 µs a draw; 10,010,000 draws: 34 s
    assert note == ("note: batch 4096, the fastest of 512/1024/2048/4096 on this model "
                    "(290,579 draws/s uncompiled: ~34 s for this run's 10,010,000 draws); "
                    "--batch sets one")


def test_a_batch_that_does_not_fit_is_said_and_left(caplog):
    cfg, (note,), _ = run_tuned(caplog, Tuning(BATCHES), fits=2048)
    assert cfg.batch == 2048 and "; out of memory at 4096)" in note
    cfg, notes, _ = run_tuned(caplog, Tuning(BATCHES), fits=100)
    assert cfg == CFG and notes == []  # none fits: the run's own batch, which will say so


def test_bf16_time_beside_the_runs_own(caplog):
    cfg, (batch, bf16), _ = run_tuned(caplog, Tuning(BATCHES, ("bf16",)))
    assert cfg.batch == 4096 and batch.startswith("note: batch 4096")
    assert bf16 == ("note: --precision bf16 would take ~17 s instead of ~34 s for this run's "
                    "10,010,000 draws (both timed uncompiled at batch 4096); it certifies the "
                    "bf16 classifier, another function than this fp32 one, so it is never a "
                    "default")
    # a batch given: only the two precisions are timed, at it
    cfg, (bf16,), _ = run_tuned(caplog, Tuning((), ("bf16",)))
    assert cfg == CFG and "(both timed uncompiled at batch 1000)" in bf16
    assert "~55 s instead of ~2 min" in bf16  # 11 ms per 1000 rows


def test_nothing_is_measured_where_it_would_not_pay(caplog):
    for tune, draws in [(None, DRAWS), (Tuning(), DRAWS), (Tuning(BATCHES), 10**5)]:
        cfg, notes, model = run_tuned(caplog, tune, draws=draws)
        assert cfg == CFG and notes == [] and model.batches == []
    bf16 = dataclasses.replace(CFG, engine={"precision": "bf16"})
    cfg, notes, _ = run_tuned(caplog, Tuning((), ("bf16",)), cfg=bf16)
    assert cfg == bf16 and notes == []  # bf16 beside itself: nothing to say


def test_durations_read_as_a_person_reads_them():
    assert [duration(s) for s in (4.4, 89, 91, 3600, 5400, 36_000)] == [
        "4 s", "89 s", "2 min", "60 min", "1.5 h", "10.0 h"]


def bn_model() -> nn.Module:
    """A small digits classifier with BatchNorm, whose statistics a forward in training mode
    would move."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 64, 10))
    model.num_classes, model.input_shape = 10, (1, 8, 8)
    return model


def test_a_tuned_run_has_the_rows_of_any_batch(caplog):
    """The measured batch changes no row: the noise is drawn per example in canonical chunks
    whatever the batch, the measurement draws from its own generator, and it runs the model in
    eval mode (the BatchNorm keeps its statistics)."""
    data = load_dataset("digits", "test")
    run = dict(sigma=0.25, n0=10, n=1000, max_count=10, seed=3, batch=100)
    plain = certify_dataset(bn_model(), data, **run)
    model = bn_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level(logging.WARNING):
        measured = certify_dataset(model, data, tune=Tuning((16, 64), ("bf16",), share=0.1),
                                   **run)
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 2 and "the fastest of 16/64 on this model" in notes[0]
    assert "--precision bf16 would take" in notes[1]
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert [{k: v for k, v in r.items() if k != "time"} for r in measured] == \
        [{k: v for k, v in r.items() if k != "time"} for r in plain]
