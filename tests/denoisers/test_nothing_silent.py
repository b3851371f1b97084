"""Denoised smoothing is never silently wrong (issue 36): a diffusers folder is loaded strictly
(every UNet weight present, none extra, all finite), a scheduler whose noise does not reach 2σ
is refused, a denoiser used at another σ or noise is noted, exported folders follow the umask,
and every refusal is one line with nothing printed before it.

The folders are tiny random diffusers ``UNet2DModel`` pipelines written here; their weights are
edited with safetensors as a damaged or hand-made file would be."""

from __future__ import annotations

import logging
import os
import stat

import pytest
import torch

from conftest import write_checkpoint, write_dncnn_checkpoint
from smoothcert.denoisers import Denoised, DiffusionDenoiser, DiffusionModel, DnCNN, load_denoiser
from smoothcert.errors import SmoothcertError
from smoothcert.models.checkpoint import model_from_checkpoint
from smoothcert.runs.inputs import load_source, with_denoiser

if os.environ.get("CI"):  # make test installs smoothcert[diffusion]: CI must run these tests
    import diffusers
else:
    diffusers = pytest.importorskip("diffusers", reason="smoothcert[diffusion] is not installed")
from safetensors.torch import load_file, save_file  # noqa: E402  (diffusers brings it)

WEIGHTS = ("unet", "diffusion_pytorch_model.safetensors")


def tiny_pipeline(folder, timesteps=1000, beta_end=0.02, seed=0) -> DiffusionModel:
    torch.manual_seed(seed)
    unet = diffusers.UNet2DModel(
        sample_size=8, in_channels=1, out_channels=1, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"), norm_num_groups=4)
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=timesteps, beta_start=1e-4,
                                        beta_end=beta_end, beta_schedule="linear")
    model = DiffusionModel(unet, scheduler)
    model.save_pretrained(folder)
    return model


def edit_weights(folder, edit):
    path = folder.joinpath(*WEIGHTS)
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def refused(capfd, call, *words) -> str:
    """``call`` raises one SmoothcertError line holding ``words``, and nothing (no diffusers or
    torch warning) was printed before it."""
    capfd.readouterr()
    with pytest.raises(SmoothcertError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, message
    printed = capfd.readouterr()
    assert printed.out == "" and printed.err == "", printed
    return message


# --------------------------------------------------------------------------- strict weights
def test_a_folder_missing_a_weight_is_refused_naming_it(tmp_path, capfd):
    """Before: diffusers left conv_out.bias uninitialised behind a two-line warning."""
    tiny_pipeline(tmp_path / "m")
    edit_weights(tmp_path / "m", lambda t: t.pop("conv_out.bias"))
    refused(capfd, lambda: DiffusionDenoiser.from_pretrained(tmp_path / "m", sigma=0.25),
            str(tmp_path / "m"), "missing", "conv_out.bias")


def test_a_folder_with_an_unexpected_weight_is_refused_naming_it(tmp_path, capfd):
    tiny_pipeline(tmp_path / "m")
    edit_weights(tmp_path / "m", lambda t: t.update({"extra.weight": torch.zeros(2)}))
    refused(capfd, lambda: load_denoiser(f"diffusers:{tmp_path / 'm'}", sigma=0.25),
            "unexpected", "extra.weight")


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_weights_in_a_folder_are_refused(tmp_path, capfd, value):
    """Before: an inf bias loaded, and certified every image as one class."""
    tiny_pipeline(tmp_path / "m")

    def poison(tensors):
        tensors["conv_out.bias"][0] = value

    edit_weights(tmp_path / "m", poison)
    refused(capfd, lambda: load_denoiser(f"diffusers:{tmp_path / 'm'}", sigma=0.25),
            "conv_out.bias", "NaN or inf")


def test_a_weight_of_another_shape_names_the_key(tmp_path, capfd):
    tiny_pipeline(tmp_path / "m")
    edit_weights(tmp_path / "m", lambda t: t.update({"conv_out.bias": torch.zeros(4)}))
    refused(capfd, lambda: load_denoiser(f"diffusers:{tmp_path / 'm'}", sigma=0.25),
            "conv_out.bias")


def test_old_attention_names_still_load(tmp_path):
    """Strict, not stricter than diffusers: google/ddpm-cifar10-32's weights name attention
    query/key/value/proj_attn, which diffusers renames on loading; none is missing then."""
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=8, in_channels=1, out_channels=1, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4).eval()
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=1000)
    DiffusionModel(unet, scheduler).save_pretrained(tmp_path / "m")
    old = {".to_q.": ".query.", ".to_k.": ".key.", ".to_v.": ".value.", ".to_out.0.": ".proj_attn."}

    def rename(tensors):
        for key in list(tensors):
            new = key
            for a, b in old.items():
                new = new.replace(a, b)
            tensors[new] = tensors.pop(key)
        assert sum(".query." in k for k in tensors) > 0

    edit_weights(tmp_path / "m", rename)
    x = torch.rand(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(DiffusionDenoiser.from_pretrained(tmp_path / "m", 0.25)(x),
                                   DiffusionDenoiser(unet, scheduler, 0.25)(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("content, kind", [("[1, 2]", "a JSON list"), ('"x"', "a JSON string"),
                                           ("{x", "not valid JSON")])
@pytest.mark.parametrize("which", ["unet/config.json", "scheduler/scheduler_config.json"])
def test_a_config_that_is_not_an_object_is_not_a_diffusers_config(tmp_path, capfd, content,
                                                                   kind, which):
    """Before: a JSON list "could not reach https://huggingface.co", a string retried the hub
    for 30 s."""
    tiny_pipeline(tmp_path / "m")
    (tmp_path / "m" / which).write_text(content)
    refused(capfd, lambda: load_denoiser(f"diffusers:{tmp_path / 'm'}", sigma=0.25),
            str(tmp_path / "m" / which), "is not a diffusers config", kind)


# --------------------------------------------------------------------------- the schedule
@pytest.mark.parametrize("timesteps, beta_end", [(10, 0.02), (1000, 0.0)])
def test_a_schedule_whose_noise_does_not_reach_2_sigma_is_refused(tmp_path, capfd, timesteps,
                                                                  beta_end):
    """Before: T = 10 gave t* = 9 for every σ, β = 0 the identity: no word of it."""
    model = tiny_pipeline(tmp_path / "m", timesteps=timesteps, beta_end=beta_end)
    if beta_end == 0.0:  # β from 1e-4 to 0: barely any noise at the last step
        model.scheduler = diffusers.DDPMScheduler(num_train_timesteps=1000,
                                                  trained_betas=[0.0] * 1000)
    ratio = (1 - model.alphas_cumprod) / model.alphas_cumprod
    reach = float(ratio.max().sqrt()) / 2  # the largest σ the schedule denoises
    assert reach < 0.25
    message = refused(capfd, lambda: DiffusionDenoiser(model.unet, model.scheduler, sigma=0.25),
                      "sigma 0.25", "noise")
    assert f"{reach:.3g}" in message


def test_a_sigma_inside_a_short_schedule_is_taken(tmp_path):
    model = tiny_pipeline(tmp_path / "m", timesteps=10)
    ratio = (1 - model.alphas_cumprod) / model.alphas_cumprod
    sigma = float(ratio[9].sqrt()) / 2  # exactly the last step's level
    assert DiffusionDenoiser(model.unet, model.scheduler, sigma=sigma).timestep == 9
    assert DiffusionDenoiser(model.unet, model.scheduler, sigma=sigma / 3).timestep < 9


# --------------------------------------------------------------------------- notes
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("noted")
    tiny_pipeline(root / "ddpm")
    return {"clf": write_checkpoint(root / "clf.pt"),  # trained at σ = 0.25
            "dncnn": write_dncnn_checkpoint(root / "dncnn.pt"),  # trained at σ = 0.25
            "ddpm": root / "ddpm"}


def notes(caplog, classifier, spec, sigma, noise):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="smoothcert.runs.inputs"):
        with_denoiser(load_source(classifier), spec, sigma, noise=noise)
    return [r.getMessage() for r in caplog.records if r.name == "smoothcert.runs.inputs"]


@pytest.mark.parametrize("denoiser, sigma, noise, note", [
    ("dncnn", 0.5, "gaussian", "certifying with sigma 0.5; the denoiser {dncnn} was trained "
                               "with gaussian noise at sigma 0.25"),
    ("dncnn", 0.25, "uniform", "certifying with uniform noise at sigma 0.25; the denoiser "
                               "{dncnn} was trained with gaussian noise at sigma 0.25"),
    ("dncnn", 0.25, "gaussian", None),
    ("ddpm", 0.5, "gaussian", None),  # a diffusion model learns every σ of its noise
    ("ddpm", 0.25, "uniform", "certifying with uniform noise at sigma 0.25; the denoiser "
                              "diffusers:{ddpm} was trained with gaussian noise"),
])
def test_a_denoiser_at_another_sigma_or_noise_is_noted(files, caplog, denoiser, sigma, noise,
                                                       note):
    """Before: a classifier got this note, a denoiser none."""
    spec = f"diffusers:{files['ddpm']}" if denoiser == "ddpm" else files["dncnn"]
    got = notes(caplog, files["clf"], spec, sigma, noise)
    expected = note.format(dncnn=files["dncnn"], ddpm=files["ddpm"]) if note else None
    assert got == ([f"note: {expected}"] if expected else []), got
    assert all("\n" not in line for line in got)


# --------------------------------------------------------------------------- permissions
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_an_exported_folder_follows_the_umask(tmp_path, umask):
    """Before: 0700 folders and a 0600 weights file, whatever the umask."""
    old = os.umask(umask)
    try:
        tiny_pipeline(tmp_path / "m")
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode)
             for p in [tmp_path / "m", *(tmp_path / "m").rglob("*")]}
    for name, mode in modes.items():
        wanted = (0o777 if (tmp_path / name).is_dir() else 0o666) & ~umask
        assert mode == wanted, (name, oct(mode), oct(wanted))


# --------------------------------------------------------------------------- messages
def test_a_train_run_folder_is_a_denoiser(tmp_path, files):
    """Before: --denoiser RUN_FOLDER said "does not exist"."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(files["dncnn"].read_bytes())
    source = load_denoiser(run, sigma=0.25)
    assert isinstance(source.module, DnCNN) and source.label == str(run / "checkpoint.pt")
    assert source.sha256 == load_denoiser(files["dncnn"], sigma=0.25).sha256


def test_a_diffusers_folder_as_the_classifier_points_to_denoiser(files, capfd):
    refused(capfd, lambda: load_source(files["ddpm"]),
            f"--denoiser diffusers:{files['ddpm']}")


def test_swapped_arguments_of_denoised_are_named(files):
    clf, _ = model_from_checkpoint(files["clf"])
    den, _ = model_from_checkpoint(files["dncnn"])
    for swapped in ((clf, den), (clf, DnCNN(1, depth=3, width=4))):
        with pytest.raises(SmoothcertError, match=r"swapped.*Denoised\(denoiser, classifier\)") \
                as err:
            Denoised(*swapped)
        assert "\n" not in str(err.value)
    Denoised(den, clf)  # the right order


def test_a_float64_denoiser_or_classifier_runs(files):
    """Before: "Input type (double) and bias type (float) should be the same"."""
    clf, _ = model_from_checkpoint(files["clf"])
    den, _ = model_from_checkpoint(files["dncnn"])
    x = torch.rand(3, 1, 8, 8)
    with torch.no_grad():
        expected = Denoised(den, clf)(x)
        for pair in ((den.double(), clf), (den.float(), clf.double()),
                     (den.double(), clf.double())):
            out = Denoised(*pair)(x)
            torch.testing.assert_close(out.float(), expected, rtol=1e-5, atol=1e-5)
        den.float(), clf.float()


CLI = ["--sigma", "0.25", "--n0", "5", "--n", "10", "--max", "1", "--no-progress", "--device",
       "cpu"]


def test_the_cli_refuses_a_damaged_folder_or_a_folder_as_classifier_in_one_line(files, tmp_path,
                                                                                capfd):
    from smoothcert.cli.app import main

    tiny_pipeline(tmp_path / "bad")
    edit_weights(tmp_path / "bad", lambda t: t.pop("conv_out.bias"))
    for args, words in (
            ([files["clf"], "--denoiser", f"diffusers:{tmp_path / 'bad'}"],
             ("1 missing: conv_out.bias",)),
            ([files["ddpm"]], ("is a diffusers folder", f"--denoiser diffusers:{files['ddpm']}")),
            ([files["clf"], "--denoiser", files["ddpm"]], (f"diffusers:{files['ddpm']}",))):
        capfd.readouterr()
        assert main(["certify", *map(str, args), *CLI, "--out", str(tmp_path / "r.tsv")]) == 2
        err = capfd.readouterr().err
        assert err.count("\n") == 1 and err.startswith("smoothcert certify: error: "), err
        assert all(word in err for word in words), err
        assert not (tmp_path / "r.tsv").exists()
