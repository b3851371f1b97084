"""DnCNN as Salman et al. (microsoft/denoised-smoothing code/archs/dncnn.py) build it: keys, layer
settings, residual output, initialization and parameter count in closed form."""

import pytest
import torch
from torch import nn

from smoothcert.denoisers import DnCNN
from smoothcert.errors import SmoothcertError
from smoothcert.models import build_model


def param_count(channels, depth, width):
    """First conv 3·3·C·W + W (bias); (depth − 2) × [3·3·W·W + 2W (BN affine)]; last 3·3·W·C."""
    return 9 * channels * width + width + (depth - 2) * (9 * width * width + 2 * width) \
        + 9 * width * channels


@pytest.mark.parametrize("channels,depth,width", [(3, 17, 64), (3, 17, 128), (1, 5, 16)])
def test_parameter_count_is_the_closed_form(channels, depth, width):
    count = sum(p.numel() for p in DnCNN(channels, depth, width).parameters())
    assert count == param_count(channels, depth, width)
    if (channels, depth, width) == (3, 17, 64):
        assert count == 558_400  # the authors' cifar_dncnn / imagenet_dncnn


def test_keys_and_layers_are_the_authors():
    net = DnCNN(3)
    keys = list(net.state_dict())
    assert keys[:3] == ["dncnn.0.weight", "dncnn.0.bias", "dncnn.2.weight"]
    assert keys[-1] == "dncnn.47.weight" and "dncnn.47.bias" not in keys
    assert all(k.startswith("dncnn.") for k in keys)
    layers = list(net.dncnn)
    assert len(layers) == 2 + 3 * 15 + 1
    convs = [m for m in layers if isinstance(m, nn.Conv2d)]
    assert len(convs) == 17 and convs[0].bias is not None
    assert all(c.bias is None and c.kernel_size == (3, 3) and c.padding == (1, 1)
               for c in convs[1:])
    bns = [m for m in layers if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) == 15 and all(b.eps == 1e-4 and b.momentum == 0.95 for b in bns)


def test_fresh_dncnn_is_the_identity_with_orthogonal_convolutions():
    torch.manual_seed(0)
    net = DnCNN(3, depth=5, width=16).eval()
    x = torch.rand(2, 3, 9, 11)
    torch.testing.assert_close(net(x), x, rtol=0, atol=0)
    convs = [m for m in net.dncnn if isinstance(m, nn.Conv2d)]
    assert torch.count_nonzero(convs[-1].weight) == 0 and torch.count_nonzero(convs[0].bias) == 0
    for conv in convs[:-1]:  # rows of the flattened (out, in·9) weight are orthonormal
        w = conv.weight.flatten(1)
        torch.testing.assert_close(w @ w.T, torch.eye(w.shape[0]), rtol=0, atol=1e-5)


def test_output_is_input_minus_the_residual_on_any_size():
    torch.manual_seed(0)
    net = DnCNN(1, depth=4, width=8)
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.normal_(m.weight, std=0.3)
    net.eval()
    for shape in ((2, 1, 8, 8), (1, 1, 13, 5)):
        x = torch.rand(shape)
        with torch.no_grad():
            torch.testing.assert_close(net(x), x - net.dncnn(x.clone()))
            assert net(x).shape == shape and not torch.equal(net(x), x)


def test_arch_parameters_reach_the_network():
    model = build_model("dncnn", 10, (1, 28, 28), [0.5], [0.5], {"depth": 6, "width": "12"})
    assert isinstance(model, DnCNN) and (model.depth, model.width, model.channels) == (6, 12, 1)
    assert model.input_shape == (1, 28, 28) and model.role == "denoiser"
    assert sum(p.numel() for p in model.parameters()) == param_count(1, 6, 12)


@pytest.mark.parametrize("kwargs", [{"depth": 1}, {"width": 0}, {"channels": 0}])
def test_bad_sizes_are_refused(kwargs):
    args = {"channels": 3, **kwargs}
    with pytest.raises(SmoothcertError, match=f"{next(iter(kwargs))} must be an integer"):
        DnCNN(**args)
