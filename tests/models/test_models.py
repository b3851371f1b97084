"""Model registry: every architecture builds and gives logits; NormalizeLayer; reference layouts."""

from __future__ import annotations

import os

import pytest
import torch

from smoothcert import SmoothcertError
from smoothcert.models import (
    MODELS,
    NormalizeLayer,
    build_model,
    check_arch_kwargs,
    model_role,
    model_task,
    register_model,
)

# The input shape each registered architecture is meant for; a new entry must be added here.
SHAPES = {
    "digits_cnn": (1, 8, 8),
    "lenet": (1, 28, 28),
    "ablation_cnn": (1, 28, 28),
    "cifar_resnet20": (3, 32, 32),
    "cifar_resnet56": (3, 32, 32),
    "cifar_resnet110": (3, 32, 32),
    # ImageNet's ResNet-50 is meant for 224×224; its adaptive pooling takes 64×64, which keeps
    # these CPU tests fast (tests/test_import_checkpoint.py runs it at 224 once)
    "resnet50": (3, 64, 64),
    # a denoiser and a diffusion model (tests/denoisers/ test them as such)
    "dncnn": (3, 16, 16),
    "ddpm_unet": (1, 8, 8),
    # dense tasks (tests/models/test_dense_archs.py tests their outputs)
    "fcn_small": (1, 28, 28),
    "lenet_box": (1, 28, 28),
}
# every classifier-role model is NormalizeLayer first; logits (B, K) only from classification ones
NORMALIZED = sorted(a for a in MODELS if model_role(a) == "classifier")
CLASSIFIERS = [a for a in NORMALIZED if model_task(a) == "classification"]


def make(arch: str, num_classes: int = 7):
    shape = SHAPES[arch]
    return build_model(arch, num_classes, shape, [0.5] * shape[0], [0.25] * shape[0])


def test_every_registered_model_has_a_test_shape():
    assert set(MODELS) == set(SHAPES)


def test_roles_of_the_registered_models():
    assert {a: model_role(a) for a in MODELS if model_role(a) != "classifier"} == {
        "dncnn": "denoiser", "ddpm_unet": "diffusion"}
    assert model_role("torchvision:resnet18") == model_role("timm:resnet10t") == "classifier"
    with pytest.raises(SmoothcertError, match="unknown arch 'resnet9000'; known: .*dncnn"):
        model_role("resnet9000")
    with pytest.raises(ValueError, match="role"):
        register_model("nope", role="generator")


@pytest.mark.parametrize("arch", CLASSIFIERS)
def test_model_gives_logits(arch):
    torch.manual_seed(0)
    model = make(arch).eval()
    x = torch.rand(2, *SHAPES[arch])
    with torch.no_grad():
        logits = model(x)
    assert logits.shape == (2, 7)
    assert torch.isfinite(logits).all()
    assert model.input_shape == SHAPES[arch] and model.num_classes == 7


@pytest.mark.parametrize("arch", NORMALIZED)
def test_state_dict_keys_are_normalize_then_net(arch):
    keys = list(make(arch).state_dict())
    assert keys[:2] == ["0.mean", "0.std"]
    assert all(k.startswith("1.") for k in keys[2:]) and len(keys) > 2


@pytest.mark.parametrize("arch", CLASSIFIERS)
def test_model_trains_one_step(arch):
    torch.manual_seed(0)
    model = make(arch).train()
    x, y = torch.rand(2, *SHAPES[arch]), torch.tensor([0, 1])
    torch.nn.functional.cross_entropy(model(x), y).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_normalize_layer_math_and_buffers():
    layer = NormalizeLayer([0.1, 0.2, 0.3], [0.5, 0.25, 2.0])
    x = torch.rand(4, 3, 5, 6)
    expected = torch.stack(
        [(x[:, 0] - 0.1) / 0.5, (x[:, 1] - 0.2) / 0.25, (x[:, 2] - 0.3) / 2.0], dim=1
    )
    torch.testing.assert_close(layer(x), expected)
    assert layer.mean.shape == (3, 1, 1) and layer.std.shape == (3, 1, 1)
    assert set(layer.state_dict()) == {"mean", "std"}


def test_normalize_layer_survives_a_buffer_rewritten_between_forwards():
    # DistributedDataParallel copies every buffer in place from rank 0 before each forward. A
    # loss of two forwards (stability: clean and noisy; consistency: m noise copies) then runs
    # backward through a graph whose first forward saw the buffer before that copy; had the
    # division saved the buffer itself, backward would refuse it as modified in place.
    layer = NormalizeLayer([0.5], [0.25])
    x = torch.rand(2, 1, 3, 3, requires_grad=True)
    first = layer(x)
    with torch.no_grad():
        layer.std.copy_(torch.tensor([0.25]).view(1, 1, 1))  # DDP's broadcast, on rank > 0
    (first.sum() + layer(x).sum()).backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2 / 0.25))
    assert torch.equal(first, (x - 0.5) / 0.25)  # the same numbers as the plain division


@pytest.mark.parametrize("mean,std", [([0.1, 0.2], [0.3]), ([0.1], [0.0]), ([0.1], [-1.0])])
def test_normalize_layer_rejects_bad_statistics(mean, std):
    with pytest.raises(SmoothcertError):
        NormalizeLayer(mean, std)


@pytest.mark.parametrize("arch", ["cifar_resnet20", "cifar_resnet56", "cifar_resnet110"])
def test_resnets_reject_wrong_channels_and_size(arch):
    with pytest.raises(SmoothcertError, match="3-channel"):
        build_model(arch, 10, (1, 32, 32), [0.5], [0.25])
    with pytest.raises(SmoothcertError, match="32×32"):
        build_model(arch, 10, (3, 28, 28), [0.5] * 3, [0.25] * 3)


def test_normalization_must_match_channels():
    with pytest.raises(SmoothcertError, match="channels"):
        build_model("lenet", 10, (1, 28, 28), [0.5, 0.5, 0.5], [0.25, 0.25, 0.25])


def test_unknown_arch_lists_known_ones():
    with pytest.raises(SmoothcertError, match="cifar_resnet110"):
        build_model("resnet9000", 10, (3, 32, 32), [0.5] * 3, [0.25] * 3)


@pytest.mark.parametrize(
    "arch,shape", [("lenet", (1, 8, 8)), ("digits_cnn", (1, 1, 8)), ("lenet", (1, 28))]
)
def test_too_small_or_malformed_input_shape(arch, shape):
    with pytest.raises(SmoothcertError):
        build_model(arch, 10, shape, [0.5], [0.25])


def test_small_cnns_accept_other_sizes_and_channels():
    assert build_model("digits_cnn", 3, (2, 9, 7), [0.5] * 2, [0.2] * 2)(
        torch.rand(1, 2, 9, 7)
    ).shape == (1, 3)
    assert build_model("lenet", 3, (3, 32, 32), [0.5] * 3, [0.2] * 3)(
        torch.rand(1, 3, 32, 32)
    ).shape == (1, 3)


def test_lenet_matches_jeong_shin_layout():
    shapes = {k: tuple(v.shape) for k, v in make("lenet", 10).state_dict().items()}
    assert shapes["1.conv1.weight"] == (20, 1, 5, 5)
    assert shapes["1.conv2.weight"] == (50, 20, 5, 5)
    assert shapes["1.fc1.weight"] == (500, 800)
    assert shapes["1.fc2.weight"] == (10, 500)


# Parameter counts of He et al. (2016), Table 6: ResNet-20/56/110 have 0.27M/0.85M/1.7M.
@pytest.mark.parametrize(
    "arch,count",
    [("cifar_resnet20", 272_474), ("cifar_resnet56", 855_770), ("cifar_resnet110", 1_730_714)],
)
def test_cifar_resnet_parameter_counts(arch, count):
    assert sum(p.numel() for p in make(arch, 10).parameters()) == count


def test_cifar_resnet110_matches_cohen_layout():
    """Keys of Cohen et al.'s Sequential(normalize, resnet(depth=110)): 18 basic blocks/stage."""
    state = make("cifar_resnet110", 10).state_dict()
    for key in [
        "1.conv1.weight",
        "1.bn1.running_mean",
        "1.layer1.17.conv2.weight",
        "1.layer2.0.downsample.0.weight",
        "1.layer2.0.downsample.1.num_batches_tracked",
        "1.layer3.17.bn2.weight",
        "1.fc.weight",
    ]:
        assert key in state, key
    assert "1.layer1.18.conv1.weight" not in state
    assert not any("conv3" in k for k in state)
    assert "1.layer1.0.downsample.0.weight" not in state  # identity shortcut in stage 1
    assert tuple(state["1.layer2.0.downsample.0.weight"].shape) == (32, 16, 1, 1)
    assert tuple(state["1.fc.weight"].shape) == (10, 64)


def test_torchvision_models_by_name_with_keyword_arguments():
    """Any torchvision classifier behind our NormalizeLayer; keyword arguments reach its
    constructor; the model records its classes and shape; a checkpoint rebuilds it."""
    import torchvision

    model = build_model("torchvision:mobilenet_v3_small", 5, (3, 32, 32), [0.5] * 3, [0.2] * 3,
                        {"dropout": 0.5})
    assert isinstance(model[1], torchvision.models.MobileNetV3)
    assert model[1].classifier[2].p == 0.5 and model.num_classes == 5
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 5)
    with pytest.raises(SmoothcertError, match="cannot build torchvision:resnet18"):
        build_model("torchvision:resnet18", 5, (3, 32, 32), [0.5] * 3, [0.2] * 3,
                    {"no_such_argument": 1})
    with pytest.raises(SmoothcertError, match="arch 'lenet' takes no arch parameters, got depth"):
        build_model("lenet", 5, (1, 28, 28), [0.5], [0.2], {"depth": 3})


def test_registered_arch_parameters_are_checked_converted_and_completed():
    """--arch-param text (the CLI reads values as YAML, a recipe may hold text) reaches a
    registered factory typed, completed with its defaults; a bad key names the valid ones."""
    assert check_arch_kwargs("dncnn", {}) == {"depth": 17, "width": 64}
    assert check_arch_kwargs("dncnn", {"depth": "5"}) == {"depth": 5, "width": 64}
    assert check_arch_kwargs("lenet", None) == {}
    assert check_arch_kwargs("torchvision:resnet18", {"dropout": 0.1}) == {"dropout": 0.1}
    with pytest.raises(SmoothcertError, match="unknown arch parameter.*'dncnn'; valid: depth, "
                                              "width"):
        check_arch_kwargs("dncnn", {"detph": 5})
    with pytest.raises(SmoothcertError, match="depth must be an integer >= 2"):
        check_arch_kwargs("dncnn", {"depth": 1})
    with pytest.raises(SmoothcertError, match="width must be"):
        check_arch_kwargs("dncnn", {"width": 2.5})
    with pytest.raises(SmoothcertError, match="mapping"):
        check_arch_kwargs("dncnn", [("depth", 3)])
    model = build_model("dncnn", 10, (3, 16, 16), [0.5] * 3, [0.2] * 3, {"depth": 4, "width": 8})
    assert len(model.dncnn) == 2 + 3 * 2 + 1 and model.dncnn[0].out_channels == 8


@pytest.mark.parametrize("arch", sorted(set(MODELS) - set(NORMALIZED)))
def test_denoisers_and_diffusion_models_are_bare(arch):
    """No NormalizeLayer: a denoiser maps pixels to pixels, a diffusion model has its own scale;
    mean, std and num_classes do not matter."""
    if arch == "ddpm_unet":
        pytest.importorskip("diffusers")
    shape = SHAPES[arch]
    model = build_model(arch, 0, shape, [], [], {"width": 8})
    assert model.role == model_role(arch) and model.input_shape == shape
    assert not any(isinstance(m, NormalizeLayer) for m in model.modules())
    assert not hasattr(model, "num_classes")


def test_timm_models_by_name():
    if os.environ.get("CI"):  # make test installs smoothcert[timm]: CI must run this test
        import timm  # noqa: F401
    else:
        pytest.importorskip("timm", reason="the optional extra smoothcert[timm] is not installed")
    model = build_model("timm:resnet10t", 4, (3, 32, 32), [0.5] * 3, [0.2] * 3)
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 4)
    with pytest.raises(SmoothcertError, match="unknown timm model 'resnet10tt'.*resnet10t"):
        build_model("timm:resnet10tt", 4, (3, 32, 32), [0.5] * 3, [0.2] * 3)
    one_channel = build_model("timm:resnet10t", 4, (1, 32, 32), [0.5], [0.2])  # in_chans=C
    assert one_channel(torch.rand(2, 1, 32, 32)).shape == (2, 4)
