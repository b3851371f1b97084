"""Local diffusers folders: a real (tiny, random) UNet2DModel saved in both layouts loads through
DiffusionDenoiser.from_pretrained and denoises as the in-memory model; google/ddpm-cifar10-32's
config loads; folder_sha256 follows the files' content, not the folder's name; ddpm_unet and
DiffusionModel.save_pretrained write a pipeline folder."""

import json
import math
import os
import shutil

import pytest
import torch

from smoothcert.denoisers import DiffusionDenoiser, DiffusionModel, folder_sha256
from smoothcert.errors import SmoothcertError
from smoothcert.models import build_model

if os.environ.get("CI"):  # make test installs smoothcert[diffusion]: CI must run these tests
    import diffusers
else:
    diffusers = pytest.importorskip("diffusers", reason="smoothcert[diffusion] is not installed")

X = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def tiny_unet(seed=0, sample_size=8, out_channels=3):
    torch.manual_seed(seed)
    return diffusers.UNet2DModel(
        sample_size=sample_size, in_channels=3, out_channels=out_channels, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4).eval()


def ddpm_scheduler(**kwargs):
    return diffusers.DDPMScheduler(num_train_timesteps=1000, beta_start=1e-4, beta_end=0.02,
                                   beta_schedule="linear", **kwargs)


def save_pipeline(folder, unet, scheduler):
    return DiffusionModel(unet, scheduler).save_pretrained(folder)


def save_flat(folder, unet, scheduler, safetensors=True):
    """google/ddpm-cifar10-32's top level: config.json, weights, scheduler_config.json."""
    unet.save_pretrained(folder, safe_serialization=safetensors)
    scheduler.save_pretrained(folder)
    return folder


def files(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def pair():
    return tiny_unet(), ddpm_scheduler()


def reference(unet, scheduler, sigma, x=X):
    with torch.no_grad():
        return DiffusionDenoiser(unet, scheduler, sigma)(x)


@pytest.mark.parametrize("layout", ["pipeline", "flat", "flat-bin"])
def test_both_layouts_load_and_denoise_as_the_model(layout, pair, tmp_path):
    unet, scheduler = pair
    folder = tmp_path / "ddpm"
    if layout == "pipeline":
        save_pipeline(folder, unet, scheduler)
        assert files(folder) == ["model_index.json", "scheduler/scheduler_config.json",
                                 "unet/config.json", "unet/diffusion_pytorch_model.safetensors"]
    else:
        save_flat(folder, unet, scheduler, safetensors=layout == "flat")
    den = DiffusionDenoiser.from_pretrained(folder, sigma=0.25)
    assert not den.training and den.input_shape == (3, 8, 8)
    assert den.timestep == DiffusionDenoiser(unet, scheduler, 0.25).timestep
    with torch.no_grad():
        out = den(X)
    torch.testing.assert_close(out, reference(unet, scheduler, 0.25), rtol=0, atol=1e-6)
    assert out.min() >= 0 and out.max() <= 1


def test_from_pretrained_reads_the_schedulers_prediction_type(tmp_path):
    unet = tiny_unet(out_channels=6)  # a learned variance too
    save_pipeline(tmp_path / "v", unet, ddpm_scheduler(prediction_type="v_prediction"))
    den = DiffusionDenoiser.from_pretrained(tmp_path / "v", sigma=0.5)
    assert den.prediction_type == "v_prediction"
    alpha = float(den.scheduler.alphas_cumprod[den.timestep])
    x_t = math.sqrt(alpha) * (2 * X - 1)
    with torch.no_grad():
        v = unet(x_t, den.timestep).sample[:, :3]
        x0 = math.sqrt(alpha) * x_t - math.sqrt(1 - alpha) * v
        torch.testing.assert_close(den(X), (x0.clamp(-1, 1) + 1) / 2, rtol=1e-5, atol=1e-6)


def test_folder_hash_follows_content_not_name(pair, tmp_path):
    unet, scheduler = pair
    first = save_pipeline(tmp_path / "a", unet, scheduler)
    digest = folder_sha256(first)
    assert digest.startswith("folder:") and len(digest) == len("folder:") + 64
    moved = shutil.copytree(first, tmp_path / "elsewhere" / "renamed")
    assert folder_sha256(moved) == digest
    (moved / "model_index.json").write_text("{}")  # not read by the loader
    assert folder_sha256(moved) == digest
    other = save_pipeline(tmp_path / "b", tiny_unet(seed=1), scheduler)  # other weights
    assert folder_sha256(other) != digest
    config = json.loads((moved / "scheduler" / "scheduler_config.json").read_text())
    config["beta_end"] = 0.03  # another schedule: another t*
    (moved / "scheduler" / "scheduler_config.json").write_text(json.dumps(config))
    assert folder_sha256(moved) != digest
    flat = save_flat(tmp_path / "flat", unet, scheduler)
    assert folder_sha256(flat) != digest  # another layout reads other paths


def test_save_pretrained_replaces_a_folder_whole(pair, tmp_path):
    unet, scheduler = pair
    folder = save_pipeline(tmp_path / "m", unet, scheduler)
    (folder / "stale.txt").write_text("old")
    save_pipeline(folder, tiny_unet(seed=2), scheduler)
    assert "stale.txt" not in files(folder)
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary folder left


def test_ddpm_unet_builds_trains_and_saves(tmp_path):
    """--arch ddpm_unet: ε-prediction, Ho et al.'s linear schedule, attention at level 2."""
    model = build_model("ddpm_unet", 10, (1, 28, 28), [0.5], [0.5],
                        {"width": 8, "layers_per_block": 1})
    assert isinstance(model, DiffusionModel) and model.role == "diffusion"
    assert model.input_shape == (1, 28, 28)
    config, sched = model.unet.config, model.scheduler.config
    assert tuple(config.block_out_channels) == (8, 16, 16)
    assert tuple(config.down_block_types) == ("DownBlock2D", "AttnDownBlock2D", "DownBlock2D")
    assert sched.prediction_type == "epsilon" and sched.num_train_timesteps == 1000
    betas = model.scheduler.betas.double()
    assert betas[0] == pytest.approx(1e-4) and betas[-1] == pytest.approx(0.02)
    x_t = torch.randn(2, 1, 28, 28)
    loss = model(x_t, torch.tensor([3, 900])).square().mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    den = DiffusionDenoiser.from_pretrained(model.save_pretrained(tmp_path / "m"), sigma=0.5)
    assert den.input_shape == (1, 28, 28)
    assert set(model.state_dict()) == {f"unet.{k}" for k in den.unet.state_dict()}


def test_ddpm_unet_levels_must_divide_the_image():
    with pytest.raises(SmoothcertError, match="divisible by 8"):
        build_model("ddpm_unet", 10, (1, 28, 28), [0.5], [0.5], {"levels": 4})
    assert build_model("ddpm_unet", 10, (1, 8, 8), [], [], {"width": 8}).unet.config \
        .block_out_channels == (8, 16, 16)


# google/ddpm-cifar10-32 (Ho et al.'s CIFAR-10 model in diffusers): its config.json and
# scheduler_config.json as published, the layout read in diffusers' conversion of Ho et al.'s
# checkpoints. The model has 35.7M parameters (random weights here: built, saved and loaded in
# about 1 s on CPU).
CIFAR10_UNET = {
    "_class_name": "UNet2DModel", "_diffusers_version": "0.0.4", "act_fn": "silu",
    "attention_head_dim": None, "block_out_channels": [128, 256, 256, 256],
    "center_input_sample": False,
    "down_block_types": ["DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"],
    "downsample_padding": 0, "flip_sin_to_cos": False, "freq_shift": 1, "in_channels": 3,
    "layers_per_block": 2, "mid_block_scale_factor": 1, "norm_eps": 1e-06,
    "norm_num_groups": 32, "out_channels": 3, "sample_size": 32,
    "time_embedding_type": "positional",
    "up_block_types": ["UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"]}
CIFAR10_SCHEDULER = {
    "_class_name": "DDPMScheduler", "_diffusers_version": "0.1.1", "beta_end": 0.02,
    "beta_schedule": "linear", "beta_start": 0.0001, "clip_sample": True,
    "num_train_timesteps": 1000, "trained_betas": None, "variance_type": "fixed_small"}


def write_cifar10_folder(folder, config):
    """The flat layout with the published config files, random weights."""
    folder.mkdir()
    torch.manual_seed(0)
    diffusers.UNet2DModel(**{k: v for k, v in config.items() if not k.startswith("_")}) \
        .save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "scheduler_config.json").write_text(json.dumps(CIFAR10_SCHEDULER))
    return folder


def check_cifar10_denoiser(folder):
    den = DiffusionDenoiser.from_pretrained(folder, sigma=0.25)
    assert den.input_shape == (3, 32, 32) and den.prediction_type == "epsilon"
    assert den.timestep == 144  # (1 − ᾱ_t)/ᾱ_t nearest 4σ² = 0.25 on Ho et al.'s schedule
    with torch.no_grad():
        out = den(torch.rand(2, 3, 32, 32))
    assert out.shape == (2, 3, 32, 32) and out.min() >= 0 and out.max() <= 1
    return den


def test_ddpm_cifar10_32_config_loads(tmp_path):
    den = check_cifar10_denoiser(write_cifar10_folder(tmp_path / "ddpm-cifar10-32",
                                                      CIFAR10_UNET))
    assert sum(p.numel() for p in den.parameters()) == 35_746_307
