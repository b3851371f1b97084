"""The models of the dense tasks: fcn_small and lenet_box behind NormalizeLayer, their output
shapes and tasks, and torchvision's segmentation models behind the adapter that returns their
per-pixel logits as a tensor (tiny inputs: these are the suite's only ResNet-50 segmenters)."""

from __future__ import annotations

import pytest
import torch
import torchvision.models
from torch import nn

from smoothcert.errors import SmoothcertError
from smoothcert.models import (
    NormalizeLayer,
    build_model,
    checkpoint_meta,
    model_from_checkpoint,
    model_task,
    save_checkpoint,
)
from smoothcert.models.archs import LeNet
from smoothcert.models.dense_archs import LeNetBox
from smoothcert.models.zoos import SegmentationLogits, _check_forward

MEAN, STD = (0.2860,), (0.3530,)


def test_fcn_small_is_a_normalized_per_pixel_segmenter():
    torch.manual_seed(0)
    model = build_model("fcn_small", 11, (1, 28, 28), MEAN, STD).eval()
    assert isinstance(model[0], NormalizeLayer) and model.task == "segmentation"
    assert model.num_classes == 11 and model_task("fcn_small") == "segmentation"
    x = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        out = model(x)
        assert out.shape == (3, 11, 28, 28)
        # in eval mode batch norm is a fixed affine map: no input depends on its batch-mates
        assert torch.allclose(model(x[1:2]), out[1:2], atol=1e-5)
        odd = build_model("fcn_small", 3, (2, 13, 17), (0.5, 0.5), (0.5, 0.5), {"width": 4})
        assert odd(torch.rand(2, 2, 13, 17)).shape == (2, 3, 13, 17)
    with pytest.raises(SmoothcertError, match="at least 4×4"):
        build_model("fcn_small", 3, (1, 3, 8), MEAN, STD)
    with pytest.raises(SmoothcertError, match="width"):
        build_model("fcn_small", 3, (1, 8, 8), MEAN, STD, {"width": 0})


def test_lenet_box_is_lenet_starting_from_the_whole_image_box():
    torch.manual_seed(0)
    model = build_model("lenet_box", 4, (1, 28, 32), MEAN, STD).eval()
    assert isinstance(model[0], NormalizeLayer) and isinstance(model[1], LeNetBox)
    assert model.task == model_task("lenet_box") == "regression"
    trunk = LeNet(4, (1, 28, 32))
    trunk.load_state_dict(model[1].state_dict())  # LeNet's weights, nothing more
    x = torch.rand(5, 1, 28, 32)
    with torch.no_grad():
        out = model(x)
        assert out.shape == (5, 4) and torch.equal(out, trunk(model[0](x)))
        model[1].fc2.weight.zero_()  # what the bias alone says: (x_min, y_min, x_max, y_max)
        assert model(x).tolist() == [[0.0, 0.0, 32.0, 28.0]] * 5  # W = 32, H = 28
        other = build_model("lenet_box", 3, (1, 28, 28), MEAN, STD)  # not a box: LeNet's init
        assert other(x[:, :, :, :28]).shape == (5, 3)
    with pytest.raises(SmoothcertError, match="at least 16×16"):
        build_model("lenet_box", 4, (1, 12, 12), MEAN, STD)


def test_every_torchvision_segmenter_segments_and_no_classifier_does():
    """model_task answers by name; the names are torchvision's own lists."""
    segmenters = torchvision.models.list_models(module=torchvision.models.segmentation)
    assert {"fcn_resnet50", "deeplabv3_resnet50", "lraspp_mobilenet_v3_large"} <= set(segmenters)
    assert {model_task(f"torchvision:{name}") for name in segmenters} == {"segmentation"}
    classifiers = torchvision.models.list_models(module=torchvision.models)
    assert {model_task(f"torchvision:{name}") for name in classifiers} == {"classification"}


@pytest.mark.parametrize("name", ["lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large",
                                  "fcn_resnet50"])
def test_torchvision_segmenters_return_per_pixel_logits(name):
    torch.manual_seed(0)
    model = build_model(f"torchvision:{name}", 5, (3, 32, 32), (0.5,) * 3, (0.25,) * 3).eval()
    assert isinstance(model[0], NormalizeLayer) and isinstance(model[1], SegmentationLogits)
    assert model.task == "segmentation" and model.num_classes == 5
    with torch.no_grad():
        out = model(torch.rand(1, 3, 32, 32))
    assert isinstance(out, torch.Tensor) and out.shape == (1, 5, 32, 32)
    # no auxiliary head unless asked for (aux_loss=True): its output would be dropped anyway
    assert getattr(model[1].model, "aux_classifier", None) is None


def test_zoo_names_and_output_checks():
    with pytest.raises(SmoothcertError, match="unknown torchvision model.*fcn_resnet50"):
        build_model("torchvision:fcn_resnet5", 5, (3, 32, 32), (0.5,) * 3, (0.25,) * 3)

    class Pooled(nn.Module):  # a "segmenter" that pools its logits away
        def forward(self, x):
            return {"out": x.mean(dim=(2, 3))}

    match = r"returns outputs of shape \(3,\) .*not per-pixel logits \(3, 8, 8\); it is not a"
    with pytest.raises(SmoothcertError, match=match):
        _check_forward("torchvision:x", SegmentationLogits(Pooled()), (3, 8, 8), (1, 3, 8, 8))


@pytest.mark.parametrize("arch, dataset, k, params, task", [
    ("fcn_small", "fashion-mnist-seg", 11, {"width": 4}, "segmentation"),
    ("lenet_box", "fashion-mnist-box", 4, None, "regression"),
])
def test_dense_models_round_trip_through_a_checkpoint(tmp_path, arch, dataset, k, params, task):
    torch.manual_seed(0)
    model = build_model(arch, k, (1, 28, 28), MEAN, STD, params).eval()
    meta = checkpoint_meta(arch=arch, dataset=dataset, num_classes=k, input_shape=(1, 28, 28),
                           mean=MEAN, std=STD, noise=None, method={"name": "standard"}, epoch=1,
                           config={}, arch_kwargs=params, task=task)
    loaded, _ = model_from_checkpoint(save_checkpoint(tmp_path / "m.pt", model, meta))
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert loaded.task == task
