"""The Noise base class and its capabilities: every registered noise declares them, the soft
radius of each noise is its own formula, and data-dependent σ asks for it — a noise registered
without one is refused in training and certification (Python: SmoothcertError; CLI: exit 2 with
one line), where before it was silently optimized with the Gaussian formula, while ``certify``
runs with it and its own radius."""

import functools
import math
import re
import time

import numpy as np
import pytest
import torch
from scipy.stats import norm

import smoothcert
from conftest import Halfspace, write_checkpoint
from smoothcert import SmoothcertError, certify_dataset
from smoothcert.cli.app import main
from smoothcert.noise import (
    NOISES,
    Gaussian,
    Noise,
    Uniform,
    noises_with,
    register_noise,
    with_soft_radius,
)
from smoothcert.noise.base import NORMS, noise_examples
from smoothcert.runs.records import read_records
from smoothcert.smoothing.sigma_optimization import CLAMP, optimize_sigma
from smoothcert.training import TrainConfig, build_sigma_mode


@pytest.fixture
def laplace():
    """The registered ``laplace`` noise (Teng et al. 2020, ``noise/laplace.py``): a noise with
    no soft radius, which data-dependent σ must refuse. (These tests registered a stand-in
    under that name before the real noise existed.)"""
    return NOISES["laplace"]


# --------------------------------------------------------------------------- the base class
@pytest.mark.parametrize("name", noise_examples())
def test_every_noise_declares_its_capabilities(name):
    cls = NOISES[name]
    assert issubclass(cls, Noise) and cls.name == name and cls.norm in NORMS
    assert cls.soft_radius is None or cls.per_sample_sigma  # data-dependent σ needs both
    noise = cls(0.25)
    x = torch.zeros(3, 1, 2, 2)
    assert noise.perturb(x, torch.Generator().manual_seed(0)).shape == x.shape
    dim = 4 if cls.needs_dim else None
    assert noise.radius(0.9, dim) > noise.radius(0.7, dim) > 0
    radii = noise.radii(0.9, 4)  # every norm: direct ones as direct_radius, others converted
    assert set(radii) == set(NORMS) and all(radii[n] > 0 for n in NORMS)
    for lp in cls.certified_norms():
        assert radii[lp] == noise.direct_radius(lp, 0.9, 4)
    if cls.needs_dim:
        with pytest.raises(SmoothcertError, match=rf"noise '{name}' needs the input dimension"):
            noise.radii(0.9, None)
    if not cls.per_sample_sigma:
        with pytest.raises(SmoothcertError, match="needs one σ"):
            cls(torch.tensor([0.25, 0.5]))


@pytest.mark.parametrize("name", noise_examples())
def test_a_huge_sigma_is_drawn_at_or_refused_at_once(name):
    """σ = 1e30 (item 5.1 of step 13): the discrete Gaussian built a table of ~3060σ exact
    thresholds and never returned; now each noise either draws or refuses at once, saying its
    bound."""
    cls, started = NOISES[name], time.perf_counter()
    if cls.max_sigma < 1e30:
        with pytest.raises(SmoothcertError, match=rf"noise '{name}' takes sigma <= "
                                                  rf"{cls.max_sigma:g}, got 1e\+30: \w+"):
            cls(1e30)
    else:
        noise = cls(1e30)
        assert noise.sample(torch.zeros(2, 1, 2, 2), torch.Generator().manual_seed(0)).shape \
            == (2, 1, 2, 2)
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("name", noise_examples())
def test_numpy_scalars_are_numbers_and_bools_are_not(name):
    assert NOISES[name](np.float32(0.25)).sigma == 0.25
    assert NOISES[name](np.int64(1)).sigma == 1.0
    with pytest.raises(SmoothcertError, match="σ must be a number or a tensor, got bool"):
        NOISES[name](True)


# --------------------------------------------------------------------------- checked arguments
BAD_P = [1.5, -0.1, float("nan"), np.array([0.9, 1.2]), [0.9, float("nan")], True, "0.9",
         None, {"p": 0.9}]


@pytest.mark.parametrize("p", BAD_P)
@pytest.mark.parametrize("name", noise_examples())
def test_every_radius_refuses_a_p_outside_the_unit_interval(name, p):
    """Issue 45: ``Exp1(0.25).radius(1.5, dim=64)`` was 597880.5 and ``radius(nan)`` 0.0
    (Laplace, Exp2: nan); every noise's radius, direct radius and radii now refuse a p that
    is not a probability (arrays too), in one line naming the noise."""
    noise, dim = NOISES[name](0.25), 16
    calls = [functools.partial(noise.radius, p, dim), functools.partial(noise.radii, p, dim),
             functools.partial(noise.radius, p=p, dim=dim),
             *(functools.partial(noise.direct_radius, lp, p, dim)
               for lp in noise.certified_norms())]
    for call in calls:
        with pytest.raises(SmoothcertError, match=rf"^noise '{re.escape(name)}': a radius "
                                                  r"takes (a )?probabilit") as error:
            call()
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", noise_examples())
def test_every_radius_takes_any_p_in_the_unit_interval_as_float64(name):
    """A float32, a list, a tensor: the radius of their float64 values; ½ gives radius 0 (at
    most), 1 the largest (inf where the noise's density is positive everywhere)."""
    noise, dim, at = NOISES[name](0.25), 16, np.array([0.6, 0.9])
    assert noise.radius(np.float32(0.75), dim) == noise.radius(float(np.float32(0.75)), dim)
    np.testing.assert_array_equal(noise.radius(at.tolist(), dim), noise.radius(at, dim))
    assert noise.radius(torch.tensor(at), dim).tolist() == noise.radius(at, dim).tolist()
    assert noise.radius(0.5, dim) <= 1e-12 and noise.radius(1, dim) >= noise.radius(0.9, dim)


@pytest.mark.parametrize("name", noise_examples())
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.uint8])
def test_every_draw_refuses_a_tensor_that_is_not_floating_point(name, dtype):
    """Issue 45: ``.sample()`` of an int64 or bool tensor raised torch's own errors (each noise
    another one); every draw method now refuses it in one line, and a generator that is not
    one."""
    noise, g = NOISES[name](0.25), torch.Generator().manual_seed(0)
    bad, good = torch.zeros(2, 1, 2, 2, dtype=dtype), torch.zeros(2, 1, 2, 2)
    said = rf"^noise '{re.escape(name)}' draws on floating-point tensors, got a {dtype}"
    for call in (lambda: noise.sample(bad, g), lambda: noise.sample_(bad, g),
                 lambda: noise.perturb(bad, g), lambda: noise.perturb_(good, bad, g),
                 lambda: noise.perturb_(bad, good, g), lambda: noise.sample(like=bad)):
        with pytest.raises(SmoothcertError, match=said):
            call()
    with pytest.raises(SmoothcertError, match="draws on floating-point tensors, got list"):
        noise.sample([[0.0, 0.0]], g)
    with pytest.raises(SmoothcertError, match="draws from a torch.Generator .or None., got int"):
        noise.sample(good, 0)
    assert noise.sample(good.double(), g).dtype == torch.float64  # floats of any width draw


def test_a_plug_in_noise_gets_the_checks_of_the_base_class():
    """The checks sit in the base class (``Noise.__init_subclass__``): a noise defined
    elsewhere, with its own radius and sampler, gets them without a line of its own."""

    class Halved(Noise):
        norm = "l2"

        def sample(self, like, generator=None):
            return torch.zeros_like(like)

        def sample_(self, out, generator=None):
            return out.zero_()

        def radius(self, p, dim=None):
            return 0.5 * p

    noise = Halved(1.0)
    assert noise.radius(0.9) == 0.45 and noise.radius([0.8])[0] == 0.4
    with pytest.raises(SmoothcertError, match=r"^noise 'Halved': a radius takes probabilities p in "
                                              r"\[0, 1\], got 2.0"):
        noise.radius(2.0)
    with pytest.raises(SmoothcertError, match="noise 'Halved' draws on floating-point"):
        noise.perturb(torch.zeros(1, 2, dtype=torch.int32))


def test_public_names_and_the_capability_lists():
    assert smoothcert.Gaussian is Gaussian and smoothcert.noise.Uniform is Uniform
    assert noises_with("soft_radius") == ("gaussian", "uniform")
    assert set(noises_with("per_sample_sigma")) == {"gaussian", "uniform", "laplace", "pareto"}
    assert NOISES["discrete-gaussian"].soft_radius is None


def test_the_data_dependent_certifier_follows_the_registry(laplace):
    from smoothcert.certifiers import CERTIFIERS

    assert CERTIFIERS["data-dependent"].noises == ("gaussian", "uniform")
    laplace.soft_radius = staticmethod(Uniform.soft_radius)  # one with a soft radius joins
    try:
        assert CERTIFIERS["data-dependent"].noises == ("gaussian", "uniform", "laplace")
    finally:
        del laplace.soft_radius


@pytest.mark.parametrize("body, match", [
    ({}, "must set norm"),
    ({"norm": "l3"}, "must set norm to one of l2, l1, linf"),
    ({"norm": "l1", "per_sample_sigma": False,
      "soft_radius": staticmethod(Uniform.soft_radius)}, "soft radius but no per-sample σ"),
])
def test_register_noise_refuses_an_incomplete_plug_in(body, match):
    cls = type("Broken", (NOISES["laplace"],), body)
    if "norm" not in body:
        cls.norm = None
    with pytest.raises(TypeError, match=match):
        register_noise("broken")(cls)
    with pytest.raises(TypeError, match="must subclass"):
        register_noise("broken")(object)
    assert "broken" not in NOISES


# --------------------------------------------------------------------------- soft radii
@pytest.mark.parametrize("name", noises_with("soft_radius"))
def test_a_soft_radius_is_the_certificate_at_the_complement(name):
    """With ψ_B = 1 − ψ_A (two classes) the surrogate is the noise's own certified radius."""
    cls = NOISES[name]
    sigma = torch.tensor([0.25, 0.5, 1.0], dtype=torch.float64)
    p = torch.tensor([0.55, 0.8, 0.97], dtype=torch.float64)  # inside CLAMP
    soft = cls.soft_radius(sigma, p, 1 - p, CLAMP)
    np.testing.assert_allclose(soft.numpy(), cls(sigma).radius(p.numpy()), rtol=1e-12)


def test_gaussian_soft_radius_is_alfarras_with_its_clamp_and_gradient():
    sigma = torch.tensor([0.25, 0.5, 1.0], dtype=torch.float64, requires_grad=True)
    psi_a = torch.tensor([0.6, 0.9, 0.999], dtype=torch.float64)
    psi_b = torch.tensor([0.3, 0.05, 0.001], dtype=torch.float64)
    r = Gaussian.soft_radius(sigma, psi_a, psi_b, CLAMP)
    a, b = np.clip(psi_a.numpy(), *CLAMP), np.clip(psi_b.numpy(), *CLAMP)
    gap = norm.ppf(a) - norm.ppf(b)
    np.testing.assert_allclose(r.detach().numpy(), sigma.detach().numpy() / 2 * gap, rtol=1e-12)
    (grad,) = torch.autograd.grad(r.sum(), sigma)
    np.testing.assert_allclose(grad.numpy(), gap / 2, rtol=1e-12)


def test_uniform_soft_radius_is_unclamped_and_linear_in_sigma():
    sigma = torch.tensor([0.25, 0.5], dtype=torch.float64, requires_grad=True)
    psi_a = torch.tensor([0.7, 0.999], dtype=torch.float64)  # 0.999: beyond CLAMP, not clamped
    psi_b = torch.tensor([0.2, 0.001], dtype=torch.float64)
    r = Uniform.soft_radius(sigma, psi_a, psi_b, CLAMP)
    (grad,) = torch.autograd.grad(r.sum(), sigma)
    np.testing.assert_allclose(grad.numpy(), math.sqrt(3.0) * np.array([0.5, 0.998]),
                               rtol=1e-12)
    np.testing.assert_allclose(r.detach().numpy(), grad.numpy() * [0.25, 0.5], rtol=1e-12)


def toy():
    """A halfspace at distances 0.25 … 1 of 2-D inputs (B, 1, 1, 2)."""
    x = torch.tensor([[0.25, 0.3], [0.5, 0.3], [1.0, 0.3]]).reshape(-1, 1, 1, 2)
    return Halfspace((10.0, 0.0), input_shape=(1, 1, 2)), x


def test_optimize_sigma_asks_the_noise_for_its_soft_radius():
    """A noise that is Gaussian but for the name gets Gaussian's σ_x, through its own method."""
    calls = []

    class Spy(Gaussian):
        @staticmethod
        def soft_radius(sigma, psi_a, psi_b, clamp):
            calls.append(clamp)
            return Gaussian.soft_radius(sigma, psi_a, psi_b, clamp)

    register_noise("spy")(Spy)
    try:
        model, x = toy()
        run = dict(num_steps=7, step_size=0.01, num_samples=4, clamp=(0.01, 0.99))
        spied = optimize_sigma(model, x, 0.1, noise="spy",
                               generator=torch.Generator().manual_seed(0), **run)
    finally:
        del NOISES["spy"]
    plain = optimize_sigma(model, x, 0.1, noise="gaussian",
                           generator=torch.Generator().manual_seed(0), **run)
    assert torch.equal(spied, plain) and calls == [(0.01, 0.99)] * 7


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("name", ["discrete-gaussian", "laplace"])
def test_optimize_sigma_refuses_a_noise_without_a_soft_radius(name, laplace):
    model, x = toy()
    with pytest.raises(SmoothcertError, match=rf"noise '{name}' has none \(noises with one: "
                                              r"gaussian, uniform\)"):
        optimize_sigma(model, x, 0.1, noise=name, generator=torch.Generator().manual_seed(0))
    with pytest.raises(SmoothcertError, match="unknown noise 'nope'"):
        with_soft_radius("nope", "data-dependent σ")


TRAIN = dict(dataset="digits", arch="digits_cnn", sigma=0.25, epochs=1)


@pytest.mark.parametrize("name", ["discrete-gaussian", "laplace"])
def test_data_dependent_training_refuses_a_noise_without_a_soft_radius(name, laplace):
    match = rf"sigma mode data_dependent needs a noise with a soft certified radius; noise '{name}'"
    with pytest.raises(SmoothcertError, match=match):
        TrainConfig(**TRAIN, noise=name, sigma_mode="data_dependent")
    mode = build_sigma_mode("data_dependent")
    with pytest.raises(SmoothcertError, match=match):  # a trainer built without the config
        mode.start(name, 0.25, 10, torch.device("cpu"))
    assert TrainConfig(**TRAIN, noise=name).noise == name  # a fixed σ trains with it


def test_cli_refuses_data_dependent_training_with_the_new_noise(laplace, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--dataset", "digits", "--arch", "digits_cnn", "--sigma", "0.25",
                 "--epochs", "1", "--noise", "laplace", "--sigma-mode", "data_dependent",
                 "--out", str(out), "--no-progress", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'laplace'" in err and "soft certified radius" in err
    assert not out.exists()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("noise") / "checkpoint.pt")


RUN = ["--n0", "10", "--n", "200", "--batch", "100", "--max", "3", "--no-progress",
       "--device", "cpu"]


def test_cli_certifies_with_the_new_noise_but_refuses_data_dependent(laplace, checkpoint,
                                                                     tmp_path, capsys):
    refused = tmp_path / "dd.tsv"
    assert main(["certify", str(checkpoint), "--certifier", "data-dependent", "--noise",
                 "laplace", *RUN, "--out", str(refused)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'laplace'" in err and "data-dependent" in err
    assert list(tmp_path.iterdir()) == []  # refused before the record file is opened
    out = tmp_path / "laplace.tsv"
    assert main(["certify", str(checkpoint), "--noise", "laplace", *RUN, "--out",
                 str(out)]) == 0
    rec = read_records(out)
    assert len(rec) == 3 and rec.manifest["identity"]["noise"] == "laplace"
    ok = rec["predict"] >= 0
    expected = -rec["sigma"] / math.sqrt(2.0) * np.log(2 * (1 - rec["p_lower"]))
    np.testing.assert_allclose(rec["radius"][ok], expected[ok], rtol=1e-12)


def test_certify_dataset_with_the_new_noise_meets_the_halfspace_oracle(laplace):
    """Laplace smoothing of [x₁ > 0.2] has the exact L1 radius x₁ − 0.2; with n = 20,000 the
    certified radius lies just below it. The data-dependent certifier refuses the noise."""
    model = Halfspace((1.0, 0.0), b=0.2, input_shape=(1, 1, 2))
    xs = torch.tensor([[0.3, 0.5], [0.5, 0.5], [0.7, 0.5]]).reshape(-1, 1, 1, 2)
    data = torch.utils.data.TensorDataset(xs, torch.ones(3, dtype=torch.long))
    run = dict(sigma=0.25, noise="laplace", n0=50, n=20_000, batch=5000, num_classes=2)
    radii = np.array([r["radius"] for r in certify_dataset(model, data, **run)])
    exact = np.array([0.1, 0.3, 0.5])
    assert np.all(radii <= exact) and np.all(exact - radii < 0.1), radii
    with pytest.raises(SmoothcertError, match="'laplace'"):
        certify_dataset(model, data, certifier="data-dependent", **run)
