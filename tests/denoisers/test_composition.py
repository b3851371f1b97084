"""Denoised(denoiser, classifier): classifier ∘ resize ∘ denoiser, its attributes and refusals."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from smoothcert.denoisers import Denoised, DnCNN
from smoothcert.errors import SmoothcertError
from smoothcert.models import build_model


class Shaped(nn.Module):
    """A module that records its input and states an input shape (or not)."""

    def __init__(self, fn, input_shape=None, num_classes=None):
        super().__init__()
        self.fn, self.seen = fn, None
        if input_shape is not None:
            self.input_shape = input_shape
        if num_classes is not None:
            self.num_classes = num_classes

    def forward(self, x):
        self.seen = x
        return self.fn(x)


def test_same_size_is_classifier_of_denoiser():
    den = Shaped(lambda x: 1 - x, (3, 8, 8))
    clf = Shaped(lambda x: x.flatten(1)[:, :4], (3, 8, 8), num_classes=4)
    model = Denoised(den, clf)
    x = torch.rand(2, 3, 8, 8)
    torch.testing.assert_close(model(x), (1 - x).flatten(1)[:, :4], rtol=0, atol=0)
    assert model.num_classes == 4 and model.input_shape == (3, 8, 8)
    assert model.denoiser is den and model.classifier is clf


def test_other_size_is_resized_bicubic_with_antialiasing_to_the_classifier():
    """Carlini et al. resize the 32×32 denoised image to their classifier's size."""
    den = Shaped(lambda x: x, (3, 8, 8))
    for size in ((16, 16), (5, 6)):
        clf = Shaped(lambda x: x.mean((2, 3)), (3, *size), num_classes=3)
        model = Denoised(den, clf)
        x = torch.rand(2, 3, 8, 8)
        model(x)
        expected = F.interpolate(x, size=size, mode="bicubic", antialias=True,
                                 align_corners=False)
        torch.testing.assert_close(clf.seen, expected, rtol=0, atol=0)
        assert model.input_shape == (3, 8, 8)  # the denoiser's: inputs are its size


def test_without_shapes_nothing_is_resized_and_the_classifiers_shape_is_used():
    clf = Shaped(lambda x: x.mean((2, 3)), (3, 8, 8))
    model = Denoised(DnCNN(3, depth=3, width=4), clf)  # a bare DnCNN: any size
    assert model.input_shape == (3, 8, 8) and model.num_classes is None
    model(torch.rand(1, 3, 8, 8))
    bare = Denoised(Shaped(lambda x: x), Shaped(lambda x: x.mean((2, 3))))
    x = torch.rand(1, 3, 5, 5)
    bare(x)
    assert bare.input_shape is None and bare.classifier.seen.shape == x.shape


def test_channel_mismatch_is_refused_at_construction():
    clf = build_model("lenet", 10, (1, 28, 28), [0.5], [0.5])
    with pytest.raises(SmoothcertError, match="3-channel images but the classifier takes 1"):
        Denoised(build_model("dncnn", 10, (3, 28, 28), [], []), clf)
    with pytest.raises(SmoothcertError, match="3-channel"):
        Denoised(DnCNN(3, depth=3), clf)  # a bare DnCNN states its channels too


def test_a_real_pair_runs_and_takes_gradients():
    torch.manual_seed(0)
    den = build_model("dncnn", 10, (1, 28, 28), [], [], {"depth": 3, "width": 8})
    clf = build_model("lenet", 10, (1, 28, 28), [0.5], [0.5])
    model = Denoised(den, clf)
    assert model.num_classes == 10 and model.input_shape == (1, 28, 28)
    model(torch.rand(2, 1, 28, 28)).logsumexp(1).sum().backward()
    assert all(p.grad is not None for p in den.parameters())


@pytest.mark.parametrize("bad", ["den.pt", lambda x: x, None])
def test_a_denoiser_or_classifier_that_is_not_a_module_is_one_clear_error(bad):
    with pytest.raises(SmoothcertError, match=r"^Denoised takes torch nn\.Modules; the denoiser"):
        Denoised(bad, nn.Identity())
    with pytest.raises(SmoothcertError, match=r"^Denoised takes torch nn\.Modules; the classifier"):
        Denoised(nn.Identity(), bad)
