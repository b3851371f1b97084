"""Salman et al.'s denoiser objectives: the MSE and the stability loss on hand-made tensors, the
frozen classifier (no gradient, never changed), the test columns, and the classifier's checks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from smoothcert import Gaussian, SmoothcertError
from smoothcert.data.datasets import load_dataset
from smoothcert.methods import METHODS, build_method
from smoothcert.methods.denoising import freeze, load_classifier
from smoothcert.models import build_model
from smoothcert.models.checkpoint import checkpoint_meta, save_checkpoint

B, C, H, W, K = 6, 1, 8, 8, 10


class Scale(nn.Module):
    """D(z) = a·z: a denoiser whose output is known in closed form."""

    def __init__(self, a: float):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a))

    def forward(self, z):
        return self.a * z


def batch():
    gen = torch.Generator().manual_seed(1)
    return torch.rand(B, C, H, W, generator=gen), torch.randint(0, K, (B,), generator=gen)


def classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(C * H * W, K))


def test_the_denoiser_methods_declare_what_they_train():
    for name in ("denoiser-mse", "denoiser-stability"):
        cls = METHODS[name]
        assert cls.trains == "denoiser" and cls.uses_noise
        assert cls.test_columns == ("test_mse", "test_acc")
    assert METHODS["denoiser-mse"].frozen_classifier == "optional"
    assert METHODS["denoiser-stability"].frozen_classifier == "required"


def test_mse_is_the_mean_squared_error_of_the_denoised_noisy_input():
    x, y = batch()
    noise, method = Gaussian(0.5), build_method("denoiser-mse")
    # D = 0: ‖0 − x‖² averaged over the pixels, whatever the noise
    zero = method.loss(Scale(0.0), x, y, noise, torch.Generator().manual_seed(3))
    torch.testing.assert_close(zero["loss"], (x ** 2).mean(), rtol=1e-6, atol=0)
    assert set(zero) == {"loss"}  # no logits: the log's train_acc is NaN
    # D = a·z: (a − 1)·x + a·δ with the draws of the same generator
    out = method.loss(Scale(0.5), x, y, noise, torch.Generator().manual_seed(3))
    delta = noise.sample(x, torch.Generator().manual_seed(3))
    torch.testing.assert_close(out["loss"], ((0.5 * delta - 0.5 * x) ** 2).mean(), rtol=1e-6,
                               atol=0)
    assert delta.std().item() == pytest.approx(0.5, rel=0.2)


def test_stability_targets_the_frozen_classifier_s_clean_prediction_not_the_label():
    x, _ = batch()
    f = freeze(classifier())
    clean_pred = f(x).argmax(dim=1)
    y = (clean_pred + 1) % K  # labels that are all wrong for f
    method = build_method("denoiser-stability")
    method.classifier = f
    den, noise = Scale(0.9), Gaussian(0.25)
    out = method.loss(den, x, y, noise, torch.Generator().manual_seed(4))
    logits = f(0.9 * noise.perturb(x, torch.Generator().manual_seed(4)))
    torch.testing.assert_close(out["logits"], logits, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out["loss"], F.cross_entropy(logits, clean_pred), rtol=1e-6,
                               atol=1e-7)
    assert not torch.allclose(out["loss"], F.cross_entropy(logits, y))


def test_stability_trains_the_denoiser_only_and_leaves_the_classifier_unchanged():
    x, y = batch()
    f = freeze(classifier())
    before = {k: v.clone() for k, v in f.state_dict().items()}
    method = build_method("denoiser-stability")
    method.classifier = f
    den = nn.Conv2d(C, C, 3, padding=1)
    opt = torch.optim.Adam(den.parameters(), lr=1e-2)
    losses = []
    for step in range(15):
        out = method.loss(den, x, y, Gaussian(0.25), torch.Generator().manual_seed(step))
        opt.zero_grad()
        out["loss"].backward()
        assert den.weight.grad is not None and den.weight.grad.abs().sum() > 0
        assert all(p.grad is None and not p.requires_grad for p in f.parameters())
        opt.step()
        losses.append(out["loss"].item())
    assert not f.training
    assert all(torch.equal(f.state_dict()[k], v) for k, v in before.items())
    assert losses[-1] < losses[0]


def test_stability_without_its_classifier_says_so():
    with pytest.raises(SmoothcertError, match="--classifier"):
        build_method("denoiser-stability").loss(Scale(1.0), *batch(), Gaussian(0.25),
                                                torch.Generator())


def test_the_test_columns_are_the_mse_and_the_classifier_s_accuracy_on_denoised_images():
    data = load_dataset("digits", "test")
    method = build_method("denoiser-mse")
    cols = method.evaluate(Scale(0.0), data, Gaussian(0.5), torch.Generator(), 100)
    assert set(cols) == {"test_mse", "test_acc"} and math.isnan(cols["test_acc"])
    assert cols["test_mse"] == pytest.approx((data.images.float() * data.scale).pow(2).mean()
                                             .item(), rel=1e-6)
    f = freeze(classifier())
    method.classifier = f
    cols = method.evaluate(Scale(1.0), data, Gaussian(0.5), torch.Generator().manual_seed(2), 100)
    x, y = data.batch(torch.arange(len(data)))
    noisy = Gaussian(0.5).perturb(x, torch.Generator().manual_seed(2))  # batches draw in order
    assert cols["test_mse"] == pytest.approx((noisy - x).pow(2).mean().item(), rel=1e-5)
    assert cols["test_acc"] == (f(noisy).argmax(dim=1) == y).double().mean().item()


def _classifier_checkpoint(path, dataset="digits", shape=(1, 8, 8), arch="digits_cnn"):
    model = build_model(arch, 10, shape, (0.5,), (0.5,))
    meta = checkpoint_meta(arch=arch, dataset=dataset, num_classes=10, input_shape=shape,
                           mean=(0.5,), std=(0.5,), noise={"name": "gaussian", "sigma": 0.0},
                           method={"name": "standard", "hparams": {}}, epoch=1, config={})
    return save_checkpoint(path, model, meta)


def test_the_classifier_checkpoint_loads_frozen_and_must_be_a_classifier_of_the_dataset(
        tmp_path):
    f = load_classifier(str(_classifier_checkpoint(tmp_path / "c.pt")), "digits",
                        torch.device("cpu"))
    assert not f.training and not any(p.requires_grad for p in f.parameters())
    with pytest.raises(SmoothcertError, match="trained on mnist.*trains on digits"):
        load_classifier(str(_classifier_checkpoint(tmp_path / "m.pt", "mnist", (1, 28, 28),
                                                   "lenet")), "digits", torch.device("cpu"))
    den = build_model("dncnn", 10, (1, 8, 8), (0.5,), (0.5,), {"depth": 3, "width": 8})
    meta = checkpoint_meta(arch="dncnn", dataset="digits", num_classes=10, input_shape=(1, 8, 8),
                           mean=(0.5,), std=(0.5,), noise={"name": "gaussian", "sigma": 0.25},
                           method={"name": "denoiser-mse", "hparams": {}}, epoch=1, config={},
                           arch_kwargs={"depth": 3, "width": 8}, role="denoiser")
    save_checkpoint(tmp_path / "d.pt", den, meta)
    with pytest.raises(SmoothcertError, match="holds a denoiser.*not a classifier"):
        load_classifier(str(tmp_path / "d.pt"), "digits", torch.device("cpu"))
