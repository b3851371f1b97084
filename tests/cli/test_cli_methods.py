"""Every registered method trains from the CLI with its recipe (on digits, one epoch): the
classifier methods, and denoised smoothing's pipeline (standard classifier, MSE denoiser,
MSE-then-stability denoiser) and a tiny DDPM whose diffusers folder certification loads."""

import math
from pathlib import Path

import pytest

from smoothcert.cli.app import main
from smoothcert.methods import METHODS
from smoothcert.models.checkpoint import load_checkpoint

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "fashion-mnist"
# Two steps of 128 balanced digits: the recipe's method runs end to end; its quality is tested
# in the method's own module.
COMMON = ["--dataset", "digits", "--arch", "digits_cnn", "--epochs", "1", "--batch", "128",
          "--train-size", "256", "--lr", "0.01", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    out = tmp_path_factory.mktemp("pre") / "gaussian"
    assert main(["train", "--config", str(CONFIGS / "gaussian_s050.yaml"), *COMMON,
                 "--out", str(out)]) == 0
    return out / "checkpoint.pt"


# A method without noise whose recipes are named after what they keep (or how they transform):
# the one that fits digits.
NAMED = {"ablation": "ablation_column.yaml",  # a band of 2 of the 8 columns
         "transform": "transform_brightness.yaml"}


def recipe(method: str) -> Path:
    """The method's Fashion-MNIST recipe at σ = 0.5, or its only one (a method without noise)."""
    path = CONFIGS / f"{method}_s050.yaml"
    if method in NAMED:
        return CONFIGS / NAMED[method]
    return path if path.exists() else CONFIGS / f"{method}.yaml"


@pytest.mark.parametrize("method", sorted(n for n, cls in METHODS.items()
                                          if cls.trains == "classifier"))
def test_method_trains_from_the_cli_with_its_recipe(method, pretrained, tmp_path):
    extra = {  # heat fine-tunes a Gaussian model; CAT-RS learns from a σ = 0.5 Gaussian teacher
        "heat": ["--init-from", str(pretrained), "--param", "num_steps=1"],
        "catrs": ["--param", f"teacher_checkpoint={pretrained}", "--param", "teacher_sigma=0.5",
                  "--param", "teacher_draws=16"],
    }.get(method, [])
    out = tmp_path / method
    assert main(["train", "--config", str(recipe(method)), *COMMON, *extra,
                 "--out", str(out)]) == 0
    meta = load_checkpoint(out / "checkpoint.pt").meta
    assert meta["method"]["name"] == method and meta["epoch"] == 1
    assert meta["num_hparams"] == len(meta["method"]["hparams"])
    header, row = (out / "log.tsv").read_text().splitlines()
    values = dict(zip(header.split("\t"), row.split("\t")))
    assert float(values["seconds"]) > 0 and float(values["peak_mem_mb"]) > 0
    assert math.isfinite(float(values["loss"]))


def test_heat_without_a_pretrained_checkpoint_is_refused(tmp_path, capsys):
    assert main(["train", "--config", str(CONFIGS / "heat_s050.yaml"), *COMMON,
                 "--param", "num_steps=1", "--out", str(tmp_path / "h")]) == 2
    assert "--init-from" in capsys.readouterr().err


# The denoisers' recipes with a DnCNN of depth 3 and width 8 on 256 digits (2 steps); the DDPM's
# with a UNet of width 8 and 2 levels (8 → 4 pixels) over 50 timesteps on 128 digits.
DIGITS = ["--dataset", "digits", "--epochs", "1", "--no-progress", "--device", "cpu"]
TINY_DNCNN = [*DIGITS, "--arch-param", "depth=3", "--arch-param", "width=8", "--batch", "128",
              "--train-size", "256"]
TINY_DDPM = [*DIGITS, "--arch-param", "width=8", "--arch-param", "levels=2", "--arch-param",
             "layers_per_block=1", "--arch-param", "timesteps=50", "--batch", "64",
             "--train-size", "128"]


def logged(out: Path) -> dict[str, float]:
    header, row = (out / "log.tsv").read_text().splitlines()
    return {k: float(v) for k, v in zip(header.split("\t"), row.split("\t"))}


def test_denoised_smoothing_trains_from_the_cli(tmp_path, capsys):
    clf = tmp_path / "standard"
    assert main(["train", "--config", str(recipe("standard")), *COMMON, "--out", str(clf)]) == 0
    assert load_checkpoint(clf / "checkpoint.pt").meta["noise"] is None
    mse, stab = tmp_path / "mse", tmp_path / "stab"
    assert main(["train", "--config", str(recipe("denoiser-mse")), *TINY_DNCNN, "--classifier",
                 str(clf / "checkpoint.pt"), "--out", str(mse)]) == 0
    meta = load_checkpoint(mse / "checkpoint.pt").meta
    assert (meta["role"], meta["arch"], meta["arch_kwargs"]) == \
        ("denoiser", "dncnn", {"depth": 3, "width": 8})
    assert (meta["config"]["optimizer"], meta["config"]["lr"]) == ("adam", 1e-3)  # the recipe's
    row = logged(mse)
    assert math.isfinite(row["test_mse"]) and 0 <= row["test_acc"] <= 1
    assert main(["train", "--config", str(recipe("denoiser-stability")), *TINY_DNCNN,
                 "--classifier", str(clf / "checkpoint.pt"), "--init-from",
                 str(mse / "checkpoint.pt"), "--out", str(stab)]) == 0
    assert load_checkpoint(stab / "checkpoint.pt").meta["method"]["name"] == "denoiser-stability"
    assert 0 <= logged(stab)["train_acc"] <= 1
    # stability without its classifier: one line, exit 2, nothing written
    capsys.readouterr()
    assert main(["train", "--config", str(recipe("denoiser-stability")), *TINY_DNCNN,
                 "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "give --classifier" in err
    assert not (tmp_path / "bad").exists()


def test_a_tiny_ddpm_trains_from_the_cli_and_its_diffusers_folder_loads(tmp_path):
    pytest.importorskip("diffusers")
    from smoothcert.denoisers import DiffusionDenoiser

    out = tmp_path / "ddpm"
    assert main(["train", "--config", str(recipe("diffusion")), *TINY_DDPM, "--out",
                 str(out)]) == 0
    assert math.isfinite(logged(out)["test_loss"])
    denoiser = DiffusionDenoiser.from_pretrained(out / "diffusers", sigma=0.25)
    assert denoiser.input_shape == (1, 8, 8) and 0 <= denoiser.timestep < 50


def test_train_help_lists_the_denoising_methods_and_dncnn(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["train", "--help"]) == 0
    names = {line.split()[0] for line in capsys.readouterr().out.splitlines()
             if line.startswith("  ") and line.split()}
    assert {"standard", "denoiser-mse", "denoiser-stability", "diffusion", "dncnn",
            "ddpm_unet", "--optimizer", "--classifier"} <= names
