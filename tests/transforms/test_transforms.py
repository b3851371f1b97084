"""Semantic transformations (``smoothcert.transforms``): names and their one canonical text,
one-line refusals of bad parameters, draws from the generator (reproducible, distributed as
stated, independent of the engine's batch), and brightness and translation against direct
computations (the blur: ``test_blur.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from smoothcert.errors import SmoothcertError
from smoothcert.smoothing.engine import CHUNK, BatchedVotes
from smoothcert.transforms import (
    TRANSFORMS,
    Transformation,
    build_transformation,
    canonical_name,
    canonical_text,
)

EXAMPLES = [cls.example for cls in TRANSFORMS.values()]


def test_the_resolvable_transformations_are_registered():
    assert set(TRANSFORMS) >= {"brightness", "contrast", "blur", "translation"}
    for name, cls in TRANSFORMS.items():
        assert issubclass(cls, Transformation) and cls.name == name
        assert 0 < len(cls.unit) <= 40 and "\t" not in cls.unit and cls.parameters


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_canonical_name_reads_back_to_the_same_settings(example):
    t = build_transformation(example)
    name = canonical_name(t)
    again = build_transformation(name)
    assert canonical_name(again) == name and again.option_values() == t.option_values()
    assert name.startswith(f"{t.name}:") and canonical_text(name) == name
    assert list(t.option_values()) == [item.split("=")[0] for item in
                                       name.partition(":")[2].split(",")]  # declared order


def test_equal_settings_have_one_name_however_written():
    names = {canonical_text(text) for text in (
        "brightness", "brightness:sigma_b=0.2", " brightness:sigma_k=0, sigma_b=0.20 ",
        "brightness:k_high=1,k_low=1.0,sigma_b=2e-1")}
    assert names == {"brightness:sigma_b=0.2,sigma_k=0.0,k_low=1.0,k_high=1.0"}
    assert canonical_text("") == "" and canonical_text("  ") == ""


@pytest.mark.parametrize(("text", "says"), [
    ("brightness:sigma_b=0", "sigma_b must be a positive finite number"),
    ("brightness:sigma_b=-0.1", "sigma_b must be a positive finite number"),
    ("brightness:sigma_k=-1", "sigma_k must be a finite number >= 0"),
    ("brightness:sigma_k=0.1,k_low=1.2", "k_low is the smallest contrast factor certified, in "
                                         "(0, 1]"),
    ("brightness:sigma_k=0.1,k_high=0.9", "k_high is the largest contrast factor"),
    ("brightness:k_low=0.8", "give sigma_k > 0"),
    ("contrast:sigma_k=0", "sigma_k must be a positive finite number"),
    ("contrast:tol=2", "tol is a bisection tolerance in (0, 1)"),
    ("blur:distribution=gamma", "unknown distribution 'gamma'; distribution must be one of "
                                "uniform, exponential, folded-gaussian"),
    ("blur:scale=0", "scale must be a positive finite number"),
    ("blur:scale=inf", "scale must be a positive finite number"),
    ("translation:sigma=-3", "sigma must be a positive finite number"),
    ("translation:sigma=x", "sigma must be a number, got 'x'"),
    ("translation:radius=3", "unknown parameter(s) radius for transformation 'translation'; "
                             "valid: sigma"),
    ("translation:sigma=1,sigma=2", "repeats sigma"),
    ("translation:sigma", "has item 'sigma'"),
    ("rotate:angle=5", "unknown transformation 'rotate'; known: blur, brightness"),
    ("rotation:angle=0", "angle is the half-width of a range of angles in degrees, in (0, 180]"),
    ("rotation:angle=180.5", "in (0, 180], got 180.5"),
    ("rotation:angle=-10", "in (0, 180], got -10.0"),
    ("rotation:train_angle=0", "train_angle is the half-width"),
    ("rotation:slices=0", "slices must be"),
    ("rotation:subslices=0", "subslices must be"),
    ("rotation:sigma=0", "sigma must be a positive finite number"),
    ("rotation:b=0.1", "a brightness shift b > 0 is certified only with brightness smoothing"),
    ("rotation:sigma_b=-1", "sigma_b must be a finite number >= 0"),
    ("", "no transformation given: pass --transform NAME[:KEY=VALUE,...]"),
    (":sigma=1", "no transformation given"),
])
def test_bad_parameters_are_one_line_naming_what_is_wrong(text, says):
    with pytest.raises(SmoothcertError) as err:
        build_transformation(text)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_translation_larger_than_the_image_is_refused():
    t = build_transformation("translation:sigma=9")
    t.check_shape((1, 9, 12))
    with pytest.raises(SmoothcertError, match=r"translation sigma 9 pixels is larger than the "
                                              r"8x12 image; give sigma <= 8"):
        t.check_shape((1, 8, 12))
    with pytest.raises(SmoothcertError, match="is larger than the 8x8 image"):
        t.check_input(torch.zeros(3, 8, 8))
    with pytest.raises(SmoothcertError, match="one floating-point image"):
        t.check_input(torch.zeros(3, 8, 8, dtype=torch.long))


# --------------------------------------------------------------------------- draws
@pytest.mark.parametrize("example", [cls.example for cls in TRANSFORMS.values()
                                     if not cls.sampled])
def test_draws_come_from_the_generator_alone(example):
    t = build_transformation(example)
    first = t.draw(50, torch.Generator().manual_seed(4))
    assert first.shape == (50, len(t.parameters)) and first.dtype == torch.float64
    assert torch.equal(first, t.draw(50, torch.Generator().manual_seed(4)))
    assert not torch.equal(first, t.draw(50, torch.Generator().manual_seed(5)))
    x = torch.rand(1, 6, 6, generator=torch.Generator().manual_seed(0))
    out = torch.empty(50, 1, 6, 6)
    t.perturb_(out, x, torch.Generator().manual_seed(4))
    torch.testing.assert_close(out, t.apply(x, first), rtol=0, atol=0)


N = 40_000  # draws per distribution check: the mean's standard error is σ/200


def test_brightness_draws_are_two_independent_normals_of_the_stated_scales():
    p = build_transformation("brightness:sigma_b=0.3,sigma_k=0.1,k_low=0.9,k_high=1.1").draw(
        N, torch.Generator().manual_seed(0)).numpy()
    k, b = p[:, 0], p[:, 1]
    assert abs(k.std() - 0.1) < 0.003 and abs(b.std() - 0.3) < 0.009
    assert abs(k.mean()) < 0.002 and abs(b.mean()) < 0.006
    assert abs(np.corrcoef(k, b)[0, 1]) < 0.02
    no_contrast = build_transformation("brightness:sigma_b=0.3").draw(
        100, torch.Generator().manual_seed(0))
    assert torch.all(no_contrast[:, 0] == 0)


@pytest.mark.parametrize(("distribution", "law"), [
    ("uniform", stats.uniform(0, 2.0**2)),
    ("exponential", stats.expon(scale=2.0)),
    ("folded-gaussian", stats.halfnorm(scale=2.0)),
])
def test_blur_variances_follow_the_authors_distributions(distribution, law):
    """U[0, s²], Exp(mean s), |N(0, s²)| (``Gaussian``, ``ExpGaussian``, ``FoldGaussian``):
    a Kolmogorov–Smirnov test at a fixed seed (p > 0.01)."""
    t = build_transformation(f"blur:distribution={distribution},scale=2")
    v = t.draw(N, torch.Generator().manual_seed(1))[:, 0].numpy()
    assert v.min() >= 0
    assert stats.kstest(v, law.cdf).pvalue > 0.01


def test_translation_offsets_are_gaussian_of_sigma():
    p = build_transformation("translation:sigma=3").draw(N, torch.Generator().manual_seed(2))
    assert abs(p.std(dim=0) - 3).max() < 0.09 and p.mean(dim=0).abs().max() < 0.06


class Hash25(torch.nn.Module):
    """Votes for class ⌊1000·w·x⌋ mod 4 of a 1×5×5 input, w fixed: any change of a draw moves
    its vote, so equal counts mean equal draws."""

    def __init__(self):
        super().__init__()
        self.w = torch.randn(25, generator=torch.Generator().manual_seed(3))

    def forward(self, x):
        score = (x.flatten(1).double() * self.w.double()).sum(dim=1)  # row by row, float64
        vote = torch.remainder(torch.floor(1000 * score), 4).long()
        return torch.nn.functional.one_hot(vote, 4).float()


@pytest.mark.parametrize("example", ["brightness:sigma_b=0.4,sigma_k=0.3,k_low=0.9",
                                     "blur:distribution=uniform,scale=1.5",
                                     "translation:sigma=2"])
def test_votes_do_not_depend_on_the_engine_batch(example):
    """The engine draws in canonical chunks (``perturb_`` of CHUNK rows at most), so counts are
    equal for batches below, near and above the chunk."""
    t = build_transformation(example)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1, 5, 5, generator=g) * torch.linspace(0, 1, 5)  # not shift-invariant
    n = 2 * CHUNK + 452
    counts = [BatchedVotes().votes(Hash25(), x, t, n, 4, batch, torch.Generator()
                                   .manual_seed(9)) for batch in (7, 100, 3000)]
    assert all(torch.equal(c, counts[0]) for c in counts)
    assert int(counts[0].sum()) == n and int((counts[0] > 0).sum()) == 4


# --------------------------------------------------------------------------- brightness
def test_brightness_and_contrast_apply_e_to_the_k_times_x_plus_b():
    x = torch.rand(2, 4, 5, generator=torch.Generator().manual_seed(3))
    params = torch.tensor([[0.0, 0.0], [0.3, -0.2], [-1.1, 0.45], [2.0, 1.5]],
                          dtype=torch.float64)
    expected = torch.stack([math.exp(k) * (x.double() + b) for k, b in params.tolist()])
    for name in ("brightness", "contrast"):
        out = TRANSFORMS[name]().apply(x, params)
        assert out.dtype == torch.float32 and out.shape == (4, 2, 4, 5)
        torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
        assert torch.equal(out[0], x)  # (k, b) = (0, 0): the image itself
    batch = torch.rand(4, 2, 4, 5, generator=torch.Generator().manual_seed(4))
    rowwise = TRANSFORMS["brightness"]().apply(batch, params)
    for i, (k, b) in enumerate(params.tolist()):
        torch.testing.assert_close(rowwise[i].double(), math.exp(k) * (batch[i].double() + b),
                                   rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- translation
def authors_proc(image: torch.Tensor, dx: float, dy: float) -> torch.Tensor:
    """The authors' ``Translational.proc`` (semantic/transforms.py), copied: round, wrap, and
    four slice assignments."""
    _, h, w = image.shape
    nx, ny = round(dx), round(dy)
    nx, ny = nx % h, ny % w
    out = torch.zeros_like(image)
    if nx > 0 and ny > 0:
        out[:, -nx:, -ny:] = image[:, :nx, :ny]
        out[:, -nx:, :-ny] = image[:, :nx, ny:]
        out[:, :-nx, -ny:] = image[:, nx:, :ny]
        out[:, :-nx, :-ny] = image[:, nx:, ny:]
    elif ny > 0:
        out[:, :, -ny:] = image[:, :, :ny]
        out[:, :, :-ny] = image[:, :, ny:]
    elif nx > 0:
        out[:, -nx:, :] = image[:, :nx, :]
        out[:, :-nx, :] = image[:, nx:, :]
    else:
        out = image
    return out


def test_translation_is_the_authors_cyclic_shift_and_torch_roll():
    t = build_transformation("translation:sigma=4")
    x = torch.rand(3, 7, 9, generator=torch.Generator().manual_seed(5))
    params = torch.cat([t.draw(200, torch.Generator().manual_seed(6)),
                        torch.tensor([[0.5, 1.5], [-0.5, 2.5], [7.0, -9.0], [-13.4, 20.6],
                                      [0.0, 0.0], [3.49, -0.51]], dtype=torch.float64)])
    out = t.apply(x, params)
    for row, (dx, dy) in zip(out, params.tolist()):
        assert torch.equal(row, authors_proc(x, dx, dy))  # Python's round: half to even
        assert torch.equal(row, torch.roll(x, (-round(dx), -round(dy)), dims=(1, 2)))
    batch = torch.rand(6, 3, 7, 9, generator=torch.Generator().manual_seed(7))
    rowwise = t.apply(batch, params[-6:])
    for i, (dx, dy) in enumerate(params[-6:].tolist()):
        assert torch.equal(rowwise[i], authors_proc(batch[i], dx, dy))
