"""Scaling's resampling, slice grid, dividing points, Lipschitz constants and interpolation
bound (``transforms/scaling.py``, ``scaling_bound.py``) against the authors' code
(tests/fixtures/tss/scaling.json, made by make_scaling.py from
AI-secure/semantic-randomized-smoothing): their ``Resize.proc``, and their
``strict_resize_aliasing_analyze.py`` main loop per slice (right end, dividing point, maximum
squared aliasing, and the Lipschitz constants of its ``get_local_maps``). Theirs with
``--slice`` n, ``--subslice`` m is ours with slices n − 1, subslices m − 1; their slice j is
our slice S − 1 − j.

Tolerances. Theirs runs in float32, ours in float64. A scaled pixel is a bilinear mix of values
in [0, 1] at (i − c)/s + c computed in float32: |(i − c)/s| ≤ 27 px here (s ≥ 0.5, 28 px),
rounded twice (s, the quotient: ≤ 27·2·2⁻²⁴ = 3.2e-6 px) and once more when c is added (half
an ulp of a number < 32: 9.5e-7 px); times a gradient ≤ √2, plus the mix's roundings: 6e-6
absolute (measured 1.3e-6). The Lipschitz constants and slice maxima are float32 sums of at
most 3·28·28 non-negative terms: relative error ≤ n·2⁻²⁴ = 1.4e-4, we allow 1e-4 (measured
below 9e-8 for the constants and 6.2e-6 for the maxima).

Knife edges, not compared (``test_only_the_documented_knife_edges_are_left_out`` pins
which). Where a grid point is a dividing point mathematically, float64 rounding decides on
which side of it a computed point falls, and theirs and ours fall differently. (1) Slice 11,
0.8-1.2: their grid's 1/(k (c + 4)), 1 mathematically, is 1 − 2⁻⁵¹; their ``proc`` returns the
image unblanked for |s − 1| < 10⁻⁶ (ours blanks the border for every s < 1, their box
formula), and their last sub-point of j = 3 lands above 1, so their loop treats the dividing
point 1 as inside the right side and never reaches the slice's left end; ours takes the
one-sided bound across it. Slices j = 3 and 4 measure different images there. (2) The 12×12
image's slice j = 9 of the same setting has a sub-point at its dividing point 9/11. Both are
checked by tests/transforms/test_scaling_soundness.py instead (ours is a bound).
"""


import pytest
import torch
from sampled_helpers import golden

from smoothcert.transforms import build_transformation
from smoothcert.transforms import scaling_bound as sb

GOLDEN, IMAGES, rows = golden("scaling.json")
RELATIVE = 1e-4


SETTINGS = sorted({(r["slice"], r["subslice"], r["sl"], r["sr"]) for r in rows("aliasing")})


def test_the_fixture_is_the_pinned_commit():
    assert GOLDEN["commit"] == "76361d363ced8f1a3fd36ba1db8eac01d026f007"
    assert len(rows("scaling")) == 36 and len(rows("aliasing")) == 208
    assert len(SETTINGS) == 4


@pytest.mark.parametrize("row", rows("scaling"), ids=lambda r: f"{r['image']}@{r['factor']}")
def test_scaling_is_theirs(row):
    img = IMAGES[row["image"]]
    ours = sb.scale(img, torch.tensor([row["factor"]], dtype=torch.float64))[0]
    theirs = torch.tensor(row["scaled"], dtype=torch.float64).reshape(img.shape)
    assert torch.allclose(ours, theirs, rtol=0.0, atol=6e-6)
    if row["factor"] < 1.0:  # the black border where their box says, exactly
        assert torch.equal(ours == 0, theirs == 0) or bool((img == 0).any())


def ours(setting):
    slice_, subslice, sl, sr = setting
    return build_transformation(f"scaling:low={sl!r},high={sr!r},slices={slice_ - 1},"
                                f"subslices={subslice - 1}")


def near_one(value):
    return value != 1.0 and abs(value - 1.0) < 1e-6


def per_slice(setting):
    """(their row, our slice index) for every row of ``setting``, and our per-image values."""
    t = ours(setting)
    edges = t.edges()
    out = []
    for k, img in enumerate(IMAGES):
        has, divider = sb.slice_dividers(edges, img.shape[-2:])
        lip_r, lip_l = sb.slice_lipschitz(img, edges[:-1], edges[1:], has, divider)
        bounds = t.slice_bounds(img)
        for row in rows("aliasing"):
            if (row["image"], row["slice"], row["subslice"], row["sl"], row["sr"]) == (k, *setting):
                m = t.slices - 1 - row["j"]
                points = sb.sub_points(edges[m:m + 1], edges[m + 1:m + 2], t.subslices)
                knife = (near_one(float(edges[m])) or near_one(float(edges[m + 1]))
                         or bool(has[m] and ((points - divider[m]).abs() < 1e-12).any()))
                out.append((row, m, knife, bool(has[m]), float(divider[m]), float(lip_r[m]),
                            float(lip_l[m]), float(bounds[m])))
    return edges, out


@pytest.mark.parametrize("setting", SETTINGS)
def test_grid_and_dividing_points_are_theirs(setting):
    edges, found = per_slice(setting)
    assert len(found) == len(IMAGES) * (setting[0] - 1)
    for row, m, _knife, has, divider, *_ in found:
        if row["j"] == 0:  # their 1/(k c), ours high itself
            assert float(edges[m + 1]) == setting[3] == pytest.approx(row["right"], abs=1e-14)
        else:  # bit for bit: their formula
            assert float(edges[m + 1]) == row["right"]
        assert has == (row["divider"] is not None)
        if has:
            assert divider == row["divider"]


@pytest.mark.parametrize("setting", SETTINGS)
def test_lipschitz_constants_and_slice_bounds_are_theirs(setting):
    _edges, found = per_slice(setting)
    compared = 0
    for row, m, knife, has, _d, lip_r, lip_l, bound in found:
        if knife:
            continue
        assert lip_r == pytest.approx(row["lipschitz_right"], rel=RELATIVE), (row, m)
        if has:
            assert lip_l == pytest.approx(row["lipschitz_left"], rel=RELATIVE), (row, m)
        assert bound == pytest.approx(row["max_l2_squared"], rel=RELATIVE, abs=1e-7), (row, m)
        compared += 1
    assert compared == len(found) - (2 * len(IMAGES) + 1 if setting == SETTINGS[0] else 0)


def test_only_the_documented_knife_edges_are_left_out():
    """Slices j = 3 and 4 of slice 11, 0.8-1.2 (an end at 1 − 2⁻⁵¹) for every image, and the
    12×12 image's slice j = 9 there, whose sub-point 1/(k (c + 3)) is its dividing point 9/11."""
    left_out = {(row["image"], row["j"]) for row, _m, knife, *_ in per_slice(SETTINGS[0])[1]
                if knife}
    assert SETTINGS[0] == (11, 10, 0.8, 1.2)
    assert left_out == {(k, j) for k in range(len(IMAGES)) for j in (3, 4)} | {(1, 9)}
    for setting in SETTINGS[1:]:
        assert not any(knife for _row, _m, knife, *_ in per_slice(setting)[1])
