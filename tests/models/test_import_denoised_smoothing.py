"""``import-checkpoint --format denoised-smoothing``: Salman et al.'s DnCNN denoisers.

The reference module is written here after microsoft/denoised-smoothing ``code/archs/dncnn.py``
(its layer list, not smoothcert's class), given random weights and BatchNorm statistics, wrapped
in ``DataParallel`` for ``imagenet_dncnn`` as ``code/architectures.py`` does, and saved as
``code/train_denoiser.py`` saves it. The oracle: the imported checkpoint's weights equal the
file's, key for key, and its denoiser computes what the reference module computes on pixels.
"""

import pytest
import torch
from torch import nn

from conftest import DataParallelKeys
from smoothcert.cli.app import main
from smoothcert.denoisers import DnCNN, load_denoiser
from smoothcert.models import load_checkpoint, model_from_checkpoint


class ReferenceDnCNN(nn.Module):
    """DnCNN(depth, n_channels, image_channels) as the authors' code builds it."""

    def __init__(self, depth=17, n_channels=64, image_channels=3):
        super().__init__()
        layers = [nn.Conv2d(image_channels, n_channels, 3, padding=1, bias=True),
                  nn.ReLU(inplace=True)]
        for _ in range(depth - 2):
            layers += [nn.Conv2d(n_channels, n_channels, 3, padding=1, bias=False),
                       nn.BatchNorm2d(n_channels, eps=0.0001, momentum=0.95),
                       nn.ReLU(inplace=True)]
        layers.append(nn.Conv2d(n_channels, image_channels, 3, padding=1, bias=False))
        self.dncnn = nn.Sequential(*layers)

    def forward(self, x):
        return x - self.dncnn(x)


# their arch entry -> (n_channels, DataParallel, dataset)
ARCHS = {"cifar_dncnn": (64, False, "cifar10"), "cifar_dncnn_wide": (128, False, "cifar10"),
         "imagenet_dncnn": (64, True, "imagenet")}


def reference_denoiser(width, seed=0):
    """Random weights (the last convolution too: a fresh DnCNN is the identity) and BN state."""
    torch.manual_seed(seed)
    net = ReferenceDnCNN(n_channels=width)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.Conv2d):
                m.weight.normal_(0, (2 / (9 * m.in_channels)) ** 0.5)
            elif isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
                m.num_batches_tracked.fill_(7)
    return net.eval()


def save_as_train_denoiser(path, arch, net, data_parallel, epoch=90, with_arch=True):
    denoiser = DataParallelKeys(net) if data_parallel else net
    optimizer = torch.optim.Adam(denoiser.parameters(), lr=1e-3, weight_decay=1e-4)
    state = {"epoch": epoch, "arch": arch, "state_dict": denoiser.state_dict(),
             "optimizer": optimizer.state_dict()}
    if not with_arch:
        del state["arch"]
    torch.save(state, path)
    return path


def run_import(src, out, dataset, *extra):
    return main(["import-checkpoint", str(src), "--format", "denoised-smoothing", "--dataset",
                 dataset, "--sigma", "0.25", "--out", str(out), *extra])


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_authors_denoiser_imports_weight_by_weight(arch, tmp_path):
    width, data_parallel, dataset = ARCHS[arch]
    net = reference_denoiser(width)
    src = save_as_train_denoiser(tmp_path / "checkpoint.pth.tar", arch, net, data_parallel)
    file_keys = list(torch.load(src, weights_only=True)["state_dict"])
    assert all(k.startswith("module.dncnn." if data_parallel else "dncnn.") for k in file_keys)
    out = tmp_path / "denoiser.pt"
    assert run_import(src, out, dataset) == 0
    ours = load_checkpoint(out)
    assert list(ours.state_dict) == list(net.state_dict())
    for key, value in net.state_dict().items():
        assert torch.equal(ours.state_dict[key], value), key
    model, meta = model_from_checkpoint(out)
    assert isinstance(model, DnCNN) and (model.depth, model.width) == (17, width)
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(x), net(x), rtol=0, atol=0)
    assert meta["role"] == "denoiser" and meta["arch"] == "dncnn"
    assert meta["arch_kwargs"] == {"depth": 17, "width": width} and meta["dataset"] == dataset
    assert meta["mean"] == [0.0] * 3 and meta["std"] == [1.0] * 3
    assert meta["noise"] == {"name": "gaussian", "sigma": 0.25} and meta["epoch"] == 90
    assert meta["method"]["name"] == "denoiser-mse"
    assert meta["imported_from"]["arch_in_file"] == arch
    assert meta["imported_from"]["normalization"] == "none"
    assert load_denoiser(out, sigma=0.25).module.width == width


def test_file_without_arch_entry_is_read_off_the_weights(tmp_path):
    net = reference_denoiser(16)
    src = save_as_train_denoiser(tmp_path / "c.pth.tar", None, net, True, with_arch=False)
    out = tmp_path / "d.pt"
    assert run_import(src, out, "cifar10", "--arch", "dncnn") == 0
    model, meta = model_from_checkpoint(out)
    assert meta["arch_kwargs"] == {"depth": 17, "width": 16}
    x = torch.rand(1, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), net(x), rtol=0, atol=0)


def test_bad_inputs_exit_2_with_one_line_and_write_nothing(tmp_path, capsys):
    net = reference_denoiser(64)
    good = save_as_train_denoiser(tmp_path / "good.pth.tar", "cifar_dncnn", net, False)
    wide = save_as_train_denoiser(tmp_path / "wide.pth.tar", "cifar_dncnn_wide", net, False)
    memnet = save_as_train_denoiser(tmp_path / "memnet.pth.tar", "memnet", net, False)
    cases = [
        (memnet, "cifar10", (), "says arch 'memnet'; only the DnCNN denoisers (cifar_dncnn, "),
        (good, "cifar10", ("--arch", "cifar_resnet110"),
         "holds DnCNN denoisers, not cifar_resnet110; pass --arch dncnn"),
        (good, "cifar10", ("--normalization", "standardize"),
         "takes raw pixels in [0, 1]: --normalization standardize does not apply"),
        (good, "mnist", (), "has no mnist denoisers; its datasets are cifar10, imagenet"),
        (wide, "cifar10", (), "shape mismatches (file vs model) (dncnn.0.weight (64, 3, 3, 3) "
                              "vs (128, 3, 3, 3)"),
        (tmp_path / "nope.pth.tar", "cifar10", (), "does not exist"),
        (good, "cifar10", ("--sigma", "0"), "a denoiser is trained for a noise level"),
    ]
    for i, (src, dataset, extra, words) in enumerate(cases):
        out = tmp_path / f"out{i}.pt"
        assert run_import(src, out, dataset, *extra) == 2, words
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
        assert not out.exists()


def test_classifier_formats_still_need_arch(tmp_path, capsys):
    src = save_as_train_denoiser(tmp_path / "c.pth.tar", "cifar_dncnn", reference_denoiser(8),
                                 False)
    assert main(["import-checkpoint", str(src), "--format", "cohen", "--dataset", "cifar10",
                 "--sigma", "0.25", "--out", str(tmp_path / "o.pt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the cohen format holds classifiers: pass --arch" in err
