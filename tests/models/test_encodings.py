"""Input encodings: ablation's (x, 1 − x) / (0, 0) first layer, a model built behind it for every
registered classifier, and the checkpoint that records it."""

from __future__ import annotations

import pytest
import torch
from test_models import SHAPES as TEST_MODELS_SHAPES

from smoothcert import SmoothcertError
from smoothcert.models import (
    MODELS,
    AblationEncoding,
    NormalizeLayer,
    build_model,
    checkpoint_meta,
    input_channels,
    load_checkpoint,
    model_from_checkpoint,
    model_role,
    model_task,
    save_checkpoint,
)
from smoothcert.models.ensemble import Ensemble

NAN = float("nan")
# Each registered classifier at a shape of the digits (1×8×8) or Fashion-MNIST (1×28×28) when it
# takes one; the CIFAR ResNets take only 3×32×32, so their fixed-channel path (the 1×1 stem
# from 6 to 3 channels) is tested at that shape. A new classifier must be added here.
SHAPES = {arch: shape for arch, shape in TEST_MODELS_SHAPES.items()
          if model_role(arch) == "classifier" and model_task(arch) == "classification"} \
    | {"resnet50": (1, 28, 28)}
CLASSIFIERS = sorted(a for a in MODELS
                     if model_role(a) == "classifier" and model_task(a) == "classification")


def encoded(arch: str, shape, num_classes: int = 5, seed: int = 0):
    torch.manual_seed(seed)
    c = shape[0]
    return build_model(arch, num_classes, shape, [0.3] * c, [0.4] * c,
                       input_encoding="ablation")


def ablated(shape, batch: int = 3, seed: int = 1) -> torch.Tensor:
    """Random pixels with the first two columns of every image NaN (ablated)."""
    x = torch.rand(batch, *shape, generator=torch.Generator().manual_seed(seed))
    x[..., :2] = NAN
    return x


def test_kept_pixels_become_x_and_one_minus_x_ablated_ones_zero_zero():
    x = torch.tensor([[[[0.0, 1.0, 0.25, NAN]], [[NAN, 0.5, 0.75, 1.0]]]])  # (1, 2, 1, 4)
    out = AblationEncoding()(x)
    assert out.shape == (1, 4, 1, 4)
    expected = torch.tensor([[[[0.0, 1.0, 0.25, 0.0]], [[0.0, 0.5, 0.75, 1.0]],
                              [[1.0, 0.0, 0.75, 0.0]], [[0.0, 0.5, 0.25, 0.0]]]])
    assert torch.equal(out, expected)
    black, gone = out[0, :, 0, 0], AblationEncoding()(torch.full((1, 2, 1, 1), NAN))[0, :, 0, 0]
    assert torch.equal(black[::2], torch.tensor([0.0, 1.0]))  # black is (0, 1) ...
    assert torch.equal(gone, torch.zeros(4))  # ... ablated (0, 0): not the same input


def test_the_encoding_has_no_state_and_gradients_reach_only_kept_pixels():
    assert AblationEncoding().state_dict() == {}
    x = torch.tensor([[[[0.2, NAN, 0.7]]]], requires_grad=True)
    AblationEncoding()(x).mul(torch.tensor([2.0, 3.0]).view(1, 2, 1, 1)).sum().backward()
    assert torch.equal(x.grad, torch.tensor([[[[-1.0, 0.0, -1.0]]]]))  # 2·1 + 3·(−1); 0


def test_the_encoded_normalization_keeps_ablated_apart_from_every_kept_value():
    mean, std = AblationEncoding.normalization([0.3, 0.6], [0.4, 0.2])
    assert (mean, std) == ([0.3, 0.6, 0.7, 0.4], [0.4, 0.2, 0.4, 0.2])
    norm = NormalizeLayer(mean, std)
    grid = torch.linspace(0, 1, 11).view(1, 1, 1, 11).expand(1, 2, 1, 11)
    kept = norm(AblationEncoding()(grid))
    torch.testing.assert_close(kept[:, :2], -kept[:, 2:])  # (z, −z): the image's own z
    torch.testing.assert_close(kept[:, :2], (grid - torch.tensor([0.3, 0.6]).view(1, 2, 1, 1))
                               / torch.tensor([0.4, 0.2]).view(1, 2, 1, 1))
    gone = norm(AblationEncoding()(torch.full((1, 2, 1, 1), NAN)))
    torch.testing.assert_close((gone[:, :2] + gone[:, 2:]).flatten(), -1 / torch.tensor([0.4, 0.2]))


def test_every_classifier_has_a_test_shape_and_the_fixed_ones_are_declared():
    assert set(CLASSIFIERS) == set(SHAPES)
    assert {a: input_channels(a) for a in CLASSIFIERS if input_channels(a)} == {
        "cifar_resnet20": 3, "cifar_resnet56": 3, "cifar_resnet110": 3, "resnet50": 3}
    assert (input_channels("torchvision:resnet18"), input_channels("timm:resnet10t")) == (3, None)


@pytest.mark.parametrize("arch", CLASSIFIERS)
def test_every_classifier_builds_behind_the_encoding_and_gives_finite_logits(arch):
    shape = SHAPES[arch]
    model = encoded(arch, shape).eval()
    assert isinstance(model[0], AblationEncoding) and isinstance(model[1], NormalizeLayer)
    assert model.input_encoding == "ablation" and model.input_shape == shape
    assert model[1].mean.shape == (2 * shape[0], 1, 1)
    stem = model[2][0] if input_channels(arch) else None
    if stem is not None:  # fixed at 3 channels: a learned 1×1 conv from the encoding's 2C
        assert (stem.in_channels, stem.out_channels, stem.kernel_size) == (2 * shape[0], 3, (1, 1))
    with torch.no_grad():
        logits = model(ablated(shape, batch=2))
    assert logits.shape == (2, 5) and torch.isfinite(logits).all()


@pytest.mark.parametrize("arch", ["torchvision:resnet18", "timm:resnet10t"])
def test_external_models_take_the_encoding(arch):
    if arch.startswith("timm:"):
        pytest.importorskip("timm")
    model = encoded(arch, (1, 16, 16)).eval()
    with torch.no_grad():
        assert torch.isfinite(model(ablated((1, 16, 16), batch=2))).all()


def test_a_plain_model_says_it_has_no_encoding_and_turns_ablated_pixels_into_nan():
    model = build_model("digits_cnn", 5, (1, 8, 8), [0.3], [0.4])
    assert model.input_encoding is None and list(model.state_dict())[:2] == ["0.mean", "0.std"]
    with torch.no_grad():
        assert torch.isnan(model(ablated((1, 8, 8)))).all()


def test_unknown_encodings_and_encoded_denoisers_are_refused():
    with pytest.raises(SmoothcertError, match="unknown input encoding 'mask'; known: ablation"):
        build_model("digits_cnn", 5, (1, 8, 8), [0.3], [0.4], input_encoding="mask")
    with pytest.raises(SmoothcertError, match="dncnn is a denoiser: an input encoding is for"):
        build_model("dncnn", 0, (1, 8, 8), [0.3], [0.4], input_encoding="ablation")


def _meta(**more):
    return checkpoint_meta(arch="digits_cnn", dataset="digits", num_classes=5,
                           input_shape=(1, 8, 8), mean=(0.3,), std=(0.4,), noise=None,
                           method={"name": "ablation", "hparams": {}}, epoch=1, config={}, **more)


def test_a_checkpoint_records_the_encoding_and_loads_back_the_same_function(tmp_path):
    model = encoded("digits_cnn", (1, 8, 8), seed=3)
    path = save_checkpoint(tmp_path / "a.pt", model, _meta(input_encoding="ablation"))
    loaded, meta = model_from_checkpoint(path)
    assert meta["input_encoding"] == "ablation" and loaded.input_encoding == "ablation"
    x = ablated((1, 8, 8), batch=4)
    with torch.no_grad():
        assert torch.equal(loaded(x), model.eval()(x))


def test_a_checkpoint_without_the_field_loads_a_plain_model_unchanged(tmp_path):
    assert "input_encoding" not in _meta()  # the meta of every other checkpoint is unchanged
    model = build_model("digits_cnn", 5, (1, 8, 8), [0.3], [0.4])
    loaded, _ = model_from_checkpoint(save_checkpoint(tmp_path / "p.pt", model, _meta()))
    x = torch.rand(3, 1, 8, 8)
    with torch.no_grad():
        assert loaded.input_encoding is None and torch.equal(loaded(x), model.eval()(x))


def test_an_encoded_model_saved_without_its_encoding_does_not_load_as_a_plain_one(tmp_path):
    path = save_checkpoint(tmp_path / "e.pt", encoded("digits_cnn", (1, 8, 8)), _meta())
    with pytest.raises(SmoothcertError, match="do not fit a digits_cnn model"):
        model_from_checkpoint(path)


def test_a_bad_encoding_in_a_meta_is_one_line(tmp_path):
    path = save_checkpoint(tmp_path / "b.pt", encoded("digits_cnn", (1, 8, 8)),
                           {**_meta(), "input_encoding": "mask"})
    with pytest.raises(SmoothcertError, match="meta input_encoding is 'mask', expected none or "
                                              "an input encoding \\(ablation\\)"):
        load_checkpoint(path)
    with pytest.raises(SmoothcertError, match="unknown input encoding 'mask'"):
        _meta(input_encoding="mask")


def test_an_ensemble_keeps_its_members_encoding_and_refuses_a_mix():
    a, b = encoded("digits_cnn", (1, 8, 8), seed=1), encoded("digits_cnn", (1, 8, 8), seed=2)
    assert Ensemble([a, b]).input_encoding == "ablation"
    plain = build_model("digits_cnn", 5, (1, 8, 8), [0.3], [0.4])
    with pytest.raises(SmoothcertError, match="disagree on the input encoding"):
        Ensemble([a, plain])


def test_an_ensemble_of_checkpoints_must_share_the_encoding(tmp_path):
    enc = save_checkpoint(tmp_path / "enc.pt", encoded("digits_cnn", (1, 8, 8)),
                          _meta(input_encoding="ablation"))
    plain = save_checkpoint(tmp_path / "plain.pt",
                            build_model("digits_cnn", 5, (1, 8, 8), [0.3], [0.4]), _meta())
    assert Ensemble.from_checkpoints([enc, enc]).input_encoding == "ablation"
    with pytest.raises(SmoothcertError, match="members must share input_encoding: .*enc.pt has "
                                              "'ablation', .*plain.pt has None"):
        Ensemble.from_checkpoints([enc, plain])


def test_ablation_cnn_is_the_authors_mnist_network_behind_the_encoding():
    """alevine0/patchSmoothing train_mnist_band.py: Conv2d(2, 64, 4, 2, 1), Conv2d(64, 128, 4,
    2, 1), Linear(128·7·7, 500), Linear(500, 100), Linear(100, 10): 3,320,922 parameters."""
    net = encoded("ablation_cnn", (1, 28, 28), num_classes=10)[2]
    shapes = [tuple(p.shape) for p in net.parameters()]
    assert shapes == [(64, 2, 4, 4), (64,), (128, 64, 4, 4), (128,), (500, 6272), (500,),
                      (100, 500), (100,), (10, 100), (10,)]
    assert sum(p.numel() for p in net.parameters()) == 3_320_922
