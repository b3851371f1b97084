"""The Monte Carlo engine against a plain loop that shares none of its code.

The oracle reads only the engine's documented contract (``smoothing/engine.py``): each request
segment of an input is drawn, in order, from that input's own generator in canonical chunks of
``chunk`` draws (the last one shorter), and each draw votes argmax f(x + δ). It then adds,
forwards and counts one chunk at a time. The engine packs many inputs' chunks into shared
batches, splits chunks over batches (carry) and counts on device; none of that may change a
single vote, so the counts must be equal, not close.
"""

import math

import numpy as np
import pytest
import torch
from torch import nn

from smoothcert.noise import Gaussian, Uniform
from smoothcert.smoothing import BatchedVotes, Draws, Smoothed

CLASSES, SIGMA, CHUNK = 5, 0.5, 8
NOISES = {"gaussian": Gaussian, "uniform": Uniform}
pytestmark = pytest.mark.usefixtures("one_thread")  # many tiny forwards


class Linear64(nn.Module):
    """A fixed random affine map of 2×3×3 inputs to 5 classes, in float64: its argmax does not
    depend on how rows are batched (float32 rounding could, in principle, flip a near tie)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.register_buffer("w", torch.randn(18, CLASSES, generator=g, dtype=torch.float64))
        self.register_buffer("b", torch.randn(CLASSES, generator=g, dtype=torch.float64))

    def forward(self, x):
        return x.flatten(1).double() @ self.w + self.b


def oracle(model, x, noise, sizes, generator, chunk):
    """Counts (len(sizes), CLASSES): per segment, per canonical chunk, draw δ, add, vote."""
    counts = np.zeros((len(sizes), CLASSES), dtype=np.int64)
    for segment, size in enumerate(sizes):
        for start in range(0, size, chunk):
            delta = torch.empty((min(chunk, size - start), *x.shape))
            if noise == "gaussian":  # N(0, σ²): standard normal times σ
                delta.normal_(generator=generator).mul_(SIGMA)
            else:  # U[−λ, λ], λ = √3·σ (σ is the standard deviation)
                delta.uniform_(-1.0, 1.0, generator=generator).mul_(math.sqrt(3.0) * SIGMA)
            with torch.no_grad():
                votes = model(delta + x).argmax(dim=1)
            counts[segment] += np.bincount(votes.numpy(), minlength=CLASSES)
    return counts


def inputs_and_sizes():
    """Six inputs with (n0, n) of different lengths, so chunks straddle batches irregularly;
    the last input's selection segment is empty."""
    g = torch.Generator().manual_seed(11)
    sizes = [(5, 37), (1, 8), (9, 16), (16, 3), (7, 50), (0, 21)]
    return [(torch.rand(2, 3, 3, generator=g), s) for s in sizes]


def generator(i):
    return torch.Generator().manual_seed(1000 + i)


@pytest.mark.parametrize("noise", list(NOISES))
@pytest.mark.parametrize("batch_size", [3, 8, 13, 200])
def test_packed_engine_counts_equal_the_plain_loop(noise, batch_size):
    # 3 < chunk: every chunk is carried over batches; 8 = chunk; 13: chunks straddle batches;
    # 200: all six inputs share one batch.
    model, smoothing = Linear64(), NOISES[noise](SIGMA)
    cases = inputs_and_sizes()

    def program(x, sizes, i):
        return (yield Draws(x, smoothing, sizes, generator(i)))

    engine = BatchedVotes(chunk=CHUNK)
    programs = [(i, program(x, s, i)) for i, (x, s) in enumerate(cases)]
    got = {d.key: d.result for d in engine.run(model, programs, CLASSES, batch_size)}
    classes_voted = set()
    for i, (x, sizes) in enumerate(cases):
        expected = oracle(model, x, noise, sizes, generator(i), CHUNK)
        np.testing.assert_array_equal(got[i], expected, err_msg=f"input {i}")
        classes_voted |= set(np.flatnonzero(expected.sum(axis=0)).tolist())
    assert len(classes_voted) >= 3  # votes spread over classes: a shuffled draw would show


@pytest.mark.parametrize("noise", list(NOISES))
def test_certify_reads_both_segments_of_the_plain_loop(noise):
    # CERTIFY through Smoothed: ĉ_A is the argmax of the n0 selection counts, n_A that class's
    # count among the n estimation draws, which continue the same generator.
    model, n0, n = Linear64(), 10, 60
    smoothed = Smoothed(model, NOISES[noise](SIGMA), CLASSES, BatchedVotes(chunk=CHUNK))
    xs = [x for x, _ in inputs_and_sizes()]
    programs = [(i, smoothed.certify_program(x, n0, n, 0.05, generator(i)))
                for i, x in enumerate(xs)]
    done = {d.key: d.result for d in smoothed.run(programs, batch_size=13)}
    for i, x in enumerate(xs):
        selection, estimation = oracle(model, x, noise, (n0, n), generator(i), CHUNK)
        c_hat = int(np.argmax(selection))
        assert done[i].count == estimation[c_hat], i
        assert done[i].prediction in (None, c_hat) and (done[i].prediction is None) == (
            done[i].abstained)


def test_default_chunk_longer_than_a_batch():
    # The engine's own chunk (1024 draws) with batches of 700: segments of 1500 draws are cut
    # 1024 + 476 and each 1024-chunk is split over two batches.
    model, smoothing = Linear64(), Gaussian(SIGMA)
    x = inputs_and_sizes()[0][0]

    def program(i):
        return (yield Draws(x, smoothing, (100, 1500), generator(i)))

    engine = BatchedVotes()
    programs = [(i, program(i)) for i in range(2)]
    got = {d.key: d.result for d in engine.run(model, programs, CLASSES, 700)}
    for i in range(2):
        expected = oracle(model, x, "gaussian", (100, 1500), generator(i), engine.chunk)
        np.testing.assert_array_equal(got[i], expected)


class Binary64(Linear64):
    """A second classifier of the same inputs with 2 classes (an ACES selection model)."""

    def forward(self, x):
        return super().forward(x)[:, :2] - super().forward(x)[:, 2:4]


@pytest.mark.parametrize("batch_size", [3, 13, 200])
def test_requests_through_another_model_equal_the_plain_loop(batch_size):
    """``Draws(model=...)``: requests of two models, of 5 and 2 classes, interleaved across six
    programs (each asks the run's model, then the other, then the run's again), packed into
    batches of one model each: every request's counts equal the plain loop's through its own
    model, and the 2-class model's counts fill its 2 columns only."""
    model, other, smoothing = Linear64(), Binary64(), Gaussian(SIGMA)
    cases = inputs_and_sizes()

    def program(x, sizes, i):
        g = generator(i)
        first = yield Draws(x, smoothing, sizes, g)
        second = yield Draws(x, smoothing, sizes, g, model=other, num_classes=2)
        third = yield Draws(x, smoothing, sizes, g)
        return first, second, third

    engine = BatchedVotes(chunk=CHUNK)
    programs = [(i, program(x, s, i)) for i, (x, s) in enumerate(cases)]
    got = {d.key: d.result for d in engine.run(model, programs, CLASSES, batch_size)}
    for i, (x, sizes) in enumerate(cases):
        g = generator(i)
        expected = [oracle(model, x, "gaussian", sizes, g, CHUNK),
                    oracle(other, x, "gaussian", sizes, g, CHUNK),
                    oracle(model, x, "gaussian", sizes, g, CHUNK)]
        for got_counts, want in zip(got[i], expected):
            np.testing.assert_array_equal(got_counts, want, err_msg=f"input {i}")
        assert got[i][1][:, 2:].sum() == 0 and got[i][1].sum() == sum(sizes)


def test_a_request_model_with_more_classes_than_the_run_is_refused():
    def program():
        yield Draws(torch.zeros(2, 3, 3), Gaussian(SIGMA), (4,), generator(0),
                    model=Linear64(), num_classes=CLASSES + 1)

    with pytest.raises(Exception, match="classes"):
        list(BatchedVotes(chunk=CHUNK).run(Linear64(), [(0, program())], CLASSES, 8))
