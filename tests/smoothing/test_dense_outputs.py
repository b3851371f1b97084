"""The engine's dense outputs (Draws.outputs): per-pixel argmax counts and raw values equal a
plain loop over the same draws, for every batch size; outputs of the wrong shape or not finite
are refused."""

import numpy as np
import pytest
import torch
from torch import nn

from smoothcert.errors import SmoothcertError
from smoothcert.noise.base import NOISES
from smoothcert.smoothing.engine import BatchedVotes
from smoothcert.smoothing.requests import Draws

NOISE = NOISES["gaussian"](0.5)


class Bins(nn.Module):
    """Per pixel: class 0, 1 or 2 by which of 0, 0.5, 1 its value is nearest."""

    def forward(self, x):
        v = x[:, 0]
        return torch.stack([-(v - 0) ** 2, -(v - 0.5) ** 2, -(v - 1) ** 2], 1)


class Pair(nn.Module):
    def forward(self, x):
        return x.flatten(1)[:, :2] * 2


def _x():
    x = torch.zeros(1, 3, 4)
    x[0, :2] = 1.0
    return x


def _run(model, outputs, sizes, batch, classes):
    def program(seed):
        counts = yield Draws(_x(), NOISE, sizes, torch.Generator().manual_seed(seed),
                             outputs=outputs)
        return counts

    done = BatchedVotes(chunk=64).run(model, [(s, program(s)) for s in (0, 1)], classes, batch)
    return {d.key: d.result for d in done}


def _noisy(seed, sizes):
    """The draws the engine makes for one input (each segment in canonical chunks of 64)."""
    g, x, out = torch.Generator().manual_seed(seed), _x(), []
    for total in sizes:
        for start in range(0, total, 64):
            rows = torch.empty((min(64, total - start),) + tuple(x.shape))
            out.append(NOISE.perturb_(rows, x, g))
    return torch.cat(out)


@pytest.mark.parametrize("batch", [7, 100, 1000])
def test_pixel_votes_equal_a_plain_count(batch):
    got = _run(Bins(), "pixel-votes", (30, 170), batch, 3)
    for seed, counts in got.items():
        labels = Bins()(_noisy(seed, (30, 170))).argmax(1).reshape(200, -1)  # (draws, pixels)
        for segment, rows in enumerate((slice(0, 30), slice(30, 200))):
            want = np.stack([np.bincount(labels[rows, p].numpy(), minlength=3)
                             for p in range(12)])
            np.testing.assert_array_equal(counts[segment], want)


@pytest.mark.parametrize("batch", [5, 1000])
def test_values_are_the_outputs_in_draw_order(batch):
    got = _run(Pair(), "values", (10, 90), batch, 2)
    for seed, values in got.items():
        want = Pair()(_noisy(seed, (10, 90))).double().numpy()
        np.testing.assert_allclose(values[0], want[:10])
        np.testing.assert_allclose(values[1], want[10:])


def test_wrong_shapes_and_nan_outputs_are_refused():
    with pytest.raises(SmoothcertError, match=r"expected \(\d+, K, H, W\)"):
        _run(Pair(), "pixel-votes", (10,), 16, 2)
    nan = nn.Sequential(Pair(), nn.Dropout(0.0))
    nan.register_forward_hook(lambda m, i, o: o * float("nan"))
    with pytest.raises(SmoothcertError, match="NaN/inf"):
        _run(nan, "values", (10,), 16, 2)

    def thresholded():
        yield Draws(_x(), NOISE, (3,), None, 0.5, outputs="values")

    with pytest.raises(SmoothcertError, match="a threshold only with votes"):
        list(BatchedVotes().run(Bins(), [(0, thresholded())], 3, 8))


class Half(nn.Module):
    def forward(self, x):
        return Bins()(x)[:, :, ::2]


def test_per_pixel_logits_of_other_pixels_are_refused():
    with pytest.raises(SmoothcertError, match="labels every input pixel"):
        _run(Half(), "pixel-votes", (10,), 16, 3)
