"""Soundness of TSS's sampling-based scaling certificate (``transforms/scaling_bound.py``,
``transforms/scaling.py``, ``certifiers/tss_slices.py``), each with an unsound control that
the same check catches.

1. The interpolation bound: on a fine grid of factors inside every slice (uniform in 1/s, with
   the slice's dividing point itself), the squared distance from the slice's anchor for that
   point (the right end above the dividing point, the left end below it, the nearer at it)
   never exceeds M_j; the settings include the knife edges the golden test leaves out (a grid
   end a few ulps below 1, a sub-point on a dividing point). Control: the bound without its
   Lipschitz term is exceeded.
2. End to end, through ``certify_dataset``: a linear classifier v·z + c0, whose
   Gaussian-smoothed classifier is the classifier itself (P(class 1) = Φ((v·z + c0)/(σ‖v‖))),
   so the smoothed prediction at every scaling is a sign, read on a fine grid of factors. The
   centre pixel, which scaling never moves and which v weighs alone in its neighbourhood (v is
   0 within 3.5 px of it, and no factor ≤ 1.1 brings a pixel that far within one pixel of the
   centre), sets where the decision boundary cuts the image's scalings. Every certified factor
   range holds; the control, the same certifier with every M_j set to 0 (certifying the
   samples only), certifies a range in which the prediction flips.
"""

from __future__ import annotations

import pytest
import torch
from sampled_helpers import Linear, blobs, certify, place_boundaries

from smoothcert.transforms import build_transformation
from smoothcert.transforms import interpolation as interp
from smoothcert.transforms import scaling_bound as sb
from smoothcert.transforms.scaling import Scaling

pytestmark = pytest.mark.filterwarnings(
    "ignore::smoothcert.smoothing.smoothed.InputRangeWarning")


def fine_errors(t, x, fine=120):
    """(S,) the largest squared distance, over a fine grid of each slice, from the anchor the
    bound measures that point from."""
    edges = t.edges()
    has, divider = sb.slice_dividers(edges, tuple(x.shape[-2:]))
    out = []
    for j in range(t.slices):
        low, high = edges[j], edges[j + 1]
        inverse = 1.0 / high + (1.0 / low - 1.0 / high) * torch.arange(
            fine + 1, dtype=torch.float64) / fine
        grid = torch.cat([high[None], low[None], 1.0 / inverse, divider[j:j + 1][has[j:j + 1]]])
        images = t.geometric(x, grid).flatten(1)
        right = ((images - images[0]) ** 2).sum(dim=1)
        left = ((images - images[1]) ** 2).sum(dim=1)
        d = divider[j]
        chosen = torch.where(grid > d, right, torch.where(grid < d, left,
                                                          torch.minimum(right, left)))
        out.append(chosen.max())
    return torch.stack(out)


SETTINGS = [  # (channels, height, width, options)
    (1, 9, 9, "low=0.8,high=1.2,slices=10,subslices=9"),  # an end 2⁻⁵¹ below 1
    (1, 12, 12, "low=0.8,high=1.2,slices=10,subslices=9"),  # a sub-point at 9/11
    (1, 28, 28, "low=0.9,high=1.1,slices=10,subslices=4"),
    (3, 10, 13, "low=0.6,high=1.5,slices=30,subslices=2"),
    (1, 28, 28, "low=0.5,high=2,slices=60,subslices=1"),
]


@pytest.mark.parametrize(("channels", "h", "w", "setting"), SETTINGS)
def test_the_interpolation_bound_holds_on_a_fine_grid(channels, h, w, setting):
    t = build_transformation(f"scaling:{setting}")
    g = torch.Generator().manual_seed(h * w)
    images = list(blobs(2, h, channels, seed=h, width=w)) + \
        [torch.rand((channels, h, w), generator=g) for _ in range(2)]
    for x in images:
        assert bool((fine_errors(t, x) <= t.slice_bounds(x)).all())


def test_the_control_without_the_lipschitz_term_is_caught(monkeypatch):
    t = build_transformation("scaling:low=0.9,high=1.1,slices=10,subslices=1")
    g = torch.Generator().manual_seed(28)
    xs = [torch.rand((1, 28, 28), generator=g) for _ in range(2)]
    honest = [fine_errors(t, x) for x in xs]
    assert all(bool((e <= t.slice_bounds(x)).all()) for e, x in zip(honest, xs, strict=True))
    monkeypatch.setattr(sb, "slice_lipschitz",
                        lambda x, low, *_a: (torch.zeros_like(low), torch.zeros_like(low)))
    missed = sum(int((e > t.slice_bounds(x)).sum()) for e, x in zip(honest, xs, strict=True))
    assert missed > 0


SIZE, KAPPA, C0 = 13, 30.0, -15.0
LOW, HIGH = 0.9, 1.1


def linear_setup(count, targets, seed):
    """Images whose centre pixel x_c puts the minimum over factors in [LOW, HIGH] of
    h(s) = v·T(x, s) + c0 at ``targets[k]``, the model, h(image, factors) and the factors."""
    g = torch.Generator().manual_seed(seed)
    far = interp.distances(SIZE, SIZE) > 3.5
    v = torch.randn((SIZE, SIZE), generator=g, dtype=torch.float64) * far
    centre = SIZE // 2
    v[centre, centre] = KAPPA
    xs = blobs(count, SIZE, seed=seed)
    grid = torch.cat([torch.linspace(LOW, HIGH, 6001, dtype=torch.float64),
                      build_transformation("scaling:slices=40").edges()])

    def h(x, scales):
        return (sb.scale(x, scales).flatten(1) @ v.flatten()) + C0

    labels = place_boundaries(xs, h, grid, targets, KAPPA, 1.0)
    return xs, labels, Linear(v, C0), h, grid


def violations(rows, xs, h, grid):
    """Certified rows with a factor in [factor_low, factor_high] where the smoothed prediction
    (the sign of h) is not theirs."""
    bad = []
    for row in rows:
        if row["predict"] == -1:
            continue
        inside = grid[(grid >= row["factor_low"]) & (grid <= row["factor_high"])]
        if bool(((h(xs[row["idx"]], inside) > 0) != bool(row["predict"])).any()):
            bad.append(row["idx"])
    return bad


def test_certified_scalings_keep_the_smoothed_prediction_and_the_control_is_caught(
        monkeypatch):
    targets = [-3.0, -1.0, 1.0, 3.0, 6.0, 9.0, 12.0, 13.0, -0.05, -0.05, -0.05, -0.05]
    xs, labels, model, h, grid = linear_setup(len(targets), targets, seed=7)
    rows = certify(model, xs, labels,
                   f"scaling:sigma=0.25,low={LOW},high={HIGH},slices=40,subslices=40")
    whole = [r for r in rows if (r["factor_low"], r["factor_high"]) == (LOW, HIGH)]
    assert len(whole) >= 2 and all(r["radius"] == pytest.approx(0.1) for r in whole)
    assert violations(rows, xs, h, grid) == []
    coarse = f"scaling:sigma=0.002,low={LOW},high={HIGH},slices=4,subslices=20"
    assert violations(certify(model, xs, labels, coarse), xs, h, grid) == []
    monkeypatch.setattr(Scaling, "slice_bounds",
                        lambda self, x: torch.zeros(self.slices, dtype=torch.float64))
    assert violations(certify(model, xs, labels, coarse), xs, h, grid) != []
