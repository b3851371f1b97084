"""``--denoiser`` on certify, predict and attack: the commands run a classifier behind a trained
or a diffusion denoiser, and every bad input is one line on stderr, exit 2, no record file."""

from __future__ import annotations

import os
import sys

import pytest

from conftest import write_checkpoint, write_diffusers_folder, write_dncnn_checkpoint
from smoothcert.cli.app import main
from smoothcert.runs.records import read_records

if os.environ.get("CI"):  # make test installs smoothcert[diffusion]: CI must run these tests
    import diffusers  # noqa: F401
else:
    pytest.importorskip("diffusers", reason="smoothcert[diffusion] is not installed")

RUN = ["--n", "40", "--batch", "40", "--max", "2", "--sigma", "0.25", "--no-progress",
       "--device", "cpu"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("denoiser_cli")
    return {"clf": write_checkpoint(root / "clf.pt"),
            "dncnn": write_dncnn_checkpoint(root / "dncnn.pt"),
            "dncnn_rgb": write_dncnn_checkpoint(root / "dncnn_rgb.pt", channels=3),
            "ddpm": write_diffusers_folder(root / "ddpm"),
            "ddpm16": write_diffusers_folder(root / "ddpm16", size=16),
            "no_unet": write_diffusers_folder(root / "no_unet", unet=False),
            "no_scheduler": write_diffusers_folder(root / "no_scheduler", scheduler=False)}


def test_help_of_each_command_names_both_kinds_of_denoiser(capsys):
    for command in ("certify", "predict", "attack"):
        assert main([command, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "--denoiser SPEC" in text and "diffusers:FOLDER" in text
        assert "denoiser-mse|denoiser-stability" in text and "denoised-smoothing" in text


@pytest.mark.parametrize("command, extra", [
    ("predict", []),
    ("attack", ["--epsilon", "0.1", "--steps", "1", "--noise-draws", "2"]),
])
@pytest.mark.parametrize("kind", ["dncnn", "ddpm"])
def test_predict_and_attack_take_a_denoiser(files, tmp_path, command, extra, kind):
    spec = str(files[kind]) if kind == "dncnn" else f"diffusers:{files[kind]}"
    out = tmp_path / "r.tsv"
    assert main([command, str(files["clf"]), "--denoiser", spec, *RUN, *extra,
                 "--out", str(out)]) == 0
    records = read_records(out)
    assert len(records) == 2 and records.manifest["identity"]["certifier"] == command
    assert records.manifest["identity"]["denoiser"].startswith(
        "folder:" if kind == "ddpm" else "")
    assert ("timestep" in records.manifest["identity"]) == (kind == "ddpm")


def bad(files, tmp_path):
    """Each bad input: (classifier, denoiser spec, words the one line must hold)."""
    return {
        "missing file": (files["clf"], tmp_path / "missing.pt", "does not exist"),
        "missing folder": (files["clf"], f"diffusers:{tmp_path / 'nowhere'}", "nowhere"),
        "folder without UNet": (files["clf"], f"diffusers:{files['no_unet']}", "UNet"),
        "folder without scheduler": (files["clf"], f"diffusers:{files['no_scheduler']}",
                                     "scheduler"),
        "classifier as denoiser": (files["clf"], files["clf"], "is a classifier checkpoint"),
        "denoiser as classifier": (files["dncnn"], None,
                                   "is a denoiser; pass it with --denoiser"),
        "channels": (files["clf"], files["dncnn_rgb"], "3-channel"),
        "sizes": (files["clf"], f"diffusers:{files['ddpm16']}", "(1, 16, 16)"),
    }


CASES = ["missing file", "missing folder", "folder without UNet", "folder without scheduler",
         "classifier as denoiser", "denoiser as classifier", "channels", "sizes"]


@pytest.mark.parametrize("command", ["certify", "attack"])
@pytest.mark.parametrize("case", CASES)
def test_bad_denoiser_input_is_one_line_exit_2_and_no_file(files, tmp_path, capsys, case,
                                                           command):
    classifier, spec, words = bad(files, tmp_path)[case]
    out = tmp_path / "out" / "r.tsv"
    denoiser = ["--denoiser", str(spec)] if spec is not None else []
    attack = ["--epsilon", "0.1"] if command == "attack" else []
    assert main([command, str(classifier), *denoiser, *RUN, *attack, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert not out.exists() and not out.with_name("r.tsv.manifest.json").exists()


def test_without_diffusers_the_line_names_the_extra(files, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "diffusers", None)  # import diffusers raises ImportError
    out = tmp_path / "r.tsv"
    assert main(["certify", str(files["clf"]), "--denoiser", f"diffusers:{files['ddpm']}",
                 *RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "smoothcert[diffusion]" in err, err
    assert not out.exists()


def test_a_cascade_denoises_each_level_at_its_sigma(files, tmp_path, monkeypatch):
    """One diffusion denoiser serves every level of ``--certifier cascade``: level k's draws
    go through it at σ_k's timestep (``with_sigma``); the identity keeps level 1's t*."""
    from smoothcert.denoisers.diffusion import DiffusionDenoiser

    seen, original = [], DiffusionDenoiser.with_sigma
    monkeypatch.setattr(DiffusionDenoiser, "with_sigma",
                        lambda self, sigma: seen.append(sigma) or original(self, sigma))
    out = tmp_path / "r.tsv"
    assert main(["certify", str(files["clf"]), "--denoiser", f"diffusers:{files['ddpm']}",
                 "--n0", "10", "--n", "40", "--batch", "40", "--max", "2", "--sigma",
                 "0.5,0.25", "--certifier", "cascade", "--no-progress", "--device", "cpu",
                 "--out", str(out)]) == 0
    records = read_records(out)
    assert len(records) == 2 and seen == [0.25]
    assert records.manifest["identity"]["options"]["sigmas"] == "0.5,0.25"
    assert records.manifest["identity"]["timestep"] > 0
