"""The ``transform`` training method (``methods/transform.py``): cross-entropy on inputs
transformed by draws of the smoothing distribution from the trainer's generator, its
transformation stored canonically, refused in one line where it is missing or does not fit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from smoothcert.errors import SmoothcertError
from smoothcert.methods import METHODS, build_method
from smoothcert.transforms import build_transformation


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.rand(6, 1, 8, 8, generator=g), torch.randint(0, 10, (6,), generator=g)


@pytest.mark.parametrize("transform", ["brightness:sigma_b=0.3,sigma_k=0.2",
                                       "blur:distribution=uniform,scale=1.5",
                                       "translation:sigma=2"])
def test_the_loss_is_cross_entropy_on_the_transformed_batch(transform):
    model, (x, y) = tiny(), batch()
    out = build_method("transform", transform=transform).loss(
        model, x, y, None, torch.Generator().manual_seed(7))
    t = build_transformation(transform)
    moved = t.apply(x, t.draw(6, torch.Generator().manual_seed(7)))  # one draw per example
    assert not torch.equal(moved, x)
    torch.testing.assert_close(out["loss"], F.cross_entropy(model(moved), y), rtol=0, atol=0)
    torch.testing.assert_close(out["logits"], model(moved), rtol=0, atol=0)


def test_a_sampled_transformation_trains_on_transformed_then_noisy_inputs():
    """Rotation (TSS's strict-rotation-noise): a uniform angle within train_angle, the pixel
    noise, the disc mask, one draw per example from the trainer's generator."""
    model, (x, y) = tiny(), batch()
    text = "rotation:sigma=0.2,angle=10,train_angle=15,slices=20"
    out = build_method("transform", transform=text).loss(
        model, x, y, None, torch.Generator().manual_seed(7))
    moved = build_transformation(text).transform(x, torch.Generator().manual_seed(7))
    assert moved[:, :, 0, 0].abs().max() == 0  # the corner is off the disc
    torch.testing.assert_close(out["loss"], F.cross_entropy(model(moved), y), rtol=0, atol=0)
    config = SimpleNamespace(dataset="digits", image_size=None)
    with pytest.raises(SmoothcertError, match="slices of 20 degrees are too wide for a 8x8"):
        build_method("transform", transform="rotation:angle=20,slices=2").prepare(config,
                                                                                  "cpu")


def test_the_method_trains_without_noise_and_stores_one_name():
    assert not METHODS["transform"].uses_noise
    method = build_method("transform", transform="translation")
    assert method.hparams() == {"transform": "translation:sigma=3.0"}
    assert build_method("transform", **method.hparams()).hparams() == method.hparams()


def test_a_missing_or_unfitting_transformation_is_one_line():
    config = SimpleNamespace(dataset="digits", image_size=None)  # 1×8×8 images
    with pytest.raises(SmoothcertError, match="method 'transform' needs a transformation: "
                                              r"--param transform=NAME:KEY=VALUE"):
        build_method("transform").prepare(config, torch.device("cpu"))
    with pytest.raises(SmoothcertError, match="translation sigma 9 pixels is larger than the "
                                              "8x8 image"):
        build_method("transform", transform="translation:sigma=9").prepare(
            config, torch.device("cpu"))
    build_method("transform", transform="translation:sigma=8").prepare(config, "cpu")
    with pytest.raises(SmoothcertError, match="method 'transform': transformation 'blur': "
                                              "unknown distribution 'box'"):
        build_method("transform", transform="blur:distribution=box")


def test_the_test_accuracy_is_on_transformed_images():
    """``test_acc`` counts the model on each test image transformed once: a model that reads
    the brightness is right on clean images and wrong on shifted ones."""

    class Bright(nn.Module):
        def forward(self, x):
            m = x.flatten(1).mean(dim=1)
            return torch.stack([0.5 - m, m - 0.5], dim=1)

    xs = torch.full((20, 1, 4, 4), 0.6)
    data = _Data(xs, torch.ones(20, dtype=torch.long))
    clean = build_method("standard").evaluate(Bright(), data, None,
                                              torch.Generator().manual_seed(0), 8)
    shifted = build_method("transform", transform="brightness:sigma_b=1").evaluate(
        Bright(), data, None, torch.Generator().manual_seed(0), 8)
    assert clean["test_acc"] == 1.0 and 0.2 < shifted["test_acc"] < 0.8


class _Data:
    """What ``evaluate`` reads of a split: its length and batches by index."""

    def __init__(self, xs, ys):
        self.xs, self.ys = xs, ys

    def __len__(self):
        return len(self.xs)

    def batch(self, idx):
        return self.xs[idx], self.ys[idx]
