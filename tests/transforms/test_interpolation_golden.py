"""Rotation's resampling, Lipschitz bound and interpolation bound (``transforms/
interpolation.py``) and the ℓ2 radius of sampled transformations (``stats/tss.py``) against
the authors' code (tests/fixtures/tss/sampled.json, made by make_sampled.py from
AI-secure/semantic-randomized-smoothing).

Tolerances. Theirs runs in float32 on float32 images, ours in float64. A rotated pixel is a
bilinear mix of values in [0, 1] at positions computed with sines of float32 angles (error
≲ r·2⁻²³ px for r ≤ 14 px, times a gradient ≤ 1, plus a few float32 roundings of the mix):
2e-6 absolute, measured 1.5e-6. The Lipschitz bounds and slice maxima are float32 sums of at
most 3·28·28 non-negative terms: relative error ≤ n·2⁻²⁴ = 1.4e-4, we allow 1e-4 (measured
below 2e-7 for the bound, 3e-6 for the maxima).

One documented difference. At a slice end where a pixel samples exactly on a pixel of the
input (θ = 0), their float32 atan2/sin/cos land a hair below it, and floor() picks the cell
one lower; ours (exact there) picks the pixel's own cell. Both neighbourhoods hold every cell
the slice visits (the sample moves < 1 px), so both are bounds; they differ by up to 2.5 %. For
those slices the sampled part of the bound (the maximum less L·d/2) is compared instead, and
the bound itself is checked by tests/transforms/test_rotation_soundness.py.
"""

import math
import sys

import pytest
import torch
from sampled_helpers import golden

from smoothcert.errors import SmoothcertError
from smoothcert.stats.tss import sampled_l2_radius
from smoothcert.transforms import build_transformation
from smoothcert.transforms import interpolation as interp

GOLDEN, IMAGES, rows = golden("sampled.json")
RELATIVE = 1e-4


def test_the_fixture_is_the_pinned_commit():
    assert GOLDEN["commit"] == "76361d363ced8f1a3fd36ba1db8eac01d026f007"
    assert len(rows("rotation")) == 44 and len(rows("aliasing")) == 112


@pytest.mark.parametrize("row", rows("rotation"), ids=lambda r: f"{r['image']}@{r['angle']}")
def test_rotation_is_theirs(row):
    img = IMAGES[row["image"]]
    ours = interp.rotate(img, torch.tensor([row["angle"]], dtype=torch.float64))[0]
    theirs = torch.tensor(row["masked"], dtype=torch.float64).reshape(img.shape)
    assert torch.allclose(ours, theirs, rtol=0.0, atol=2e-6)


def on_pixel(angle: float) -> bool:
    return angle % 90.0 == 0.0


@pytest.mark.parametrize("row", [r for r in rows("lipschitz")
                                 if not (on_pixel(r["low"]) or on_pixel(r["high"]))],
                         ids=lambda r: f"{r['image']}@{r['low']}")
def test_lipschitz_bound_is_theirs_away_from_pixel_exact_ends(row):
    ours = interp.rotation_lipschitz(IMAGES[row["image"]],
                                     torch.tensor([row["low"]], dtype=torch.float64),
                                     torch.tensor([row["high"]], dtype=torch.float64))[0]
    assert float(ours) == pytest.approx(row["bound"], rel=RELATIVE)


def our_slices(setting):
    """Ours on their grid: the slices of their loop (those touching [−partial, partial],
    one more on each side than the interval) as a rotation of angle partial + step."""
    slice_, subslice, partial = setting
    step = 360.0 / slice_
    count = round(2.0 * (partial + step) / step)
    t = build_transformation(f"rotation:angle={partial + step!r},slices={count},"
                             f"subslices={subslice}")
    return t, step


@pytest.mark.parametrize("setting", sorted({(r["slice"], r["subslice"], r["partial"])
                                            for r in rows("aliasing")}))
def test_slice_bounds_are_theirs(setting):
    t, step = our_slices(setting)
    checked = 0
    for k, img in enumerate(IMAGES):
        bounds = t.slice_bounds(img)
        lipschitz = t.lipschitz(img, t.edges())
        for row in rows("aliasing"):
            if (row["image"], row["slice"], row["subslice"], row["partial"]) != (k, *setting):
                continue
            base = row["base"] - 360.0 if row["base"] > 180.0 else row["base"]
            j = round((base - t.edges()[0].item()) / step)
            assert t.edges()[j].item() == pytest.approx(base, abs=1e-9)
            half_width = step / setting[1] / 2.0
            if on_pixel(base) or on_pixel(base + step):  # compare the sampled parts
                ours = float(bounds[j] - half_width * lipschitz[j])
                theirs = row["max_l2_squared"] - half_width * row["lipschitz"]
            else:
                ours, theirs = float(bounds[j]), row["max_l2_squared"]
            assert ours == pytest.approx(theirs, rel=RELATIVE, abs=1e-7), (k, j)
            checked += 1
    assert checked == len(IMAGES) * t.slices


@pytest.mark.parametrize("row", [r for r in rows("l2_radius") if r["p"] > 0.5],
                         ids=lambda r: f"{r['p']}-{r['sigma']}-{r['sigma_b']}-{r['b']}")
def test_l2_radius_is_theirs_above_half(row):
    ours = sampled_l2_radius(row["p"], row["sigma"], row["sigma_b"], row["b"])
    theirs = max(row["radius"], 0.0)
    z = -float(torch.special.ndtri(torch.tensor(1.0 - row["p"], dtype=torch.float64)))
    t = row["b"] / row["sigma_b"] if row["sigma_b"] else 0.0
    margin = z * z - t * t
    # theirs: Φ⁻¹ of a p they round; ours lowers the margin by 64 ulps of its terms
    slack = row["sigma"] * 80 * sys.float_info.epsilon * (z * z + t * t + 1.0) \
        / max(math.sqrt(max(margin, 0.0)), 1e-300) + 8 * sys.float_info.epsilon * theirs
    assert ours <= theirs + slack and ours >= theirs - slack


def test_their_radius_with_brightness_is_positive_below_half_and_ours_is_not():
    """Their calc_radius squares Φ⁻¹(p) < 0, so p_lower < ½ gets a positive radius when
    σ_b > 0 and Φ⁻¹(p)² > (b/σ_b)² (and their certify then counts the slice): ours certifies
    nothing there."""
    below = [r for r in rows("l2_radius") if r["p"] < 0.5 and r["sigma_b"] > 0
             and float(torch.special.ndtri(torch.tensor(r["p"], dtype=torch.float64))) ** 2
             > (r["b"] / r["sigma_b"]) ** 2]
    assert len(below) == 3 and all(r["radius"] > 0 for r in below)
    assert all(sampled_l2_radius(r["p"], r["sigma"], r["sigma_b"], r["b"]) == 0.0
               for r in below)


def test_l2_radius_refuses_a_shift_without_brightness_smoothing():
    with pytest.raises(SmoothcertError, match="sigma_b > 0"):
        sampled_l2_radius(0.9, 0.25, 0.0, 0.1)
