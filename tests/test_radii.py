"""The radius grammar's limits (Step 13, item 5.9): radii beyond any distance between two
inputs, grids whose step is far below their span, and −0. (The grammar itself:
tests/evaluation/test_metrics.py.)"""

import re
import warnings

import pytest

from smoothcert.errors import SmoothcertError
from smoothcert.radii import MAX_RADII, MAX_RADIUS, parse_radii
from smoothcert.stats.sequential_levels import grid


@pytest.mark.parametrize("text, message", [
    ("1e308", "1e308 is above 1e+12"),  # was accepted, then overflowed r/σ (RuntimeWarning)
    ("0,1e13", "1e13 is above 1e+12"),
    ("0:1e300:1e299", "1e300 is above"),
    ("0:1e308:1e-308", "above"),
    ("0:1:1e-320", f"more than {MAX_RADII} radii"),  # (stop-start)/step = inf: OverflowError
    ("0:1:5e-324", f"more than {MAX_RADII} radii"),
    (f"0:{MAX_RADII}:1", f"more than {MAX_RADII} radii"),  # MAX_RADII + 1 points
])
def test_refused_in_one_line(text, message):
    with pytest.raises(SmoothcertError, match=re.escape(message)) as info:
        parse_radii(text)
    assert "\n" not in str(info.value)


def test_the_limits_themselves_are_accepted():
    assert parse_radii(f"0,{MAX_RADIUS:g}") == (0.0, MAX_RADIUS)
    radii = parse_radii(f"0:{MAX_RADII - 1}:1")
    assert len(radii) == MAX_RADII and radii[-1] == MAX_RADII - 1


def test_the_largest_radius_keeps_the_sequential_grid_free_of_overflow():
    # r/σ stays finite for any σ the grammar's comment names (σ > 1e-296), so Φ(r/σ) = 1.0 with
    # no RuntimeWarning: a grid point beyond reach, as grid()'s docstring says
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        radii, thresholds = grid(parse_radii(f"0,{MAX_RADIUS:g}"), 1e-290)
    assert list(thresholds) == [0.5, 1.0]


def test_negative_zero_reads_as_zero():
    (zero,) = parse_radii("-0")
    assert zero == 0.0 and str(zero) == "0.0"  # not "-0.0" in a table header
    assert parse_radii("-0:0.5:0.25") == (0.0, 0.25, 0.5)
