"""The ℓp noise families' samplers (Yang et al. 2020; Teng et al. 2020): each draws the
distribution whose certificate it claims, from the generator it is given.

Kolmogorov–Smirnov tests against the exact laws (scipy), with fixed generators: each draw set
must have a KS p-value above 10⁻³ (the test is then exact for a sound sampler, and a sampler
off by a few percent in scale fails it at these sizes: see ``test_ks_catches_a_wrong_scale``)."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from smoothcert import SmoothcertError
from smoothcert.noise import NOISES
from smoothcert.noise.draws import standard_gamma
from smoothcert.noise.pareto import SHAPE

LP = ["laplace", "pareto", "exp-inf", "exp1", "exp2"]
KS_LEVEL = 1e-3


def ks(values, cdf) -> float:
    return stats.kstest(np.asarray(values, dtype=np.float64).ravel(), cdf).pvalue


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.5, 392.0, 784.0])
def test_standard_gamma_draws_gamma_and_follows_the_generator(alpha):
    g = torch.Generator().manual_seed(11)
    x = standard_gamma(alpha, 20_000, g, torch.device("cpu"))
    assert x.dtype == torch.float64 and x.shape == (20_000,) and bool((x > 0).all())
    assert ks(x, stats.gamma(alpha).cdf) > KS_LEVEL
    again = standard_gamma(alpha, 20_000, torch.Generator().manual_seed(11), torch.device("cpu"))
    assert torch.equal(x, again)


def test_ks_catches_a_wrong_scale():
    x = standard_gamma(784.0, 20_000, torch.Generator().manual_seed(11), torch.device("cpu"))
    assert ks(x * 1.02, stats.gamma(784.0).cdf) < KS_LEVEL


def draw(name, rows=20_000, dim=16, seed=0, dtype=torch.float64):
    noise = NOISES[name](0.5)
    return noise, noise.sample(torch.zeros(rows, dim, dtype=dtype),
                               torch.Generator().manual_seed(seed))


def test_laplace_coordinates_are_laplace_with_standard_deviation_sigma():
    noise, z = draw("laplace", rows=2_000)
    assert ks(z, stats.laplace(scale=0.5 / math.sqrt(2)).cdf) > KS_LEVEL
    assert abs(float(z.std()) - 0.5) < 0.01


def test_pareto_coordinates_follow_the_power_law():
    noise, z = draw("pareto", rows=2_000)
    lam = noise.scale()

    def cdf(x):
        return 0.5 + 0.5 * np.sign(x) * (1.0 - (1.0 + np.abs(x) / lam) ** -SHAPE)

    assert lam == pytest.approx(0.5) and ks(z, cdf) > KS_LEVEL


@pytest.mark.parametrize("name, norm, law", [
    ("exp-inf", math.inf, lambda d: stats.gamma(d)),
    ("exp2", 2, lambda d: stats.gamma(d)),
    ("exp1", 1, lambda d: stats.gamma(d / 2)),  # (‖z‖₁/λ)² ~ Gamma(d/k), k = 2
])
def test_radial_noises_draw_gamma_radii_and_uniform_directions(name, norm, law):
    noise, z = draw(name, rows=10_000)
    dim, lam = 16, noise.scale(16)
    r = torch.linalg.vector_norm(z, ord=norm, dim=1) / lam
    assert ks(r ** (2 if name == "exp1" else 1), law(dim).cdf) > KS_LEVEL
    u = z / torch.linalg.vector_norm(z, ord=norm, dim=1, keepdim=True)
    first = {  # the law of one coordinate of a uniform direction on the unit sphere
        "exp-inf": (u[:, 0], stats.uniform(-1, 2).cdf),  # mixed with an atom at ±1: see below
        "exp2": (u[:, 0] ** 2, stats.beta(0.5, (dim - 1) / 2).cdf),
        "exp1": (u[:, 0].abs(), stats.beta(1, dim - 1).cdf),
    }[name]
    if name == "exp-inf":  # exactly one coordinate per row on a face, the others U[−1, 1)
        on_face = u.abs() == 1.0
        assert bool((on_face.sum(1) == 1).all())
        faces = np.bincount(on_face.double().argmax(1).numpy(), minlength=dim)
        assert stats.chisquare(faces).pvalue > KS_LEVEL
        first = (u[~on_face], first[1])
    assert ks(*first) > KS_LEVEL
    assert abs(float(z.std()) - 0.5) < 0.02  # σ is each coordinate's standard deviation


@pytest.mark.parametrize("name", LP)
def test_sample_and_sample_in_place_draw_the_same_on_any_layout(name):
    noise = NOISES[name](0.25)
    like = torch.zeros(3, 2, 4, 4)
    a = noise.sample(like, torch.Generator().manual_seed(5))
    b = noise.sample_(torch.empty_like(like), torch.Generator().manual_seed(5))
    assert a.dtype == torch.float32 and torch.equal(a, b)
    # a channels-last buffer (the engine's layout for some models) is filled in its own
    # memory order: other values, the same law (each row's norms: see the radial test)
    last = torch.empty_like(like).to(memory_format=torch.channels_last)
    c = noise.sample_(last, torch.Generator().manual_seed(5))
    assert c is last and c.is_contiguous(memory_format=torch.channels_last)
    assert bool(torch.isfinite(c).all()) and not torch.equal(c, torch.zeros_like(c))
    if name == "exp-inf":  # one coordinate per row on the cube's face
        ratio = c.abs().flatten(1) / c.abs().flatten(1).amax(1, keepdim=True)
        assert bool(((ratio == 1.0).sum(1) == 1).all())
    out = torch.empty_like(like)
    assert noise.perturb_(out, like + 0.5, torch.Generator().manual_seed(5)) is out
    torch.testing.assert_close(out, a + 0.5)


@pytest.mark.parametrize("name", ["laplace", "pareto"])
def test_per_sample_sigma_scales_each_row(name):
    sigma = torch.tensor([0.1, 1.0])
    noise = NOISES[name](sigma)
    z = noise.sample(torch.zeros(2, 40_000, dtype=torch.float64),
                     torch.Generator().manual_seed(1))
    one = NOISES[name](1.0).sample(torch.zeros(2, 40_000, dtype=torch.float64),
                                   torch.Generator().manual_seed(1))
    torch.testing.assert_close(z, one * sigma.double()[:, None])
    np.testing.assert_allclose(noise.radius(np.array([0.8, 0.8])),
                               [NOISES[name](0.1).radius(0.8), NOISES[name](1.0).radius(0.8)],
                               rtol=1e-7)


@pytest.mark.parametrize("name", ["exp-inf", "exp1", "exp2"])
def test_dimension_dependent_noises_take_one_sigma_and_need_d(name):
    with pytest.raises(SmoothcertError, match="needs one σ"):
        NOISES[name](torch.tensor([0.25, 0.5]))
    with pytest.raises(SmoothcertError, match=rf"noise '{name}' needs the input dimension"):
        NOISES[name](0.25).radius(0.9)


def test_exp2_refuses_one_dimensional_inputs():
    with pytest.raises(SmoothcertError, match=r"'exp2' needs the input dimension d = C\*H\*W "
                                              r">= 2 for its radius, got 1"):
        NOISES["exp2"](0.25).sample(torch.zeros(3, 1), torch.Generator().manual_seed(0))
