"""smoothing/probe.py: the batch a run measures fastest, on a fake clock. A model stands for the
device: each forward advances the clock by what its batch costs (a launch overhead plus a cost
per row), and a batch above what it holds raises torch's out-of-memory error."""

import pytest
import torch

from conftest import Clock, launch_bound
from conftest import TimedDevice as Device
from smoothcert import Gaussian
from smoothcert.errors import SmoothcertError
from smoothcert.smoothing.engine import BatchedVotes
from smoothcert.smoothing.probe import (
    BATCHES,
    REPEATS,
    Timing,
    Tuning,
    fastest_batch,
    time_batch,
    time_batches,
)

pytestmark = pytest.mark.usefixtures("one_thread")


X = torch.full((1, 4, 4), 0.5)


def test_each_batch_is_timed_after_a_warm_up_on_the_clock():
    clock = Clock()
    model = Device(clock, launch_bound)
    seconds = time_batch(BatchedVotes(), model, X, Gaussian(0.25), 1024, clock)
    assert seconds == pytest.approx(launch_bound(1024) / 1024)
    assert model.batches == [1024] * (REPEATS + 1)


def test_the_fastest_batch_and_ties_to_the_smaller():
    clock = Clock()
    timings = time_batches(BatchedVotes(), Device(clock, launch_bound), X, Gaussian(0.25),
                           [4096, 512, 1024, 2048], clock)
    assert [t.batch for t in timings] == [512, 1024, 2048, 4096]
    per_draw = [t.seconds_per_draw for t in timings]
    assert per_draw == sorted(per_draw, reverse=True)
    assert fastest_batch(timings) == 4096
    # 2048's 5.88 µs a draw is within 80% of 4096's 3.44 µs (1024's 10.8 µs is not)
    assert fastest_batch(timings, ties=0.8) == 2048
    assert fastest_batch([Timing(512, 2.0), Timing(1024, 1.0), Timing(2048, 1.02)]) == 1024
    assert fastest_batch([Timing(512, None)]) is None


def test_a_batch_that_does_not_fit_ends_the_measurement():
    clock = Clock()
    model = Device(clock, launch_bound, fits=2048)
    timings = time_batches(BatchedVotes(), model, X, Gaussian(0.25), BATCHES, clock)
    assert timings[-1] == Timing(4096, None) and len(timings) == 4
    assert fastest_batch(timings) == 2048
    model.fits = 256
    assert time_batches(BatchedVotes(), model, X, Gaussian(0.25), BATCHES, clock) == [
        Timing(512, None)]  # no larger batch is tried


def test_the_measurement_runs_as_the_engine_does():
    """Under autocast at the engine's precision (the fake device halves its time in bf16)."""
    clock = Clock()
    model = Device(clock, launch_bound)
    fp32 = time_batch(BatchedVotes(), model, X, Gaussian(0.25), 512, clock)
    bf16 = time_batch(BatchedVotes(precision="bf16"), model, X, Gaussian(0.25), 512, clock)
    assert bf16 == pytest.approx(fp32 / 2)


def test_tuning_checks_and_bounds_its_cost():
    assert Tuning().batches == () and Tuning().compare == ()
    with pytest.raises(SmoothcertError, match="batch"):
        Tuning(batches=(0,))
    with pytest.raises(SmoothcertError, match="share"):
        Tuning(share=0)
    assert Tuning(BATCHES).cost(1000) == (REPEATS + 1) * sum(BATCHES)
    assert Tuning((), ("bf16",)).cost(1000) == (REPEATS + 1) * 2000
    assert Tuning(BATCHES, ("bf16",)).cost(1000) == (REPEATS + 1) * (sum(BATCHES) + 4096)
