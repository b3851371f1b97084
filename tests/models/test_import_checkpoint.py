"""``smoothcert import-checkpoint``: the reference implementations' released layouts.

Each file is built here in a reference layout from a randomly initialised network, either its
keys renamed as the reference code names them or, per format × dataset, saved from the
reference's own Sequential(normalization layer, [DataParallel(]net[)]) as its train scripts save
it (ImageNet: torchvision's resnet18 in that layout, and ResNet-50 once). The oracle is
closed-form: the imported model on pixels x must equal the reference network on
(x − mean) / std, with the mean and std the reference code used (numbers copied from the
repositories, not from smoothcert).
"""

import hashlib

import pytest
import torch
import torchvision
from torch import nn

from conftest import DataParallelKeys
from smoothcert.cli.app import main
from smoothcert.errors import SmoothcertError
from smoothcert.methods import METHODS
from smoothcert.models import MODELS, model_from_checkpoint
from smoothcert.models.importers import FORMATS, _check_arch, import_checkpoint

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)  # locuslab/smoothing code/datasets.py
CIFAR_STD = (0.2023, 0.1994, 0.2010)
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # idem, and in the datasets.py of the others
IMAGENET_STD = (0.229, 0.224, 0.225)
SHAPES = {"mnist": (1, 28, 28), "fashion-mnist": (1, 28, 28), "cifar10": (3, 32, 32),
          "imagenet": (3, 224, 224)}
SIGMA = "0.25"

# (format, arch, dataset, file key of a net key, weights entry, mean, std, our method)
CASES = {
    "cohen": ("cohen", "cifar_resnet20", "cifar10", "1.{}", "state_dict", CIFAR_MEAN, CIFAR_STD,
              "gaussian"),
    "cohen-dataparallel": ("cohen", "cifar_resnet20", "cifar10", "1.module.{}", "state_dict",
                           CIFAR_MEAN, CIFAR_STD, "gaussian"),
    # Salman et al.'s released InputCenterLayer: x − mean, no division.
    "salman-module-first": ("salman", "cifar_resnet20", "cifar10", "module.1.{}", "state_dict",
                            CIFAR_MEAN, (1.0, 1.0, 1.0), "smoothadv"),
    "jeong-mnist": ("jeong", "lenet", "mnist", "1.{}", "state_dict", (0.0,), (1.0,),
                    "consistency"),
    "jeong-cifar": ("jeong", "cifar_resnet20", "cifar10", "1.{}", "state_dict", CIFAR_MEAN,
                    CIFAR_STD, "consistency"),
    "macer-mnist": ("macer", "lenet", "mnist", "{}", "net", (0.0,), (1.0,), "macer"),
    "macer-dataparallel": ("macer", "cifar_resnet20", "cifar10", "module.{}", "net",
                           (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), "macer"),
}


def reference_net(arch, dataset, seed=0):
    """A random network with non-trivial BatchNorm statistics, in eval mode."""
    torch.manual_seed(seed)
    return randomize_batchnorm(MODELS[arch](10, SHAPES[dataset]), seed=None)


def randomize_batchnorm(net, seed=0):
    """``net`` in eval mode with random BatchNorm statistics and affine parameters (drawn after
    seeding with ``seed``, or from the current stream when it is None)."""
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return net.eval()


def write_reference(path, net, key, entry, legacy=False, **extra):
    weights = {key.format(k): v.clone() for k, v in net.state_dict().items()}
    torch.save({entry: weights, **extra}, path, _use_new_zipfile_serialization=not legacy)
    return path


def import_ckpt(src, out, fmt, arch, dataset, *extra):
    return main(["import-checkpoint", str(src), "--format", fmt, "--arch", arch,
                 "--dataset", dataset, "--sigma", SIGMA, "--out", str(out), *extra])


def assert_same_function(out, net, dataset, mean, std):
    """ours(x) == net((x − mean) / std) on random pixels x in [0, 1]."""
    ours, meta = model_from_checkpoint(out)
    x = torch.rand(4, *SHAPES[dataset], generator=torch.Generator().manual_seed(1))
    m, s = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), net((x - m) / s))
    return meta


def one_line_error(capsys, match):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err, err
    return err


def test_every_format_names_a_registered_method():
    assert set(FORMATS) == {"cohen", "salman", "jeong", "acr-weakness", "macer",
                            "denoised-smoothing"}
    assert all(fmt.method in METHODS for fmt in FORMATS.values())


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_equals_reference_with_its_normalization(case, tmp_path):
    fmt, arch, dataset, key, entry, mean, std, method = CASES[case]
    net = reference_net(arch, dataset)
    extra = {"arch": arch, "epoch": 90} if entry == "state_dict" else {"epoch": 440, "acc": 0.8}
    src = write_reference(tmp_path / "checkpoint.pth.tar", net, key, entry, **extra)
    out = tmp_path / "imported.pt"
    assert import_ckpt(src, out, fmt, arch, dataset) == 0
    meta = assert_same_function(out, net, dataset, mean, std)
    assert meta["arch"] == arch and meta["dataset"] == dataset and meta["num_classes"] == 10
    assert meta["mean"] == pytest.approx(mean) and meta["std"] == pytest.approx(std)
    assert meta["noise"] == {"name": "gaussian", "sigma": 0.25}
    assert meta["method"]["name"] == method and meta["epoch"] == extra["epoch"]
    source = meta["imported_from"]
    assert source["format"] == fmt
    assert source["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()


def test_old_cohen_file_with_optimizer_legacy_format_and_no_bn_counters(tmp_path):
    """2019 files: torch's legacy (non-zip) serialization, an optimizer state, and (before
    PyTorch 0.4.1) no BatchNorm num_batches_tracked."""
    net = reference_net("cifar_resnet20", "cifar10")
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.rand(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    net.eval()
    weights = {f"1.{k}": v for k, v in net.state_dict().items()
               if not k.endswith("num_batches_tracked")}
    src = tmp_path / "checkpoint.pth.tar"
    torch.save({"epoch": 90, "arch": "cifar_resnet20", "state_dict": weights,
                "optimizer": optimizer.state_dict()}, src, _use_new_zipfile_serialization=False)
    out = tmp_path / "imported.pt"
    assert import_ckpt(src, out, "cohen", "cifar_resnet20", "cifar10") == 0
    assert_same_function(out, net, "cifar10", CIFAR_MEAN, CIFAR_STD)


def test_salman_standardize_override(tmp_path):
    """Models trained with Salman et al.'s later code (NormalizeLayer) need the override."""
    net = reference_net("cifar_resnet20", "cifar10")
    src = write_reference(tmp_path / "c.pth.tar", net, "1.{}", "state_dict")
    out = tmp_path / "imported.pt"
    assert import_ckpt(src, out, "salman", "cifar_resnet20", "cifar10",
                       "--normalization", "standardize") == 0
    meta = assert_same_function(out, net, "cifar10", CIFAR_MEAN, CIFAR_STD)
    assert meta["imported_from"]["normalization"] == "standardize"


def test_existing_out_is_refused_unless_forced(tmp_path, capsys):
    net = reference_net("lenet", "mnist")
    src = write_reference(tmp_path / "c.pth", net, "{}", "net", epoch=1)
    out = tmp_path / "imported.pt"
    out.write_bytes(b"keep me")
    assert import_ckpt(src, out, "macer", "lenet", "mnist") == 2
    one_line_error(capsys, "already exists")
    assert out.read_bytes() == b"keep me"
    assert import_ckpt(src, out, "macer", "lenet", "mnist", "--force") == 0
    assert_same_function(out, net, "mnist", (0.0,), (1.0,))


def _bad_inputs(tmp_path):
    """(name, file, format, arch, dataset, expected words in the one-line error)."""
    resnet = reference_net("cifar_resnet20", "cifar10")
    lenet = reference_net("lenet", "mnist")
    plain = write_reference(tmp_path / "plain.pth.tar", resnet, "1.{}", "state_dict")
    stated = write_reference(tmp_path / "stated.pth.tar", resnet, "1.{}", "state_dict",
                             arch="cifar_resnet20")
    pickled = tmp_path / "module.pth.tar"
    torch.save(resnet, pickled)  # a whole nn.Module: needs code to unpickle
    macer = write_reference(tmp_path / "macer.pth", lenet, "{}", "net")
    macer_resnet = write_reference(tmp_path / "macer_resnet.pth", resnet, "{}", "net")
    bare = write_reference(tmp_path / "bare.pth.tar", lenet, "{}", "state_dict")
    torch.manual_seed(0)  # e.g. Salman et al.'s 1000-class ImageNet32 pre-training
    wide = write_reference(tmp_path / "wide.pth.tar", MODELS["cifar_resnet20"](1000, (3, 32, 32)),
                           "1.{}", "state_dict")
    return [
        ("wrong-arch", plain, "cohen", "cifar_resnet56", "cifar10", "missing keys"),
        ("arch-in-file", stated, "cohen", "cifar_resnet56", "cifar10", "pass --arch"),
        ("pickled-code", pickled, "cohen", "cifar_resnet20", "cifar10",
         "not a plain state-dict checkpoint"),
        ("wrong-container", macer_resnet, "cohen", "cifar_resnet20", "cifar10",
         "not a cohen checkpoint"),
        ("num-classes", wide, "salman", "cifar_resnet20", "cifar10",
         "2 shape mismatches (file vs model) (1.fc.weight (1000, 64) vs (10, 64)"),
        ("not-sequential", bare, "jeong", "lenet", "mnist", "no file key starts with '1.'"),
        ("no-reference-normalization", macer, "salman", "lenet", "mnist", "no mnist models"),
        ("unknown-format", plain, "smoothing", "cifar_resnet20", "cifar10", "invalid choice"),
        ("missing-file", tmp_path / "nope.pth", "cohen", "cifar_resnet20", "cifar10",
         "does not exist"),
    ]


def test_bad_inputs_exit_2_with_one_line_and_write_nothing(tmp_path, capsys):
    for name, src, fmt, arch, dataset, words in _bad_inputs(tmp_path):
        out = tmp_path / f"{name}.pt"
        assert import_ckpt(src, out, fmt, arch, dataset) == 2, name
        one_line_error(capsys, words)
        assert not out.exists(), name
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".pt") == []


def test_sigma_must_be_positive_or_zero_for_a_clean_classifier(tmp_path, capsys):
    src = write_reference(tmp_path / "m.pth", reference_net("lenet", "mnist"), "{}", "net")
    out = tmp_path / "imported.pt"
    assert main(["import-checkpoint", str(src), "--format", "macer", "--arch", "lenet",
                 "--dataset", "mnist", "--sigma", "-0.5", "--out", str(out)]) == 2
    one_line_error(capsys, "sigma must be a positive")
    assert not out.exists()
    # σ = 0: trained on clean images (a classifier for --denoiser); the meta holds no noise, so
    # certifying it needs --sigma
    assert main(["import-checkpoint", str(src), "--format", "macer", "--arch", "lenet",
                 "--dataset", "mnist", "--sigma", "0", "--out", str(out)]) == 0
    assert model_from_checkpoint(out)[1]["noise"] is None
    assert main(["certify", str(out), "--dataset", "digits", "--n", "10",
                 "--out", str(tmp_path / "r.tsv")]) == 2
    one_line_error(capsys, "pass --sigma")


# ---------------------------------------------------------------------------------------------
# Each reference's own model, format × dataset: Sequential(first layer, net) as its
# code/architectures.py builds it, the ImageNet network inside DataParallel (keys
# "1.module.<key>"), saved as its train scripts save it.


class RefNormalize(nn.Module):
    """The references' NormalizeLayer, (x − means) / sds, or without ``sds`` Salman et al.'s
    released InputCenterLayer, x − means; the constants are plain attributes, not state."""

    def __init__(self, means, sds=None):
        super().__init__()
        self.means = torch.tensor(means).view(-1, 1, 1)
        self.sds = None if sds is None else torch.tensor(sds).view(-1, 1, 1)

    def forward(self, x):
        x = x - self.means
        return x if self.sds is None else x / self.sds


REF_STATS = {"cifar10": (CIFAR_MEAN, CIFAR_STD), "imagenet": (IMAGENET_MEAN, IMAGENET_STD)}


def reference_first_layer(fmt, dataset):
    """get_normalize_layer / get_input_center_layer of the reference's code/datasets.py."""
    if dataset in ("mnist", "fashion-mnist"):  # Jeong & Shin, acr-weakness: torch.nn.Identity()
        return nn.Identity()
    mean, std = REF_STATS[dataset]
    return RefNormalize(mean) if fmt == "salman" else RefNormalize(mean, std)


# dataset -> (our arch of the stand-in network, the 'arch' entry of the file). ImageNet's is
# torchvision's resnet18 in the references' resnet50 layout (same key scheme, a quarter of the
# weights); the ResNet-50 itself is imported once below.
REF_NETS = {"mnist": ("lenet", "lenet"), "fashion-mnist": ("lenet", "lenet"),
            "cifar10": ("cifar_resnet20", "cifar_resnet20"),
            "imagenet": ("torchvision:resnet18", "resnet18")}
GRID = [("cohen", "cifar10"), ("cohen", "imagenet"),
        ("salman", "cifar10"), ("salman", "imagenet"),
        ("jeong", "mnist"), ("jeong", "cifar10"), ("jeong", "imagenet"),
        ("acr-weakness", "mnist"), ("acr-weakness", "fashion-mnist"),
        ("acr-weakness", "cifar10"), ("acr-weakness", "imagenet")]
# (mean, std) each reference's code used: ours(x) == reference_net((x − mean) / std).
EXPECTED_NORMALIZATION = {
    (fmt, dataset): ((0.0,), (1.0,)) if dataset in ("mnist", "fashion-mnist")
    else (REF_STATS[dataset][0], (1.0, 1.0, 1.0) if fmt == "salman" else REF_STATS[dataset][1])
    for fmt, dataset in GRID
}


@pytest.fixture(scope="module")
def ref_nets():
    """One random network per dataset, shared by the formats."""
    nets = {}
    for dataset, (arch, _) in REF_NETS.items():
        torch.manual_seed(0)
        if arch.startswith("torchvision:"):
            net = torchvision.models.get_model(arch.split(":")[1], weights=None, num_classes=1000)
        else:
            net = MODELS[arch](10, SHAPES[dataset])
        nets[dataset] = randomize_batchnorm(net)
    return nets


def reference_model(fmt, dataset, net):
    body = DataParallelKeys(net) if dataset == "imagenet" else net
    return nn.Sequential(reference_first_layer(fmt, dataset), body).eval()


def save_as_reference(path, model, arch, epoch=90):
    """The dict the references' train scripts torch.save (the optimizer before any step)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    torch.save({"epoch": epoch, "arch": arch, "state_dict": model.state_dict(),
                "optimizer": optimizer.state_dict()}, path)
    return path


def assert_equals_reference(out, model, dataset):
    ours, meta = model_from_checkpoint(out)
    x = torch.rand(2, *SHAPES[dataset], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x), model(x))
    return meta


@pytest.mark.parametrize("fmt,dataset", GRID, ids=[f"{f}-{d}" for f, d in GRID])
def test_reference_model_imports_as_itself(fmt, dataset, ref_nets, tmp_path):
    arch, file_arch = REF_NETS[dataset]
    model = reference_model(fmt, dataset, ref_nets[dataset])
    keys = list(model.state_dict())
    assert all(k.startswith("1.module." if dataset == "imagenet" else "1.") for k in keys)
    src = save_as_reference(tmp_path / "checkpoint.pth.tar", model, file_arch)
    out = import_checkpoint(src, fmt, arch=arch, dataset=dataset, sigma=0.5,
                            out=tmp_path / "imported.pt")
    meta = assert_equals_reference(out, model, dataset)
    mean, std = EXPECTED_NORMALIZATION[fmt, dataset]
    assert meta["mean"] == pytest.approx(mean) and meta["std"] == pytest.approx(std)
    assert meta["num_classes"] == (1000 if dataset == "imagenet" else 10)
    assert meta["method"]["name"] == FORMATS[fmt].method and meta["epoch"] == 90
    assert meta["imported_from"]["arch_in_file"] == file_arch


@pytest.fixture(scope="module")
def cohen_resnet50(tmp_path_factory):
    """Cohen et al.'s ImageNet model: Sequential(NormalizeLayer, DataParallel(resnet50)), random
    weights, and its file as code/train.py writes it."""
    torch.manual_seed(0)
    model = reference_model("cohen", "imagenet",
                            randomize_batchnorm(torchvision.models.resnet50(weights=None)))
    src = save_as_reference(tmp_path_factory.mktemp("cohen") / "checkpoint.pth.tar", model,
                            "resnet50")
    return model, src


def test_cli_imports_cohen_imagenet_resnet50(cohen_resnet50, tmp_path):
    model, src = cohen_resnet50
    out = tmp_path / "imported.pt"
    assert main(["import-checkpoint", str(src), "--format", "cohen", "--arch", "resnet50",
                 "--dataset", "imagenet", "--sigma", "0.5", "--out", str(out)]) == 0
    meta = assert_equals_reference(out, model, "imagenet")
    assert meta["arch"] == "resnet50" and meta["dataset"] == "imagenet"
    assert meta["num_classes"] == 1000 and tuple(meta["input_shape"]) == (3, 224, 224)
    assert meta["mean"] == pytest.approx(IMAGENET_MEAN)
    assert meta["std"] == pytest.approx(IMAGENET_STD)
    assert meta["noise"] == {"name": "gaussian", "sigma": 0.5}
    assert meta["imported_from"]["arch_in_file"] == "resnet50"


def test_resnet50_file_with_another_arch_is_refused(cohen_resnet50, tmp_path, capsys):
    model, src = cohen_resnet50
    out = tmp_path / "imported.pt"
    # The file's 'arch' entry names our resnet50.
    assert import_ckpt(src, out, "cohen", "torchvision:resnet18", "imagenet") == 2
    one_line_error(capsys, "says arch 'resnet50', --arch is 'torchvision:resnet18'; pass --arch "
                           "resnet50")
    # Without it, the strict key check names the keys.
    bare = tmp_path / "no_arch.pth.tar"
    torch.save({"epoch": 90, "state_dict": model.state_dict()}, bare)
    assert import_ckpt(bare, out, "cohen", "torchvision:resnet18", "imagenet") == 2
    err = one_line_error(capsys, "does not fit torchvision:resnet18 for imagenet: ")
    assert "unexpected keys (1.layer1.0.conv3.weight" in err and "shape mismatches" in err, err
    assert not out.exists()


def test_arch_entry_accepts_the_same_network_spelled_otherwise():
    assert _check_arch({"arch": "resnet50"}, "resnet50", "f") == "resnet50"
    assert _check_arch({"arch": "resnet50"}, "torchvision:resnet50", "f") == "resnet50"
    assert _check_arch({"arch": "cifar_resnet110"}, "cifar_resnet110", "f") == "cifar_resnet110"
    # The references' names that are not ours are provenance only.
    assert _check_arch({"arch": "cifar_densenet40"}, "cifar_resnet110", "f") == "cifar_densenet40"
    for stated, arch in (("resnet50", "torchvision:resnet18"), ("cifar_resnet110", "resnet50")):
        with pytest.raises(SmoothcertError, match=f"pass --arch {stated}$"):
            _check_arch({"arch": stated}, arch, "f")


def test_file_of_another_format_is_refused(ref_nets, tmp_path, capsys):
    net = ref_nets["cifar10"]
    macer = write_reference(tmp_path / "macer.pth", net, "{}", "net", epoch=1)
    cohen = save_as_reference(tmp_path / "cohen.pth.tar",
                              reference_model("cohen", "cifar10", net), "cifar_resnet20")
    for src, fmt, held in ((macer, "cohen", "'net', 'epoch'"),
                           (macer, "acr-weakness", "'net', 'epoch'"),
                           (cohen, "macer", "'epoch', 'arch', 'state_dict', 'optimizer'")):
        out = tmp_path / f"{fmt}.pt"
        assert import_ckpt(src, out, fmt, "cifar_resnet20", "cifar10") == 2
        one_line_error(capsys, f"is not a {fmt} checkpoint: that holds a state dict under "
                               f"{FORMATS[fmt].weights_key!r}, this file holds {held}")
        assert not out.exists()


# ---------------------------------------------------------------------------------------------
# What import writes, load accepts: files whose weights or epoch a smoothcert checkpoint may not
# hold are refused at import, in one line, with nothing written.


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weight_is_refused_at_import(value, tmp_path, capsys):
    net = reference_net("lenet", "mnist")
    src = tmp_path / "m.pth"
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    weights["fc2.bias"][3] = value  # one bad number among the weights
    torch.save({"net": weights, "epoch": 440}, src)
    out = tmp_path / "imported.pt"
    assert import_ckpt(src, out, "macer", "lenet", "mnist") == 2
    one_line_error(capsys, "weight fc2.bias holds NaN or inf values")
    assert not out.exists()


def test_non_finite_denoiser_weight_is_refused_at_import(tmp_path, capsys):
    torch.manual_seed(0)
    denoiser = MODELS["dncnn"](0, (3, 32, 32), depth=3, width=8)
    weights = {k: v.clone() for k, v in denoiser.state_dict().items()}
    weights["dncnn.0.weight"][0, 0, 0, 0] = float("nan")
    src = tmp_path / "d.pth.tar"
    torch.save({"state_dict": weights, "epoch": 90}, src)
    out = tmp_path / "dn.pt"
    assert main(["import-checkpoint", str(src), "--format", "denoised-smoothing", "--dataset",
                 "cifar10", "--sigma", "0.25", "--out", str(out)]) == 2
    one_line_error(capsys, "weight dncnn.0.weight holds NaN or inf values")
    assert not out.exists()


@pytest.mark.parametrize("epoch", [10**30, 10**9 + 1])
def test_epoch_a_checkpoint_cannot_hold_is_refused_at_import(epoch, tmp_path, capsys):
    src = write_reference(tmp_path / "m.pth", reference_net("lenet", "mnist"), "{}", "net",
                          epoch=epoch)
    out = tmp_path / "imported.pt"
    assert import_ckpt(src, out, "macer", "lenet", "mnist") == 2
    one_line_error(capsys, f"says epoch {epoch}")
    assert not out.exists()


def test_largest_epoch_a_checkpoint_holds_imports_and_loads(tmp_path):
    net = reference_net("lenet", "mnist")
    src = write_reference(tmp_path / "m.pth", net, "{}", "net", epoch=10**9)
    out = tmp_path / "imported.pt"
    assert import_ckpt(src, out, "macer", "lenet", "mnist") == 0
    assert assert_same_function(out, net, "mnist", (0.0,), (1.0,))["epoch"] == 10**9
