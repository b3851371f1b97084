"""``import-checkpoint --format improved-diffusion|guided-diffusion``: the authors' UNets as
diffusers folders that ``--denoiser diffusers:FOLDER`` loads.

Golden test: ``tests/fixtures/openai_unet/*.json`` were recorded from the authors' own
``UNetModel`` and ``GaussianDiffusion`` (openai/improved-diffusion 1bc7bbb, openai/guided-diffusion
22e0df8) by ``tests/fixtures/openai_unet/make_golden.py``: tiny models with learned variance,
scale-shift norm, rescaled timesteps (improved), resblock_updown and num_head_channels (guided),
the new attention order without learned variance (guided-new-order). Each holds the model's
key list with shapes, the seed its weights were drawn from (in that key order), its output on a
seeded input and Carlini et al.'s one-shot denoising (``p_sample(...)["pred_xstart"]`` at t*).
Here the same state dict is rebuilt from the key list and the seed, saved as the authors' files
are (a bare ``state_dict()``), imported through the CLI, and must reproduce both.
"""

import json
import math
from pathlib import Path

import pytest
import torch

from smoothcert.cli.app import main
from smoothcert.denoisers import load_denoiser
from smoothcert.denoisers.openai_import import layout
from smoothcert.denoisers.openai_unet import (
    PRESET_FORMATS,
    PRESETS,
    diffusers_unet_config,
    resolve_flags,
    scheduler_config,
    timestep_scale,
)
from smoothcert.errors import SmoothcertError

diffusers = pytest.importorskip("diffusers")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openai_unet"
CASES = ("improved", "guided", "guided-new-order")
FORMAT = {"improved_diffusion": "improved-diffusion", "guided_diffusion": "guided-diffusion"}


def golden(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


def authors_state_dict(fixture):
    """The fixture's weights: randn(shape) / sqrt(numel / shape[0]) per key, in key order, from
    one generator seeded with the fixture's seed (as make_golden.py fills the authors' model)."""
    g = torch.Generator().manual_seed(fixture["seed"])
    return {key: torch.randn(shape, generator=g) / math.sqrt(max(1, math.prod(shape) // shape[0]))
            for key, shape in fixture["keys"]}


def golden_input(fixture):
    size = fixture["flags"]["image_size"]
    return torch.rand((2, 3, size, size), generator=torch.Generator().manual_seed(
        fixture["seed"] + 1))


def params(fixture):
    return [f"{k}={v}" for k, v in fixture["flags"].items()]


def assert_summary(out, summary):
    """Per-(image, channel) sums and sums of squares to ~1e-5 relative (256 pixels each), and
    the pixels on the stride-8 grid to 1e-5."""
    assert list(out.shape) == summary["shape"]
    torch.testing.assert_close(out.sum(dim=(2, 3)), torch.tensor(summary["sum"]),
                               rtol=1e-5, atol=3e-3)
    torch.testing.assert_close(out.square().sum(dim=(2, 3)), torch.tensor(summary["sumsq"]),
                               rtol=1e-5, atol=3e-3)
    torch.testing.assert_close(out[:, :, ::8, ::8], torch.tensor(summary["strided"]),
                               rtol=1e-5, atol=1e-5)


def import_fixture(name, tmp_path, *extra):
    fixture = golden(name)
    src = tmp_path / f"{name}.pt"
    torch.save(authors_state_dict(fixture), src)
    out = tmp_path / f"{name}-diffusers"
    args = ["import-checkpoint", str(src), "--format", FORMAT[fixture["repo"]], "--out", str(out)]
    for item in params(fixture):
        args += ["--param", item]
    return fixture, src, out, main([*args, *extra])


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Each golden case imported once through the CLI: name -> (fixture, folder)."""
    root = tmp_path_factory.mktemp("openai")
    folders = {}
    for name in CASES:
        fixture, _, out, code = import_fixture(name, root)
        assert code == 0
        folders[name] = (fixture, out)
    return folders


@pytest.mark.parametrize("name", CASES)
def test_imported_folder_reproduces_the_authors_model_and_denoising(name, imported):
    fixture, out = imported[name]
    source = load_denoiser(f"diffusers:{out}", fixture["sigma"])
    denoiser = source.module
    x = golden_input(fixture)
    with torch.no_grad():  # the UNet alone, at the timesteps GaussianDiffusion feeds it
        out_unet = denoiser.unet(2 * x - 1, torch.tensor(fixture["model_timesteps"])).sample
        denoised = denoiser(x)
    assert_summary(out_unet, fixture["output"])
    # One-shot denoising: same t*, and (pred_xstart + 1) / 2 of their p_sample, which takes the
    # ε half of a learned-variance output and rescales t when rescale_timesteps is set.
    assert source.timestep == fixture["t_star"]
    pred = fixture["pred_xstart"]
    assert_summary(2 * denoised - 1, pred)
    # with_sigma keeps the timestep scale
    again = denoiser.with_sigma(fixture["sigma"])
    assert again.timestep_scale == denoiser.timestep_scale
    torch.testing.assert_close(again(x), denoised)


def test_rescaled_timesteps_are_applied_and_recorded(imported):
    fixture, out = imported["improved"]
    scheduler = json.loads((out / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_smoothcert_timestep_scale"] == 1000 / 4000
    assert scheduler["beta_schedule"] == "squaredcos_cap_v2"
    assert scheduler["num_train_timesteps"] == 4000
    assert scheduler["variance_type"] == "learned_range"
    unet = json.loads((out / "unet" / "config.json").read_text())
    provenance = unet["_smoothcert_imported_from"]
    assert provenance["format"] == "improved-diffusion" and provenance["flags"]["learn_sigma"]
    # Without the scale the same weights give another output: the rescale is what matched.
    denoiser = load_denoiser(f"diffusers:{out}", fixture["sigma"]).module
    assert denoiser.timestep_scale == 0.25
    x = golden_input(fixture)
    with torch.no_grad():
        unscaled = type(denoiser)(denoiser.unet, denoiser.scheduler, fixture["sigma"])(x)
        assert (unscaled - denoiser(x)).abs().max() > 1e-3


def test_guided_folder_has_no_timestep_scale(imported):
    _, out = imported["guided"]
    scheduler = json.loads((out / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_smoothcert_timestep_scale"] == 1.0
    assert scheduler["beta_schedule"] == "linear"
    assert load_denoiser(f"diffusers:{out}", 0.25).module.timestep_scale == 1.0


# ---------------------------------------------------------------------------------------------
# Carlini et al.'s two denoisers: the flags of ethz-spylab/diffusion_denoised_smoothing's
# cifar10/DRM.py and imagenet/DRM.py (class Args), copied here as the oracle.

CARLINI_CIFAR10 = dict(
    image_size=32, num_channels=128, num_res_blocks=3, num_heads=4, num_heads_upsample=-1,
    attention_resolutions="16,8", dropout=0.3, learn_sigma=True, sigma_small=False,
    class_cond=False, diffusion_steps=4000, noise_schedule="cosine", timestep_respacing="",
    use_kl=False, predict_xstart=False, rescale_timesteps=True, rescale_learned_sigmas=True,
    use_checkpoint=False, use_scale_shift_norm=True)
CARLINI_IMAGENET = dict(
    image_size=256, num_channels=256, num_res_blocks=2, num_heads=4, num_heads_upsample=-1,
    num_head_channels=64, attention_resolutions="32,16,8", channel_mult="1,1,2,2,4,4",
    dropout=0.0, class_cond=False, use_checkpoint=False, use_scale_shift_norm=True,
    resblock_updown=True, use_fp16=False, use_new_attention_order=False, learn_sigma=True,
    diffusion_steps=1000, noise_schedule="linear", timestep_respacing="", use_kl=False,
    predict_xstart=False, rescale_timesteps=False, rescale_learned_sigmas=False)
# state_dict() of the authors' UNetModel built from those flags with their create_model:
# number of keys and of parameters (counted with their code, on the meta device).
AUTHORS_COUNTS = {"carlini-cifar10": (446, 52_546_438), "carlini-imagenet": (566, 552_814_086)}


@pytest.mark.parametrize("preset, flags", [("carlini-cifar10", CARLINI_CIFAR10),
                                           ("carlini-imagenet", CARLINI_IMAGENET)])
def test_presets_are_carlini_et_al_flags_and_the_authors_layout(preset, flags):
    resolved = resolve_flags(PRESET_FORMATS[preset], preset=preset)
    assert {k: resolved[k] for k in flags} == flags
    assert PRESETS[preset] == resolved
    with torch.device("meta"):  # shapes only: the ImageNet UNet has 553M parameters
        unet = diffusers.UNet2DModel(**diffusers_unet_config(resolved))
    table = layout(resolved, unet.state_dict())
    keys, count = AUTHORS_COUNTS[preset]
    assert len(table) == keys
    assert sum(math.prod(e.shape) for e in table.values()) == count
    assert sum(p.numel() for p in unet.parameters()) == count


def test_scheduler_configs_of_the_presets():
    cifar = resolve_flags("improved-diffusion", preset="carlini-cifar10")
    imagenet = resolve_flags("guided-diffusion", preset="carlini-imagenet")
    assert scheduler_config(cifar) == {
        "num_train_timesteps": 4000, "beta_schedule": "squaredcos_cap_v2", "clip_sample": True,
        "prediction_type": "epsilon", "variance_type": "learned_range"}
    assert timestep_scale(cifar) == 0.25 and timestep_scale(imagenet) == 1.0
    sched = diffusers.DDPMScheduler(**scheduler_config(imagenet))
    # guided-diffusion's linear schedule for T = 1000: β from 1e-4 to 0.02
    assert sched.betas[0].item() == pytest.approx(1e-4) and sched.betas[-1].item() == \
        pytest.approx(0.02)


# ---------------------------------------------------------------------------------------------
# Refusals: one line, exit 2, no folder written.


def _damaged(fixture, how):
    state = authors_state_dict(fixture)
    if how == "missing":
        del state["out.2.bias"]
    elif how == "extra":
        state["label_emb.weight"] = torch.zeros(1000, 128)
    elif how == "nan":
        state["middle_block.1.qkv.weight"][0, 0, 0] = float("nan")
    return state


@pytest.mark.parametrize("how, words", [
    ("missing", "1 missing keys (out.2.bias)"),
    ("extra", "1 unexpected keys (label_emb.weight)"),
    ("nan", "weight middle_block.1.qkv.weight holds NaN or inf values"),
])
def test_damaged_state_dict_is_refused(how, words, tmp_path, capsys):
    fixture = golden("guided")
    src = tmp_path / "damaged.pt"
    torch.save(_damaged(fixture, how), src)
    out = tmp_path / "folder"
    args = ["import-checkpoint", str(src), "--format", "guided-diffusion", "--out", str(out)]
    assert main([*args, *[a for p in params(fixture) for a in ("--param", p)]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert not out.exists() and list(tmp_path.iterdir()) == [src]


@pytest.mark.parametrize("change, words", [
    # the file has learned variance: 6 output channels, the flags say 3
    (["--param", "learn_sigma=False"], "shape mismatches (file vs flags) (out.2.weight "
                                       "(6, 32, 3, 3) vs (3, 32, 3, 3)"),
    (["--param", "num_res_blocks=1"], "missing keys"),
    (["--param", "num_head_channels=8"], "unexpected keys"),  # not a flag of improved-diffusion
    (["--param", "num_heads=3"], "different head widths"),
    (["--param", "class_cond=True"], "class-conditional"),
    (["--param", "learn_sigma=maybe"], "learn_sigma=maybe is not a boolean"),
    (["--param", "num_layers=3"], "unknown improved/guided-diffusion flag 'num_layers'"),
    (["--param", "image_size"], "--param takes KEY=VALUE"),
    (["--preset", "carlini-imagenet"], "pass --format guided-diffusion"),
    (["--sigma", "0.25"], "does not take --sigma"),
])
def test_flags_that_disagree_with_the_file_are_refused(change, words, tmp_path, capsys):
    _, src, out, code = import_fixture("improved", tmp_path, *change)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    if words == "unexpected keys":
        words = "improved-diffusion's UNet has no num_head_channels"
    assert words in err, err
    assert not out.exists()


def test_flags_of_the_other_format_and_reference_flags_are_refused(tmp_path, capsys):
    src = tmp_path / "x.pt"
    torch.save({"a": torch.zeros(1)}, src)
    assert main(["import-checkpoint", str(src), "--format", "cohen", "--arch", "lenet",
                 "--dataset", "mnist", "--sigma", "0", "--preset", "carlini-cifar10",
                 "--out", str(tmp_path / "o.pt")]) == 2
    assert "does not take --preset" in capsys.readouterr().err
    assert main(["import-checkpoint", str(src), "--format", "cohen", "--arch", "lenet",
                 "--dataset", "mnist", "--out", str(tmp_path / "o.pt")]) == 2
    assert "needs --sigma" in capsys.readouterr().err


def test_existing_folder_is_refused_unless_forced(tmp_path, capsys):
    out = tmp_path / "improved-diffusers"
    out.mkdir()
    (out / "keep").write_text("me")
    _, _, out, code = import_fixture("improved", tmp_path)
    assert code == 2 and "already exists" in capsys.readouterr().err
    assert (out / "keep").read_text() == "me"
    _, _, out, code = import_fixture("improved", tmp_path, "--force")
    assert code == 0 and not (out / "keep").exists() and (out / "unet").is_dir()


def test_flag_values_are_read_as_the_repositories_read_them():
    flags = resolve_flags("guided-diffusion", {"learn_sigma": "t", "dropout": "0",
                                               "attention_resolutions": 16,
                                               "timestep_respacing": None, "image_size": "64"})
    assert flags["learn_sigma"] is True and flags["dropout"] == 0.0
    assert flags["attention_resolutions"] == "16" and flags["timestep_respacing"] == ""
    assert flags["channel_mult"] == "1,2,3,4"  # guided-diffusion's create_model at 64
    with pytest.raises(SmoothcertError, match="channel multipliers only for image_size"):
        resolve_flags("improved-diffusion", {"image_size": 128})
    with pytest.raises(SmoothcertError, match="num_res_blocks must be a int"):
        resolve_flags("improved-diffusion", {"num_res_blocks": True})


def test_certify_runs_behind_the_imported_folder(imported, tmp_path):
    """``--denoiser diffusers:FOLDER`` (here the API's ``denoiser=``) takes the converted folder:
    the run identity holds its t* and the folder's fingerprint."""
    from smoothcert.runs.records import read_records
    from smoothcert.runs.runner import certify_dataset

    fixture, out = imported["improved"]
    torch.manual_seed(0)
    classifier = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 10))
    x = golden_input(fixture)
    rows = certify_dataset(classifier, [(x[0], 1), (x[1], 2)], sigma=fixture["sigma"], n0=8,
                           n=16, batch=16, num_classes=10, denoiser=f"diffusers:{out}",
                           out=tmp_path / "r.tsv")
    assert len(rows) == 2
    identity = read_records(tmp_path / "r.tsv").manifest["identity"]
    assert identity["timestep"] == fixture["t_star"]
    assert identity["denoiser"].startswith("folder:")


def test_a_damaged_timestep_scale_is_refused_and_the_scale_is_fingerprinted(tmp_path):
    from smoothcert.denoisers import folder_sha256

    _, _, out, code = import_fixture("improved", tmp_path)
    assert code == 0
    path = out / "scheduler" / "scheduler_config.json"
    before, config = folder_sha256(out), json.loads(path.read_text())
    for scale in (-1, 0, "0.25", float("inf"), True):
        path.write_text(json.dumps({**config, "_smoothcert_timestep_scale": scale}))
        assert folder_sha256(out) != before  # a resumed record file cannot mix the two
        with pytest.raises(SmoothcertError, match="_smoothcert_timestep_scale must be a posit"):
            load_denoiser(f"diffusers:{out}", 0.25)
