"""load_denoiser: a denoiser checkpoint, a diffusion checkpoint, diffusers:FOLDER or a module, with
its fingerprint; every bad input is one SmoothcertError line."""

import hashlib
import json
import sys

import pytest
import torch

from smoothcert.denoisers import (
    DenoiserSource,
    DiffusionDenoiser,
    DiffusionModel,
    DnCNN,
    folder_sha256,
    load_denoiser,
)
from smoothcert.errors import SmoothcertError
from smoothcert.models import build_model, checkpoint_meta, model_from_checkpoint, save_checkpoint

diffusers = pytest.importorskip("diffusers", reason="smoothcert[diffusion] is not installed")


def save_model(path, arch, shape, role, arch_kwargs=None, seed=0):
    torch.manual_seed(seed)
    model = build_model(arch, 10, shape, [0.5] * shape[0], [0.5] * shape[0], arch_kwargs)
    if role == "denoiser":  # a trained-looking DnCNN: non-zero last layer, BN statistics
        for p in model.parameters():
            p.data.normal_(0, 0.1)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
    meta = checkpoint_meta(arch=arch, dataset="digits", num_classes=10, input_shape=shape,
                           mean=[0.5] * shape[0], std=[0.5] * shape[0],
                           noise={"name": "gaussian", "sigma": 0.5},
                           method={"name": "x", "hparams": {}}, epoch=1, config={},
                           arch_kwargs=arch_kwargs, role=role)
    save_checkpoint(path, model, meta)
    return model.eval()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("denoisers")
    dncnn = save_model(root / "dncnn.pt", "dncnn", (1, 8, 8), "denoiser", {"depth": 3, "width": 4})
    diffusion = save_model(root / "ddpm.pt", "ddpm_unet", (1, 8, 8), "diffusion",
                           {"width": 8, "levels": 2, "layers_per_block": 1})
    save_model(root / "lenet.pt", "digits_cnn", (1, 8, 8), "classifier")
    diffusion.save_pretrained(root / "folder")
    return root, dncnn, diffusion


def one_line(err):
    assert "\n" not in str(err.value), str(err.value)
    return str(err.value)


def test_denoiser_checkpoint(files):
    root, dncnn, _ = files
    source = load_denoiser(root / "dncnn.pt", sigma=0.5)
    assert isinstance(source, DenoiserSource) and isinstance(source.module, DnCNN)
    assert not source.module.training and source.timestep is None
    assert source.sha256 == hashlib.sha256((root / "dncnn.pt").read_bytes()).hexdigest()
    assert source.label == str(root / "dncnn.pt") and source.input_shape == (1, 8, 8)
    x = torch.rand(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(source.module(x), dncnn(x))
    module, meta = model_from_checkpoint(root / "dncnn.pt")  # the bare denoiser
    assert isinstance(module, DnCNN) and meta["role"] == "denoiser"
    assert meta["arch_kwargs"] == {"depth": 3, "width": 4}


def test_diffusion_checkpoint_denoises_in_one_shot(files):
    root, _, diffusion = files
    source = load_denoiser(root / "ddpm.pt", sigma=0.5)
    assert isinstance(source.module, DiffusionDenoiser) and source.input_shape == (1, 8, 8)
    assert source.timestep == DiffusionDenoiser(diffusion.unet, diffusion.scheduler, 0.5).timestep
    module, _ = model_from_checkpoint(root / "ddpm.pt")
    assert isinstance(module, DiffusionModel)


def test_diffusers_folder_and_module(files):
    root, dncnn, diffusion = files
    folder = load_denoiser(f"diffusers:{root / 'folder'}", sigma=0.25)
    assert folder.sha256 == folder_sha256(root / "folder")
    assert folder.label == f"diffusers:{root / 'folder'}"
    assert folder.timestep == folder.module.timestep == 144
    x = torch.rand(2, 1, 8, 8)
    with torch.no_grad():
        expected = DiffusionDenoiser(diffusion.unet, diffusion.scheduler, 0.25)(x)
        torch.testing.assert_close(folder.module(x), expected, rtol=0, atol=1e-6)
    module = load_denoiser(dncnn, sigma=0.25, device="cpu")
    assert module.module is dncnn and module.sha256.startswith("state_dict:")
    assert module.timestep is None and module.input_shape == (1, 8, 8)
    assert module.label == "<DnCNN module>"
    other = load_denoiser(DnCNN(1, depth=3, width=4), sigma=0.25)
    assert other.sha256 != module.sha256 and other.input_shape is None
    assert load_denoiser(folder.module, sigma=0.25).timestep == 144
    bare = load_denoiser(diffusion, sigma=0.25)  # a DiffusionModel denoises in one shot
    assert isinstance(bare.module, DiffusionDenoiser) and bare.timestep == 144
    assert bare.sha256 == load_denoiser(bare.module, sigma=0.25).sha256


def test_bad_inputs_are_one_line_each(files, tmp_path):
    root, _, diffusion = files
    unet_only = tmp_path / "unet_only"
    diffusion.unet.save_pretrained(unet_only)
    scheduler_only = tmp_path / "scheduler_only"
    diffusion.scheduler.save_pretrained(scheduler_only)
    pipeline_no_scheduler = tmp_path / "pipe"
    diffusion.save_pretrained(pipeline_no_scheduler)
    (pipeline_no_scheduler / "scheduler" / "scheduler_config.json").unlink()
    broken = tmp_path / "broken"
    diffusion.save_pretrained(broken)
    (broken / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"not weights")
    wrong_config = tmp_path / "wrong_config"
    diffusion.save_pretrained(wrong_config)
    (wrong_config / "unet" / "config.json").write_text(json.dumps({"in_channels": "three"}))
    cases = [
        (tmp_path / "missing.pt", "denoiser checkpoint .*missing.pt does not exist"),
        (root / "folder", "folder is a diffusers folder; name it --denoiser diffusers:"),
        (tmp_path, "is a folder without a checkpoint.pt"),
        ("diffusers:", "diffusers: needs a folder"),
        (f"diffusers:{tmp_path / 'nope'}", "diffusers folder .*nope does not exist"),
        (f"diffusers:{scheduler_only}", "holds no UNet: expected unet/config.json"),
        (f"diffusers:{unet_only}", "holds no scheduler: expected scheduler_config.json"),
        (f"diffusers:{pipeline_no_scheduler}", "expected scheduler/scheduler_config.json"),
        (f"diffusers:{broken}", "cannot be loaded"),
        (f"diffusers:{wrong_config}", "cannot be loaded"),
        (root / "lenet.pt", "lenet.pt is a classifier checkpoint, not a denoiser"),
        (3, "a denoiser is a smoothcert checkpoint path, diffusers:FOLDER or a torch "
            "nn.Module, got int"),
    ]
    for spec, words in cases:
        with pytest.raises(SmoothcertError, match=words) as err:
            load_denoiser(spec, sigma=0.5)
        one_line(err)
    with pytest.raises(SmoothcertError, match="sigma must be a positive"):
        load_denoiser(root / "dncnn.pt", sigma=0)


def test_without_diffusers_the_error_names_the_extra(files, monkeypatch):
    root, _, _ = files
    monkeypatch.setitem(sys.modules, "diffusers", None)  # import diffusers raises ImportError
    for call in (lambda: load_denoiser(f"diffusers:{root / 'folder'}", sigma=0.5),
                 lambda: load_denoiser(root / "ddpm.pt", sigma=0.5),
                 lambda: build_model("ddpm_unet", 10, (1, 8, 8), [], []),
                 lambda: DiffusionDenoiser.from_pretrained(root / "folder", sigma=0.5)):
        with pytest.raises(SmoothcertError, match="pip install 'smoothcert\\[diffusion\\]'") \
                as err:
            call()
        one_line(err)
    # a DnCNN never needs it
    assert isinstance(load_denoiser(root / "dncnn.pt", sigma=0.5).module, DnCNN)
