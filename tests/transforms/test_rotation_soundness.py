"""Soundness of TSS's sampling-based rotation certificate (``transforms/interpolation.py``,
``transforms/rotation.py``, ``certifiers/tss_slices.py``), each with an unsound control that
the same check catches.

1. The interpolation bound: on a fine grid of angles inside every slice, the squared distance
   from the slice's sample never exceeds M_j. Control: the maximum over the sub-interval ends
   alone (the bound without its Lipschitz term) is exceeded.
2. End to end, through ``certify_dataset``: a linear classifier v·z + c0 on the masked input,
   whose Gaussian-smoothed classifier is the classifier itself (P(class 1) = Φ((v·m⊙z + c0) /
   (σ‖m⊙v‖)) > ½ exactly when v·m⊙z + c0 > 0), so the smoothed prediction at every rotation
   is a sign, read on a fine grid of angles. Each image's centre pixel, which rotation never
   moves and which v weighs alone in its neighbourhood, sets where the decision boundary cuts
   the image's rotations. Every certified angle range holds; the control, the same certifier
   with every M_j set to 0 (certifying the samples only), certifies a range in which the
   prediction flips.
"""

from __future__ import annotations

import pytest
import torch
from sampled_helpers import Linear, blobs, certify, place_boundaries

from smoothcert.stats import clopper_pearson_lower
from smoothcert.transforms import build_transformation
from smoothcert.transforms import interpolation as interp
from smoothcert.transforms.rotation import Rotation

pytestmark = pytest.mark.filterwarnings(
    "ignore::smoothcert.smoothing.smoothed.InputRangeWarning")


def fine_errors(t, x, fine=150):
    """(S, fine + 1) squared distances from each slice's sample on a fine grid of the slice."""
    edges = t.edges()
    fractions = torch.arange(fine + 1, dtype=torch.float64) / fine
    grid = edges[:-1, None] + (edges[1:] - edges[:-1])[:, None] * fractions
    images = t.geometric(x, grid.reshape(-1)).reshape(t.slices, fine + 1, -1)
    return ((images - images[:, :1]) ** 2).sum(dim=2)


def sampled_only(t, x):
    """The control: the largest squared distance at the sub-interval ends, no Lipschitz term."""
    edges = t.edges()
    fractions = torch.arange(t.subslices + 1, dtype=torch.float64) / t.subslices
    grid = edges[:-1, None] + (edges[1:] - edges[:-1])[:, None] * fractions
    images = t.geometric(x, grid.reshape(-1)).reshape(t.slices, t.subslices + 1, -1)
    return ((images - images[:, :1]) ** 2).sum(dim=2).max(dim=1).values


@pytest.mark.parametrize(("size", "channels", "setting"), [
    (9, 1, "angle=20,slices=8,subslices=2"),
    (12, 3, "angle=6,slices=4,subslices=3"),
    (15, 1, "angle=180,slices=60,subslices=2"),
    (28, 1, "angle=30,slices=15,subslices=1"),
])
def test_the_interpolation_bound_holds_on_a_fine_grid(size, channels, setting):
    t = build_transformation(f"rotation:{setting}")
    g = torch.Generator().manual_seed(size)
    images = list(blobs(2, size, channels, seed=size)) + \
        [torch.rand((channels, size, size), generator=g) for _ in range(2)]
    for x in images:
        worst = fine_errors(t, x).max(dim=1).values
        assert bool((worst <= t.slice_bounds(x)).all())


def test_the_control_without_the_lipschitz_term_is_caught():
    """Within slices where every pixel moves less than a pixel, ‖T(x, θ) − T(x, θ_j)‖² is
    nearly monotone and the ends' maximum is close; on noise images it still misses."""
    t = build_transformation("rotation:angle=30,slices=15,subslices=1")
    g = torch.Generator().manual_seed(28)
    missed = 0
    for _ in range(2):
        x = torch.rand((1, 28, 28), generator=g)
        missed += int((fine_errors(t, x).max(dim=1).values > sampled_only(t, x)).sum())
    assert missed > 0


SIZE, KAPPA, C0 = 13, 30.0, -15.0


def linear_setup(count, targets, seed, reach=20.0):
    """Images whose centre pixel x_c puts min over angles in [−reach, reach] of h(θ) =
    v·T(x, θ) + c0 at ``targets[k]``, the model, h(image, angles) and the angles. v is κ at
    the centre and 0 within 3.5 px of it (a sample there would mix x_c in), Gaussian beyond;
    x_c = (target − min of the rest − c0)/κ, in [0, 1] for the targets used here."""
    g = torch.Generator().manual_seed(seed)
    far = interp.distances(SIZE, SIZE) > 3.5
    v = torch.randn((SIZE, SIZE), generator=g, dtype=torch.float64) * far
    centre = SIZE // 2
    v[centre, centre] = KAPPA
    xs = blobs(count, SIZE, seed=seed)
    angles = torch.linspace(-reach, reach, 8001, dtype=torch.float64)

    def h(x, degrees):
        return (interp.rotate(x, degrees).flatten(1) @ v.flatten()) + C0

    labels = place_boundaries(xs, h, angles, targets, KAPPA, 0.0)
    return xs, labels, Linear(v, C0), h, angles


def violations(rows, xs, h, angles):
    """Certified rows with an angle within their radius where the smoothed prediction (the
    sign of h) is not theirs."""
    bad = []
    for row in rows:
        if row["predict"] == -1:
            continue
        inside = angles[angles.abs() <= row["radius"]]
        signs = h(xs[row["idx"]], inside) > 0
        if bool((signs != bool(row["predict"])).any()):
            bad.append(row["idx"])
    return bad


def test_certified_rotations_keep_the_smoothed_prediction_and_the_control_is_caught(
        monkeypatch):
    targets = [-3.0, -1.0, 1.0, 3.0, 6.0, 9.0, 12.0, 13.0, -0.05, -0.05, -0.05, -0.05]
    xs, labels, model, h, angles = linear_setup(len(targets), targets, seed=7, reach=10.0)
    rows = certify(model, xs, labels, "rotation:sigma=0.25,angle=10,slices=40,subslices=40")
    assert sum(r["radius"] == 10.0 for r in rows) >= 2  # the check is not vacuous
    assert violations(rows, xs, h, angles) == []
    coarse = "rotation:sigma=0.002,angle=10,slices=4,subslices=20"
    assert violations(certify(model, xs, labels, coarse), xs, h, angles) == []
    monkeypatch.setattr(Rotation, "slice_bounds",
                        lambda self, x: torch.zeros(self.slices, dtype=torch.float64))
    assert violations(certify(model, xs, labels, coarse), xs, h, angles) != []


def test_rows_say_the_weakest_slice_and_the_certified_angle():
    xs, labels, model, _h, _a = linear_setup(2, [3.0, 13.0], seed=7, reach=10.0)
    rows = certify(model, xs, labels, "rotation:sigma=0.25,angle=10,slices=40,subslices=40")
    assert [r["predict"] for r in rows] == [-1, 1] and [r["radius"] for r in rows] == [0, 10]
    for row in rows:
        assert row["n"] == 1000 and row["factor_low"] == row["factor_high"] == 1.0
    t = build_transformation("rotation:sigma=0.25,angle=10,slices=40,subslices=40")
    # the weakest sample's bound, at level α/(S + 1): still above that slice's interpolation error
    assert rows[1]["p_lower"] == clopper_pearson_lower(rows[1]["nA"], 1000, 0.001 / 41)
    assert t.radius(rows[1]["p_lower"]) > float(t.slice_bounds(xs[1]).sqrt().min())


def offset_violations(rows, xs, h, angles, offset):
    """Certified rows with an angle within their radius where h moved by ±``offset`` (the
    most a perturbation the certificate claims can move it: h is linear) changes sign."""
    bad = []
    for row in rows:
        if row["predict"] == -1:
            continue
        values = h(xs[row["idx"]], angles[angles.abs() <= row["radius"]])
        for side in (-1.0, 1.0):
            if bool(((values + side * offset > 0) != bool(row["predict"])).any()):
                bad.append(row["idx"])
                break
    return bad


def test_the_brightness_composition_keeps_the_prediction_at_every_angle_and_shift():
    """rotation-brightness (their RotationBrightnessNoiseTransformer): with σ_b > 0 the
    certificate covers every shift |b₁| ≤ b with every angle. The smoothed classifier of the
    linear model is still its sign (the shift adds β·Σ m⊙v, Gaussian), so it is checked exactly
    on angles × the shift's two ends (h moves by b₁·Σ m⊙v). Control: the rows certified for
    the angles alone (b = 0) are caught by shifts they never claimed."""
    targets = [1.0, 6.0, 9.0, 13.0]
    xs, labels, model, h, angles = linear_setup(len(targets), targets, seed=7, reach=10.0)
    total = abs(float((interp.disc_mask(SIZE, SIZE).flatten() * model.v).sum()))
    spec = "rotation:sigma=0.25,angle=10,slices=40,subslices=40,sigma_b=0.1"
    rows = certify(model, xs, labels, spec + ",b=0.05")
    assert any(r["radius"] == 10.0 for r in rows)
    assert offset_violations(rows, xs, h, angles, 0.05 * total) == []
    alone = certify(model, xs, labels, spec)
    assert offset_violations(alone, xs, h, angles, 0.3 * total) != []


def test_an_l2_perturbation_on_top_keeps_the_prediction():
    """``l2`` (their --l2_r): every T(x, θ) + δ, ‖δ‖ ≤ l2, keeps the prediction; the worst δ
    moves h by l2·‖m⊙v‖. Control: rows certified without it are caught by a larger δ."""
    targets = [1.0, 6.0, 9.0, 13.0]
    xs, labels, model, h, angles = linear_setup(len(targets), targets, seed=7, reach=10.0)
    norm = float((interp.disc_mask(SIZE, SIZE).flatten() * model.v).norm())
    spec = "rotation:sigma=0.25,angle=10,slices=40,subslices=40"
    rows = certify(model, xs, labels, spec + ",l2=0.1")
    assert any(r["radius"] == 10.0 for r in rows)
    assert offset_violations(rows, xs, h, angles, 0.1 * norm) == []
    without = certify(model, xs, labels, spec)
    assert offset_violations(without, xs, h, angles, 0.6 * norm) != []
