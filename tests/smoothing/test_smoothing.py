import math

import numpy as np
import pytest
import torch
from scipy.stats import binom, norm

from conftest import Halfspace
from smoothcert import Gaussian, SmoothcertError, Smoothed, clopper_pearson_lower
from smoothcert.smoothing.engine import BatchedVotes

# The oracles' points lie off [0, 1] on purpose (their radii are exact on all of R^d): the
# warning that says so to a user (smoothed.InputRangeWarning) is expected here.
pytestmark = pytest.mark.filterwarnings(
    "ignore::smoothcert.smoothing.smoothed.InputRangeWarning")


def point(d):
    """A 2-D input at signed distance d from the hyperplane x₀ = 0 (shape (1, 1, 2))."""
    return torch.tensor([d, 0.3]).reshape(1, 1, 2)


def smoothed(sigma=0.5, w=(1.0, 0.0)):
    return Smoothed(Halfspace(w, input_shape=(1, 1, 2)), Gaussian(sigma), num_classes=2)


def test_linear_oracle_radius_approaches_distance_from_below():
    sigma, d = 0.5, 0.3
    g = torch.Generator().manual_seed(0)
    cert = smoothed(sigma).certify(point(d), n0=100, n=200_000, alpha=0.001, batch_size=10_000,
                                   generator=g)
    assert cert.prediction == 1 and not cert.abstained
    assert cert.p_lower <= norm.cdf(d / sigma)
    assert d - 0.02 < cert.radius <= d  # the certified radius never exceeds the true one here
    assert cert.radius == pytest.approx(sigma * norm.ppf(cert.p_lower), rel=1e-12)
    assert cert.p_lower == clopper_pearson_lower(cert.count, cert.n, 0.001)


def test_radius_scales_with_a_rotated_weight_vector():
    # Only the distance to the boundary matters: w = (3, 4) puts x=(0.6, 0.8)·t at distance t.
    g = torch.Generator().manual_seed(1)
    x = torch.tensor([0.6, 0.8]).reshape(1, 1, 2) * 0.4
    cert = smoothed(1.0, w=(3.0, 4.0)).certify(x, 100, 100_000, 0.001, 10_000, g)
    assert 0.37 < cert.radius <= 0.4


def test_certify_guarantee_rate_of_overclaimed_radii_is_at_most_alpha():
    """Over 2,000 seeded trials, P(radius > true radius) stays ≤ α.

    The radius exceeds the truth exactly when the CP bound exceeds p_A, so the exact failure
    probability is Σ_k P(Bin(n, p_A) = k)·[CP(k) > p_A]; the empirical rate must match it within
    4 standard errors, and it is ≤ α by the guarantee. (α = 0.1 so that failures are observable.)
    """
    sigma, d, n, alpha, trials = 1.0, 0.5, 50, 0.1, 2000
    p_a = norm.cdf(d / sigma)
    model = smoothed(sigma)
    over = 0
    for t in range(trials):
        g = torch.Generator().manual_seed(10_000 + t)
        cert = model.certify(point(d), n0=10, n=n, alpha=alpha, batch_size=64, generator=g)
        over += (not cert.abstained) and (cert.prediction != 1 or cert.radius > d)
    ks = np.arange(n + 1)
    exact = binom.pmf(ks, n, p_a)[clopper_pearson_lower(ks, n, alpha) > p_a].sum()
    assert exact <= alpha
    rate, se = over / trials, math.sqrt(exact * (1 - exact) / trials)
    assert abs(rate - exact) <= 4 * se + 1e-3
    assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / trials)


def test_certify_abstains_when_p_lower_below_half():
    g = torch.Generator().manual_seed(3)
    cert = smoothed(1.0).certify(point(0.01), 100, 1000, 0.001, 256, g)
    assert cert.abstained and cert.prediction is None and cert.radius == 0.0
    assert cert.p_lower < 0.5


@pytest.mark.parametrize("seed", range(10))
def test_predict_abstains_on_a_fifty_fifty_classifier(seed):
    g = torch.Generator().manual_seed(seed)
    pred = smoothed(0.5).predict(point(0.0), n=2000, alpha=0.001, batch_size=500, generator=g)
    assert pred.abstained and pred.prediction is None
    assert pred.count + pred.runner_up_count == 2000


def test_predict_returns_clear_class():
    g = torch.Generator().manual_seed(0)
    pred = smoothed(0.25).predict(point(-0.5), n=500, alpha=0.001, batch_size=128, generator=g)
    assert pred.prediction == 0 and not pred.abstained and pred.pvalue < 1e-10


@pytest.mark.parametrize("num,batch", [(1, 7), (7, 7), (1001, 100), (99, 1000)])
def test_engine_counts_exactly_num_draws_for_any_n(num, batch):
    counts = BatchedVotes().votes(Halfspace((1.0, 0.0)), point(0.1), Gaussian(0.5), num, 2,
                                  batch, torch.Generator().manual_seed(0))
    assert counts.dtype == torch.long and int(counts.sum()) == num


def test_same_generator_seed_gives_same_certificate_and_model_mode_is_restored():
    model = smoothed(0.5)
    model.model.train()
    a = model.certify(point(0.2), 50, 500, 0.01, 64, torch.Generator().manual_seed(5))
    b = model.certify(point(0.2), 50, 500, 0.01, 64, torch.Generator().manual_seed(5))
    assert a == b and model.model.training


def test_gaussian_per_sample_sigma_broadcasts_and_radius_is_vectorised():
    noise = Gaussian(torch.tensor([0.1, 1.0]))
    eps = noise.sample(torch.zeros(2, 1, 50, 50), torch.Generator().manual_seed(0))
    stds = eps.flatten(1).std(dim=1)
    assert stds[0] == pytest.approx(0.1, rel=0.05) and stds[1] == pytest.approx(1.0, rel=0.05)
    assert noise.radius([0.8, 0.8]) == pytest.approx([0.1 * norm.ppf(0.8), norm.ppf(0.8)])
    with pytest.raises(SmoothcertError):
        noise.sample(torch.zeros(3, 1, 2, 2))


@pytest.mark.parametrize("sigma", [0.0, -1.0, float("nan"), float("inf"), "0.5"])
def test_bad_sigma(sigma):
    with pytest.raises(SmoothcertError, match="σ"):
        Gaussian(sigma)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"alpha": 0.0}, "alpha"), ({"alpha": 1.0}, "alpha"), ({"n0": 0}, "n0"),
        ({"n": 0}, "n must"), ({"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_certify_arguments(kwargs, match):
    args = {"n0": 10, "n": 10, "alpha": 0.01, "batch_size": 10, **kwargs}
    with pytest.raises(SmoothcertError, match=match):
        smoothed().certify(point(0.1), **args)


def test_bad_inputs():
    s = smoothed()
    with pytest.raises(SmoothcertError, match="NaN"):
        s.certify(torch.tensor([float("nan"), 0.0]).reshape(1, 1, 2), 10, 10, 0.01, 10)
    with pytest.raises(SmoothcertError, match="shape"):
        s.certify(torch.zeros(3, 1, 2), 10, 10, 0.01, 10)
    with pytest.raises(SmoothcertError, match="shape"):
        s.predict(torch.zeros(1, 2), 10, 0.01, 10)
    with pytest.raises(SmoothcertError, match="num_classes mismatch"):
        Smoothed(Halfspace((1.0, 0.0)), Gaussian(0.5), num_classes=10).certify(
            point(0.1), 10, 10, 0.01, 10)
