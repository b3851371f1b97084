"""The ``scaling`` transformation (``transforms/scaling.py``, ``scaling_bound.py``): closed forms
of the resampling (factor 1 is the image, a linear image is reproduced inside the box, the
black border of a zoom-out is the authors' box, a zoom of a constant image is constant), the
smoothing's and training's draws from the generator alone, the slice grid, the certified set,
and refusals (one line each)."""

import math

import numpy as np
import pytest
import torch

from smoothcert.errors import SmoothcertError
from smoothcert.transforms import build_transformation
from smoothcert.transforms import scaling_bound as sb

EXAMPLE = "scaling:sigma=0.3,low=0.8,high=1.25,train_low=0.7,train_high=1.4,slices=8,subslices=4"


def image(c=1, h=9, w=9, seed=0):
    return torch.rand((c, h, w), generator=torch.Generator().manual_seed(seed))


def factors(*values):
    return torch.tensor(values, dtype=torch.float64)


@pytest.mark.parametrize("size", [(1, 9, 9), (3, 8, 11)])
def test_factor_one_is_the_image(size):
    x = image(*size)
    assert torch.equal(sb.scale(x, factors(1.0))[0], x.double())


@pytest.mark.parametrize("s", [0.83, 1.0, 1.3, 2.0])
def test_a_linear_image_is_reproduced_inside_the_box(s):
    """Bilinear interpolation is exact on an image linear in (i, j): inside the box T(x, s) at
    (i, j) is the linear function at ((i − cy)/s + cy, (j − cx)/s + cx); outside it is 0."""
    h, w = 11, 14
    i = torch.arange(h, dtype=torch.float64)[:, None]
    j = torch.arange(w, dtype=torch.float64)[None, :]
    x = (0.02 * i + 0.05 * j + 0.1)[None]
    out = sb.scale(x, factors(s))[0, 0]
    cy, cx = (h - 1) / 2, (w - 1) / 2
    rows, cols = (i - cy) / s + cy, (j - cx) / s + cx
    inside = (rows >= 0) & (rows <= h - 1) & (cols >= 0) & (cols <= w - 1)
    torch.testing.assert_close(out, (0.02 * rows + 0.05 * cols + 0.1) * inside, rtol=0,
                               atol=1e-14)


@pytest.mark.parametrize(("h", "w", "s"), [(9, 9, 0.7), (9, 12, 0.55), (28, 28, 0.93),
                                           (10, 7, 0.999)])
def test_a_zoom_out_blanks_the_border_the_authors_box_says(h, w, s):
    """Their box rows ceil((1 − s) cy) .. floor((1 − s) cy + s (h − 1)), columns the same with
    w (theirs writes h there: the same on square images)."""
    x = image(1, h, w) + 0.1  # no zero pixel
    out = sb.scale(x, factors(s))[0, 0]
    cy, cx = (h - 1) / 2, (w - 1) / 2
    box = torch.zeros(h, w, dtype=torch.bool)
    box[max(math.ceil((1 - s) * cy), 0):min(math.floor((1 - s) * cy + s * (h - 1)), h - 1) + 1,
        max(math.ceil((1 - s) * cx), 0):min(math.floor((1 - s) * cx + s * (w - 1)), w - 1) + 1
        ] = True
    assert torch.equal(out != 0, box) and not bool(box.all())


def test_a_zoom_in_of_a_constant_image_is_constant():
    x = torch.full((2, 9, 10), 0.7)
    out = sb.scale(x, factors(2.0, 1.1))
    value = float(x[0, 0, 0])  # 0.7 in float32
    torch.testing.assert_close(out, torch.full((2, 2, 9, 10), value, dtype=torch.float64),
                               rtol=0, atol=1e-15)


def test_the_grid_is_uniform_in_one_over_the_factor_with_exact_ends():
    t = build_transformation(EXAMPLE)
    edges = t.edges()
    assert len(edges) == 9 and edges[0] == 0.8 and edges[-1] == 1.25
    assert bool((edges[1:] > edges[:-1]).all())
    steps = 1.0 / edges[:-1] - 1.0 / edges[1:]
    torch.testing.assert_close(steps, torch.full((8,), (1 / 0.8 - 1 / 1.25) / 8,
                                                 dtype=torch.float64), rtol=1e-14, atol=0)
    # their s_j = 1/(k (c + j)), j = 0..S from the right end, is the same grid
    k, c = (1 / 0.8 - 1 / 1.25) / 8, 8 / (1.25 / 0.8 - 1)
    theirs = [1.0 / (k * (c + j)) for j in range(8, 0, -1)]
    assert edges[1:-1].tolist() == theirs[1:]
    order, inner = t.slice_order()
    assert inner[order[0]] == 0.0 and edges[order[0]] <= 1.0 <= edges[order[0] + 1]


def test_the_certified_set_is_the_factors_nearest_one():
    t = build_transformation(EXAMPLE)
    assert t.certified_set(math.inf) == pytest.approx((0.2, 0.8, 1.25))
    assert t.certified_set(0.1) == pytest.approx((0.1, 0.9, 1.1))
    assert t.certified_set(0.0) == (0.0, 1.0, 1.0)
    one_sided = build_transformation("scaling:low=1,high=1.2,slices=8")
    assert one_sided.certified_set(math.inf) == pytest.approx((0.2, 1.0, 1.2))


def test_the_smoothing_draws_noise_from_the_generator_without_a_mask():
    t = build_transformation("scaling:sigma=0.3,sigma_b=0.2")
    x = image()
    out = torch.empty(20, 1, 9, 9)
    t.perturb_(out, x, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    eps = torch.randn((20, 1, 9, 9), generator=g) * 0.3
    beta = torch.randn(20, generator=g) * 0.2
    torch.testing.assert_close(out, x + eps + beta.reshape(-1, 1, 1, 1))


def test_training_scales_by_uniform_factors_then_adds_the_noise():
    t = build_transformation(EXAMPLE)
    batch = torch.stack([image(seed=k) for k in range(6)])
    out = t.transform(batch, torch.Generator().manual_seed(8))
    g = torch.Generator().manual_seed(8)
    drawn = 0.7 + 0.7 * torch.rand((6, 1), generator=g, dtype=torch.float64)
    eps = torch.randn((6, 1, 9, 9), generator=g) * 0.3
    torch.testing.assert_close(out, sb.scale(batch, drawn[:, 0]).float() + eps)
    many = t.draw(20_000, torch.Generator().manual_seed(1))
    assert many.min() >= 0.7 and many.max() <= 1.4 and abs(float(many.mean()) - 1.05) < 0.01


def test_the_left_end_is_an_anchor_where_a_slice_holds_a_dividing_point():
    t = build_transformation("scaling:low=0.7,high=1.1,slices=20")
    need = t.anchors((1, 9, 9))
    assert need[:, 1].all()
    holding = [j for j in range(20) if bool(((sb.dividing_points(9, 9) >= t.edges()[j])
                                            & (sb.dividing_points(9, 9) <= t.edges()[j + 1])
                                            ).any())]
    assert need[:, 0].nonzero()[0].tolist() == holding and len(holding) == 2  # 1 and 0.75


@pytest.mark.parametrize(("text", "message"), [
    ("scaling:low=0", "low is a scale factor, a finite number > 0"),
    ("scaling:low=-1", "low is a scale factor, a finite number > 0"),
    ("scaling:low=1.2", "low <= 1 <= high, got [1.2, 1.1]"),
    ("scaling:high=0.95", "low <= 1 <= high, got [0.9, 0.95]"),
    ("scaling:low=1,high=1", "low < high"),
    ("scaling:train_high=0.99", "train_low <= 1 <= train_high"),
    ("scaling:high=inf", "high is a scale factor, a finite number > 0"),
    ("scaling:b=0.1", "give sigma_b > 0"),
])
def test_bad_parameters_are_one_line(text, message):
    with pytest.raises(SmoothcertError, match=None) as caught:
        build_transformation(text)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_slices_too_wide_or_holding_two_dividing_points_are_refused():
    wide = build_transformation("scaling:low=0.9,high=1.1,slices=2")
    with pytest.raises(SmoothcertError, match=r"too wide for a 28x28 image.*at least 3 slices"):
        wide.check_shape((1, 28, 28))
    wide.check_shape((1, 9, 9))
    two = build_transformation("scaling:low=0.7,high=1,slices=2")  # 0.75 (rows), 0.778 (cols)
    with pytest.raises(SmoothcertError, match=r"holds several factors .* \(0\.75, 0\.777778\)"):
        two.check_shape((1, 9, 10))
    with pytest.raises(SmoothcertError, match="give more slices"):
        two.slice_bounds(image(1, 9, 10))
    build_transformation("scaling:low=0.7,high=1,slices=20").check_shape((1, 9, 10))
    with pytest.raises(SmoothcertError, match="pixel values >= 0"):
        build_transformation("scaling:slices=20").slice_bounds(image() - 0.5)


def test_the_records_radius_is_the_nominal_half_width_where_floats_allow():
    """[0.9, 1.1] is radius 0.1 (not 1 − 0.9 = 0.09999999999999998, which ``report`` would
    count out at r = 0.1), and no float factor within the radius leaves the certified range."""
    from fractions import Fraction

    from smoothcert.transforms.scaling import float_radius

    assert float_radius(0.9, 1.1) == 0.1 and float_radius(0.8, 1.25) == 0.2
    assert build_transformation("scaling:low=0.9,high=1.1").certified_set(math.inf)[0] == 0.1
    rng = np.random.default_rng(0)
    for lo, hi in zip(rng.uniform(0.5, 1.0, 300), rng.uniform(1.0, 2.0, 300)):
        lo, hi = float(f"{lo:.3g}"), float(f"{hi:.3g}")
        r = Fraction(float_radius(lo, hi))
        first = float(1 - r)
        first = first if Fraction(first) >= 1 - r else math.nextafter(first, 2.0)
        last = float(1 + r)
        last = last if Fraction(last) <= 1 + r else math.nextafter(last, 0.0)
        assert lo <= first and last <= hi, (lo, hi, float(r))
        assert r >= min(Fraction(1) - Fraction(lo), Fraction(hi) - 1) - Fraction(1, 2**60)
