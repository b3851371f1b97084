"""Threshold votes in the engine (Levine & Feizi 2020): a draw votes for EVERY class whose softmax
score is >= θ (several classes, or none), counted in the same table as argmax votes.

The oracle is a plain loop over canonical chunks (the engine's documented contract, as in
``test_engine_oracle.py``) that adds (softmax >= θ) per class; the engine packs the draws of many
inputs into shared batches, splits chunks over batches and counts on device, and must give the
same counts, draw for draw. Requests with other voting rules share a run but never a batch.
"""

import numpy as np
import pytest
import torch
from test_engine_oracle import CHUNK, CLASSES, SIGMA  # noqa: E402
from test_engine_oracle import Linear64 as OracleLinear64  # noqa: E402

from smoothcert.model_calls import current_call
from smoothcert.noise import Gaussian
from smoothcert.smoothing import BatchedVotes, Draws
from smoothcert.smoothing.ablation import Ablation, Sweep


class Linear64(OracleLinear64):
    """The engine oracle's fixed float64 affine map of 2×3×3 inputs, with NaN read as 0 (so
    that ablated inputs vote too)."""

    def forward(self, x):
        return super().forward(torch.nan_to_num(x, nan=0.0))


def votes(model, batch, threshold):
    with torch.no_grad():
        logits = model(batch)
    if threshold is None:
        return np.eye(CLASSES, dtype=np.int64)[logits.argmax(dim=1).numpy()]
    return (logits.softmax(dim=1) >= threshold).long().numpy()


def oracle(model, x, perturb, sizes, threshold):
    """Counts (len(sizes), CLASSES): per segment, per canonical chunk, perturb and vote."""
    counts = np.zeros((len(sizes), CLASSES), dtype=np.int64)
    for segment, size in enumerate(sizes):
        for start in range(0, size, CHUNK):
            batch = torch.empty((min(CHUNK, size - start), *x.shape))
            perturb(batch)
            counts[segment] += votes(model, batch, threshold).sum(axis=0)
    return counts


def cases():
    g = torch.Generator().manual_seed(11)
    sizes = [(5, 37), (1, 8), (9, 16), (16, 3), (7, 50), (0, 21)]
    return [(torch.rand(2, 3, 3, generator=g), s) for s in sizes]


def generator(i):
    return torch.Generator().manual_seed(1000 + i)


def rule(i, mixed):
    """The voting rule of input i: θ = 0.15 (several votes per draw), or argmax for every
    other input when the run mixes rules."""
    return None if mixed and i % 2 else 0.15


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("batch_size", [3, 8, 13, 200])
def test_threshold_counts_equal_the_plain_loop(batch_size, mixed):
    model, noise = Linear64(), Gaussian(SIGMA)

    def program(x, sizes, i):
        return (yield Draws(x, noise, sizes, generator(i), threshold=rule(i, mixed)))

    programs = [(i, program(x, s, i)) for i, (x, s) in enumerate(cases())]
    got = {d.key: d.result for d in BatchedVotes(chunk=CHUNK).run(model, programs, CLASSES,
                                                                   batch_size)}
    several = False
    for i, (x, sizes) in enumerate(cases()):
        g = generator(i)
        expected = oracle(model, x, lambda b, g=g, x=x: noise.perturb_(b, x, g), sizes,
                          rule(i, mixed))
        np.testing.assert_array_equal(got[i], expected, err_msg=f"input {i}")
        several |= bool(expected.sum() > sum(sizes))
    assert several, "no draw voted for two classes: θ would not be tested"


def test_a_sweep_with_threshold_votes_counts_every_position_once():
    model, ablation = Linear64(), Ablation("block", 2)
    x = cases()[0][0]
    n = ablation.positions(x.shape)

    def program():
        return (yield Draws(x, Sweep(ablation), (n,), threshold=0.3))

    (done,) = BatchedVotes(chunk=CHUNK).run(model, [(0, program())], CLASSES, 4)
    expected = oracle(model, x, _sweeper(ablation, x), (n,), 0.3)
    np.testing.assert_array_equal(done.result, expected)


def _sweeper(ablation, x):
    sweep = Sweep(ablation)
    return lambda batch: sweep.perturb_(batch, x)


class Spy(Linear64):
    """Records what the engine tells it about each call (``argmax_only``)."""

    def __init__(self):
        super().__init__()
        self.flags = []

    def forward(self, x):
        self.flags.append((current_call().argmax_only, x.shape[0]))
        return super().forward(x)


def test_threshold_batches_ask_the_model_for_every_score_and_never_mix_rules():
    # An ensemble may skip members that cannot change an argmax (``argmax_only``); a threshold
    # vote reads every score, so its batches must say so, and so they hold only such rows.
    model, noise = Spy(), Gaussian(SIGMA)

    def program(i):
        return (yield Draws(cases()[i][0], noise, (12,), generator(i), threshold=rule(i, True)))

    list(BatchedVotes(chunk=CHUNK).run(model, [(i, program(i)) for i in range(4)], CLASSES, 10))
    rows = {flag: sum(r for f, r in model.flags if f == flag) for flag in (True, False)}
    assert rows == {True: 24, False: 24}  # 2 argmax inputs, 2 threshold inputs, 12 draws each


def test_a_threshold_outside_the_unit_interval_is_refused():
    from smoothcert.errors import SmoothcertError

    def program():
        return (yield Draws(cases()[0][0], Gaussian(SIGMA), (4,), threshold=1.5))

    with pytest.raises(SmoothcertError, match="threshold"):
        list(BatchedVotes().run(Linear64(), [(0, program())], CLASSES, 4))
