"""The torch-free bounds of ablation smoothing (``stats/ablation.py``): the authors' order of the
top two classes, Δ of a patch, and the ℓ0 radius by bisection against a plain scan."""

import math

import pytest

from smoothcert.stats.ablation import (
    TopTwo,
    l0_certified,
    l0_delta,
    l0_radius,
    patch_certified,
    patch_delta,
    patch_radius,
    top_two,
)


def test_top_two_breaks_ties_towards_the_lower_class():
    assert top_two([3, 7, 7, 1]) == TopTwo(1, 2, 7, 7)
    assert top_two([0, 0, 0]) == TopTwo(0, 1, 0, 0)
    assert top_two([1, 5, 2, 5, 9]) == TopTwo(4, 1, 9, 5)
    with pytest.raises(ValueError):
        top_two([4])


def test_patch_delta_counts_the_positions_a_patch_meets():
    assert [patch_delta("column", m, 4) for m in (1, 2, 5)] == [4, 5, 8]
    assert [patch_delta("block", m, 3) for m in (1, 2)] == [9, 16]
    with pytest.raises(ValueError):
        patch_delta("pixels", 1, 1)


def test_a_gap_of_exactly_two_delta_is_certified_only_for_the_lower_class():
    assert patch_certified(TopTwo(0, 3, 10, 2), 4)  # 8 = 2Δ, 0 < 3
    assert not patch_certified(TopTwo(3, 0, 10, 2), 4)  # 8 = 2Δ, but 3 > 0
    assert patch_certified(TopTwo(3, 0, 11, 2), 4)  # 9 > 2Δ
    # column b = 2: Δ(m) = m + 1; gap 8 certifies m = 3 exactly (8 = 2·4) for the lower class
    assert patch_radius(TopTwo(0, 1, 8, 0), "column", 2, 28) == 3
    assert patch_radius(TopTwo(1, 0, 8, 0), "column", 2, 28) == 2
    assert patch_radius(TopTwo(0, 1, 3, 0), "column", 2, 28) == 0
    assert patch_radius(TopTwo(0, 1, 999, 0), "column", 2, 6) == 6  # capped at the image side


@pytest.mark.parametrize(("d", "k"), [(64, 5), (784, 45), (100, 100), (1024, 1)])
def test_l0_radius_is_the_largest_certified_rho(d, k):
    for p in (0.5, 0.51, 0.6, 0.75, 0.9, 0.99, 0.999999, 1.0):
        scan = [rho for rho in range(d + 1) if l0_certified(p, d, k, rho)]
        assert l0_radius(p, d, k) == (max(scan) if scan else None)
        assert scan == list(range(len(scan)))  # certified radii are 0..radius


def test_l0_delta_in_closed_form():
    assert l0_delta(10, 3, 0) == 0.0
    assert l0_delta(10, 3, 1) == pytest.approx(3 / 10)  # a kept pixel is the changed one
    assert l0_delta(10, 3, 8) == 1.0  # every 3 of 10 pixels meets 8 changed ones
    assert l0_delta(784, 45, 8) == pytest.approx(1 - math.comb(776, 45) / math.comb(784, 45))
    with pytest.raises(ValueError):
        l0_radius(0.9, 10, 11)
