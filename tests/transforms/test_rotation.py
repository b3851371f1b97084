"""The ``rotation`` transformation (``transforms/rotation.py``, ``sampled.py``,
``interpolation.py``): closed forms of the resampling (quarter turns are permutations, the
identity is the masked image, a translation-free bilinear mix), the smoothing's and training's
draws from the generator alone, the slice grid, and refusals."""

import math

import pytest
import torch

from smoothcert.errors import SmoothcertError
from smoothcert.transforms import build_transformation
from smoothcert.transforms import interpolation as interp
from smoothcert.transforms.sampled import SampleSweep

EXAMPLE = "rotation:sigma=0.3,angle=10,train_angle=15,slices=8,subslices=4"


def image(c=1, h=9, w=9, seed=0):
    return torch.rand((c, h, w), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("size", [(1, 9, 9), (3, 8, 8)])
def test_quarter_turns_are_the_masked_permutations(size):
    x = image(*size)
    mask = interp.disc_mask(*size[1:])
    for quarter in (1, 2, 3, -1):
        ours = interp.rotate(x, torch.tensor([90.0 * quarter], dtype=torch.float64))[0]
        turned = torch.rot90(x.double(), quarter, dims=(1, 2)) * mask
        # cos 90° is 6e-17, not 0: a sample lands that far off its pixel
        torch.testing.assert_close(ours, turned, rtol=0, atol=1e-12)


def test_angle_zero_is_the_masked_image_and_the_mask_is_the_inscribed_disc():
    x = image(h=7, w=7)
    out = interp.rotate(x, torch.zeros(1, dtype=torch.float64))[0]
    assert torch.equal(out, x.double() * interp.disc_mask(7, 7))
    mask = interp.disc_mask(7, 7)
    assert mask[3].tolist() == [1.0] * 7 and mask[0].tolist() == [0, 0, 0, 1, 0, 0, 0]
    assert mask.sum() == 29  # the pixels within 3 of the centre


def test_a_pixel_samples_on_its_circle_bilinearly():
    """An image linear in (i, j) is reproduced exactly by bilinear interpolation: the rotated
    image at (i, j) is the linear function at the sample point."""
    h = w = 11
    i = torch.arange(h, dtype=torch.float64)[:, None]
    j = torch.arange(w, dtype=torch.float64)[None, :]
    x = (0.02 * i + 0.05 * j + 0.1)[None]
    theta = 23.0
    out = interp.rotate(x, torch.tensor([theta], dtype=torch.float64))[0, 0]
    t = math.radians(theta)
    rows = 5 + (i - 5) * math.cos(t) + (j - 5) * math.sin(t)
    cols = 5 + (j - 5) * math.cos(t) - (i - 5) * math.sin(t)
    want = (0.02 * rows + 0.05 * cols + 0.1) * interp.disc_mask(h, w)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-14)


def test_the_slices_cut_the_certified_range_evenly():
    t = build_transformation(EXAMPLE)
    edges = t.edges()
    assert edges[0] == -10.0 and edges[-1] == 10.0 and len(edges) == 9
    torch.testing.assert_close(edges[1:] - edges[:-1], torch.full((8,), 2.5,
                                                                  dtype=torch.float64))
    order, inner = t.slice_order()
    assert sorted(order[:2].tolist()) == [3, 4] and inner[order[0]] == inner[order[1]] == 0.0
    assert inner.tolist() == [7.5, 5.0, 2.5, 0.0, 0.0, 2.5, 5.0, 7.5]


def test_the_smoothing_draws_noise_on_the_disc_from_the_generator():
    t = build_transformation("rotation:sigma=0.3,sigma_b=0.2")
    x = image()
    out = torch.empty(20, 1, 9, 9)
    t.perturb_(out, x, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    eps = torch.randn((20, 1, 9, 9), generator=g) * 0.3
    beta = torch.randn(20, generator=g) * 0.2
    mask = interp.disc_mask(9, 9).float()
    torch.testing.assert_close(out, (x + eps + beta.reshape(-1, 1, 1, 1)) * mask)


def test_training_rotates_by_uniform_angles_then_adds_the_noise():
    t = build_transformation(EXAMPLE)
    batch = torch.stack([image(seed=k) for k in range(6)])
    out = t.transform(batch, torch.Generator().manual_seed(8))
    g = torch.Generator().manual_seed(8)
    angles = -15.0 + 30.0 * torch.rand((6, 1), generator=g, dtype=torch.float64)
    eps = torch.randn((6, 1, 9, 9), generator=g) * 0.3
    want = interp.rotate(batch, angles[:, 0]).float() + eps
    torch.testing.assert_close(out, want * interp.disc_mask(9, 9).float())
    many = t.draw(20_000, torch.Generator().manual_seed(1))
    assert many.min() >= -15.0 and many.max() <= 15.0 and abs(float(many.mean())) < 0.3


def test_the_sweep_draws_each_samples_share_in_turn():
    t = build_transformation("rotation:sigma=0.1")
    samples = torch.stack([torch.zeros(1, 9, 9), torch.ones(1, 9, 9)])
    sweep = SampleSweep(t, samples, (3, 5))
    first, second = torch.empty(2, 1, 9, 9), torch.empty(6, 1, 9, 9)
    g = torch.Generator().manual_seed(0)
    sweep.perturb_(first, samples[0], g)
    sweep.perturb_(second, samples[0], g)
    means = torch.cat([first, second]).flatten(1)[:, 40]  # the centre pixel: in the disc
    assert (means[:3].abs() < 0.6).all() and (means[3:].sub(1).abs() < 0.6).all()


def test_negative_pixels_and_too_wide_slices_are_refused():
    t = build_transformation("rotation:angle=10,slices=2")
    with pytest.raises(SmoothcertError, match="slices of 10 degrees are too wide for a 28x28"):
        t.check_shape((1, 28, 28))
    t.check_shape((1, 8, 8))
    with pytest.raises(SmoothcertError, match="pixel values >= 0"):
        t.slice_bounds(image() - 0.5)


def test_rows_do_not_depend_on_the_batch_and_the_identity_is_canonical(tmp_path):
    """The samples' draws come in the engine's canonical chunks, whatever the batch; the run's
    identity stores the transformation's canonical text (every parameter)."""
    from sampled_helpers import Linear

    from smoothcert.runs import certify_dataset
    from smoothcert.runs.records import read_manifest

    xs = torch.stack([image(seed=k) for k in range(3)])
    v = torch.randn((9, 9), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    model = Linear(v, float(-(xs[0, 0].double() * v).sum()))
    data = torch.utils.data.TensorDataset(xs, torch.zeros(3, dtype=torch.long))
    spec = "rotation:sigma=0.5,angle=5,slices=6,subslices=4"

    def rows(batch, out=None):
        found = certify_dataset(model, data, certifier="tss", options={"transform": spec},
                                n0=30, n=300, alpha=0.001, batch=batch, seed=5,
                                num_classes=2, out=out)
        return [{k: r[k] for k in r if k != "time"} for r in found]

    out = tmp_path / "r.tsv"
    assert rows(7, out) == rows(1000)
    options = read_manifest(out)["identity"]["options"]["transform"]
    assert options == ("rotation:sigma=0.5,angle=5.0,train_angle=12.5,slices=6,subslices=4,"
                       "sigma_b=0.0,b=0.0,l2=0.0")
