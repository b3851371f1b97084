"""The Python API's inputs (step 13, items 5.8 and 5.9): what a user may pass to ``Smoothed``
either works as documented or is refused in one SmoothcertError line, never a torch traceback
from deep inside; a model whose logits are not finite is refused, not certified as class 0."""

import numpy as np
import pytest
import torch
from torch import nn

from smoothcert import Gaussian, SmoothcertError, Smoothed
from smoothcert.models import build_model
from smoothcert.smoothing.engine import BatchedVotes

pytestmark = pytest.mark.usefixtures("one_thread")
RUN = dict(n0=10, n=200, alpha=0.01, batch_size=64)


def lenet(dtype=torch.float32):
    """A convolutional classifier (its conv bias is what refused float64 inputs)."""
    torch.manual_seed(0)
    return build_model("digits_cnn", 10, (1, 8, 8), [0.5], [0.5]).eval().to(dtype)


def image(dtype=torch.float32):
    return (torch.arange(64, dtype=torch.float64).reshape(1, 8, 8) % 17 / 16).to(dtype)


def certify(model, x, noise=0.25, generator=0, **run):
    return Smoothed(model, noise, 10).certify(x, generator=generator, **{**RUN, **run})


def test_float64_inputs_are_drawn_as_float32_for_a_float32_model():
    # before: RuntimeError: Input type (double) and bias type (float) should be the same
    assert certify(lenet(), image(torch.float64)) == certify(lenet(), image())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_model_gets_its_noisy_inputs_cast(dtype):
    """The noise is drawn in float32 (not rounded to 16 bits) and the noisy batch cast: the
    votes are those of model(cast(x + δ)), the oracle computed here by hand."""
    model, x, n = lenet(dtype), image(torch.float64), 300
    cert = certify(model, x, n=n)
    g = torch.Generator().manual_seed(0)
    delta = torch.empty((RUN["n0"] + n, 1, 8, 8)).normal_(generator=g).mul_(0.25)
    with torch.no_grad():
        votes = model((delta + image()).to(dtype)).argmax(dim=1)
    selection = torch.bincount(votes[:RUN["n0"]], minlength=10)
    assert cert.count == int((votes[RUN["n0"]:] == int(selection.argmax())).sum())


def test_a_number_is_the_sigma_of_gaussian_noise():
    assert certify(lenet(), image(), noise=0.25) == certify(lenet(), image(), Gaussian(0.25))
    with pytest.raises(SmoothcertError, match="noise must be a Noise object .* got str"):
        Smoothed(lenet(), "0.25", 10)
    with pytest.raises(SmoothcertError, match="got bool"):
        Smoothed(lenet(), True, 10)


@pytest.mark.parametrize("model", ["checkpoint.pt", lambda x: x, None])
def test_a_model_that_is_not_a_module_is_one_line(model):
    with pytest.raises(SmoothcertError, match=r"model must be a torch nn.Module .*, got "):
        Smoothed(model, 0.25, 10)


def test_an_integer_seed_is_a_generator_on_the_models_device():
    seeded = certify(lenet(), image(), generator=torch.Generator().manual_seed(7))
    assert certify(lenet(), image(), generator=7) == seeded
    assert certify(lenet(), image(), generator=np.int64(7)) == seeded
    smoothed = Smoothed(lenet(), 0.25, 10)
    assert smoothed.predict(image(), 50, 0.01, 64, generator=3) == \
        smoothed.predict(image(), 50, 0.01, 64, generator=torch.Generator().manual_seed(3))
    for bad in (-1, 2**64, 0.5, "0", True):
        with pytest.raises(SmoothcertError, match="generator must be a torch.Generator, an "
                                                  "integer seed"):
            certify(lenet(), image(), generator=bad)


def test_numpy_numbers_are_numbers():
    plain = certify(lenet(), image(), 0.25, 0, n0=10, n=200, alpha=0.01, batch_size=64)
    smoothed = Smoothed(lenet(), np.float32(0.25), np.int64(10))
    cert = smoothed.certify(image(), np.int64(10), np.int64(200), np.float64(0.01),
                            np.int32(64), generator=0)
    assert cert == plain and type(cert.n) is int and type(cert.sigma) is float
    scores = smoothed.soft_scores(image(), np.int64(20), np.int64(8), generator=0)
    assert scores.shape == (10,)
    with pytest.raises(SmoothcertError, match="n must be an integer >= 1, got True"):
        smoothed.certify(image(), 10, True, 0.01, 64)


class Broken(nn.Module):
    """Logits that are NaN (NaN weights) or +inf for inputs whose first pixel exceeds ``at``."""

    def __init__(self, value, at=-np.inf):
        super().__init__()
        self.value, self.at = value, at
        self.register_buffer("w", torch.zeros(64, 3))

    def forward(self, x):
        logits = x.flatten(1) @ self.w
        bad = x.flatten(1)[:, 0] > self.at
        logits[bad, 1] = self.value
        return logits


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_logits_are_refused_not_voted_for_class_0(value):
    # before: argmax of NaN logits is 0, and every input was certified as class 0
    smoothed = Smoothed(Broken(value), 0.25, 3)
    with pytest.raises(SmoothcertError, match=r"the model returned NaN/inf logits for 210 of "
                                              r"210 noisy copies of the input \(NaN weights"):
        smoothed.certify(image(), generator=0, **{**RUN, "n": 200})
    with pytest.raises(SmoothcertError, match="NaN/inf logits for 20 of 20 noisy copies"):
        smoothed.soft_scores(image(), 20, 8, generator=0)


def test_minus_infinity_beside_a_finite_logit_is_a_vote_but_alone_it_is_not():
    """The log of a hard classifier's probabilities has −inf logits: they vote as before."""
    smoothed = Smoothed(Broken(-float("inf")), 0.25, 3)  # logits (0, −inf, 0): class 0
    assert smoothed.predict(image(), 20, 0.01, 8, generator=0).count == 20
    assert smoothed.soft_scores(image(), 20, 8, generator=0).tolist() == [0.5, 0.0, 0.5]

    class Nothing(nn.Module):
        def forward(self, x):
            return torch.full((x.shape[0], 3), -float("inf"))

    with pytest.raises(SmoothcertError, match="NaN/inf logits for 20 of 20"):
        Smoothed(Nothing(), 0.25, 3).predict(image(), 20, 0.01, 8)


def test_a_few_non_finite_rows_among_many_inputs_name_their_input():
    # only noisy copies whose first pixel exceeds 0.9 are NaN: a rare event at x₀ = 0
    smoothed = Smoothed(Broken(float("nan"), at=0.9), 0.25, 3, BatchedVotes(precision="fp32"))
    x = torch.zeros(1, 8, 8)
    programs = [(i, smoothed.votes_program(x, 500, generator=i)) for i in range(3)]
    with pytest.raises(SmoothcertError, match=r"logits for [1-9]\d? of 500 noisy copies of "
                                              r"input 0"):
        list(smoothed.run(programs, batch_size=128))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attacks_and_sigma_optimization_feed_a_half_model_its_dtype(dtype):
    # before: torch's "Input type (float) and bias type (BFloat16) should be the same"
    from smoothcert.smoothing.attacks import noisy_logits
    from smoothcert.smoothing.sigma_optimization import soft_radius

    model, x = lenet(dtype), image().unsqueeze(0)
    noises = torch.randn((3, 1, 1, 8, 8), generator=torch.Generator().manual_seed(0)) * 0.25
    with torch.no_grad():
        logits = noisy_logits(model, x, noises)
        expected = model((x.unsqueeze(0) + noises).flatten(0, 1).to(dtype)).view(3, 1, -1)
    assert logits.dtype == dtype and torch.equal(logits, expected)
    with torch.no_grad():
        radius = soft_radius(model, x, 0.25, num_samples=8,
                             generator=torch.Generator().manual_seed(0))
    assert radius.shape == (1,) and torch.isfinite(radius.float()).all()
