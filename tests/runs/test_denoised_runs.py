"""Denoised smoothing through the runner: a classifier certified behind a trained DnCNN or a
one-shot diffusion denoiser (Salman et al. 2020; Carlini et al. 2023), by every certifier, with
the denoiser in the run identity.

The CLI path (a classifier checkpoint and ``--denoiser``) and the Python path
(``certify_dataset(Denoised(denoiser, classifier), ...)``) give the same rows; the identity holds
the denoiser's fingerprint and a diffusion denoiser's t*, so that a resumed run refuses another
denoiser (or none) and resumes with the same one, while runs without a denoiser keep the
identity they always had.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from conftest import write_checkpoint, write_diffusers_folder, write_dncnn_checkpoint
from smoothcert import Denoised, certify_dataset
from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.io import file_sha256
from smoothcert.models.checkpoint import model_from_checkpoint
from smoothcert.runs.records import read_records
from smoothcert.runs.runner import RunConfig, run_identity

if os.environ.get("CI"):  # make test installs smoothcert[diffusion]: CI must run these tests
    import diffusers
else:
    diffusers = pytest.importorskip("diffusers", reason="smoothcert[diffusion] is not installed")

SIGMA = 0.25
RUN = ["--n0", "10", "--n", "64", "--batch", "50", "--no-progress", "--device", "cpu"]
PY_RUN = dict(sigma=SIGMA, n0=10, n=64, batch=50, max_count=3, seed=0)
TIMELESS = ("idx", "label", "predict", "radius", "correct", "p_lower", "nA", "n0", "n",
            "alpha", "sigma", "seed")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("denoised")
    return {"clf": write_checkpoint(root / "clf.pt"),
            "dncnn": write_dncnn_checkpoint(root / "dncnn.pt"),
            "ddpm": write_diffusers_folder(root / "ddpm")}


def certify(*args, max_count=3, sigma=SIGMA):
    sigma = ["--sigma", str(sigma)] if sigma is not None else []
    return main(["certify", *map(str, args), *RUN, "--max", str(max_count), *sigma])


def timeless(path_or_rows):
    rows = read_records(path_or_rows).rows() if not isinstance(path_or_rows, list) \
        else path_or_rows
    return [{k: float(r[k]) for k in TIMELESS} for r in rows]


def t_star(sigma=SIGMA):
    from smoothcert.denoisers import one_shot_timestep

    return one_shot_timestep(diffusers.DDPMScheduler().alphas_cumprod, sigma)


def test_dncnn_cli_rows_equal_certify_dataset_of_denoised_modules(files, tmp_path):
    cli = tmp_path / "cli.tsv"
    assert certify(files["clf"], "--denoiser", files["dncnn"], "--out", cli) == 0
    classifier, _ = model_from_checkpoint(files["clf"])
    denoiser, _ = model_from_checkpoint(files["dncnn"])
    rows = certify_dataset(Denoised(denoiser, classifier), load_dataset("digits", "test"),
                           **PY_RUN, out=tmp_path / "api.tsv")
    assert timeless(cli) == timeless(rows) == timeless(tmp_path / "api.tsv")
    alone = tmp_path / "alone.tsv"
    assert certify(files["clf"], "--out", alone) == 0
    assert timeless(alone) != timeless(cli)  # the denoiser is applied: other votes
    cli_id = read_records(cli).manifest["identity"]
    api = read_records(tmp_path / "api.tsv").manifest
    assert cli_id["denoiser"] == file_sha256(files["dncnn"]) and "timestep" not in cli_id
    assert api["identity"]["denoiser"].startswith("state_dict:")
    assert api["identity"]["checkpoint_sha256"].startswith("state_dict:")
    assert read_records(cli).manifest["provenance"]["denoiser"] == str(files["dncnn"])
    assert "denoiser" not in read_records(alone).manifest["identity"]


def grid_digits():
    """The digits on the 8-bit grid, as the sound discrete Gaussian needs them."""
    digits = load_dataset("digits", "test")
    x = torch.round(digits.images.float() / 16.0 * 255) / 255
    return torch.utils.data.TensorDataset(x, digits.labels)


@pytest.mark.parametrize("certifier, noise, options", [
    ("certify", "gaussian", {}),
    ("sequential", "gaussian", {"radii": "0,0.25"}),  # --n is n_max: first look 100
    ("certify", "discrete-gaussian", {}),
])
def test_diffusion_folder_through_every_kind_of_certifier(files, tmp_path, certifier, noise,
                                                          options):
    from smoothcert.denoisers import folder_sha256

    out = tmp_path / "r.tsv"
    run = {**PY_RUN, "n": 200}
    rows = certify_dataset(files["clf"], grid_digits(), **run, noise=noise,
                           certifier=certifier, options=options, out=out,
                           denoiser=f"diffusers:{files['ddpm']}")
    identity = read_records(out).manifest["identity"]
    assert identity["timestep"] == t_star() and identity["noise"] == noise
    assert identity["denoiser"] == folder_sha256(files["ddpm"])
    assert len(rows) == 3 and all(r["predict"] in range(-1, 10) for r in rows)
    first = timeless(out)
    again = certify_dataset(files["clf"], grid_digits(), **run, noise=noise,
                            certifier=certifier, options=options,
                            denoiser=f"diffusers:{files['ddpm']}")
    assert timeless(again) == first  # deterministic: (seed, idx) generators
    grown = certify_dataset(files["clf"], grid_digits(), **{**run, "max_count": 4}, noise=noise,
                            certifier=certifier, options=options, out=out,
                            denoiser=f"diffusers:{files['ddpm']}")  # resumes: same identity
    assert len(grown) == 4 and timeless(grown)[:3] == first


def test_resume_needs_the_same_denoiser(files, tmp_path, capsys):
    out = tmp_path / "r.tsv"
    assert certify(files["clf"], "--denoiser", files["dncnn"], "--out", out, max_count=2) == 0
    before = out.read_bytes()
    for other in (["--denoiser", f"diffusers:{files['ddpm']}"], []):
        assert certify(files["clf"], *other, "--out", out) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "differs in: denoiser" in err, err
        assert out.read_bytes() == before
    assert certify(files["clf"], "--denoiser", files["dncnn"], "--out", out) == 0  # --max 3
    grown = timeless(out)
    assert len(grown) == 3 and out.read_bytes().startswith(before)
    fresh = tmp_path / "fresh.tsv"
    assert certify(files["clf"], "--denoiser", files["dncnn"], "--out", fresh) == 0
    assert timeless(fresh) == grown


def test_identity_omits_the_denoiser_fields_when_there_is_none():
    base = dict(certifier="certify", checkpoint_sha256="0" * 64, dataset="digits",
                split="test", sigma=SIGMA, n=10, alpha=0.001, batch=5, seed=0, n0=5)
    plain = run_identity(RunConfig(**base))
    assert "denoiser" not in plain and "timestep" not in plain
    behind = run_identity(RunConfig(**base, denoiser="folder:ab", timestep=12))
    assert behind == {**plain, "denoiser": "folder:ab", "timestep": 12}
    assert RunConfig(**behind, batch=7) == \
        RunConfig(**{**base, "batch": 7}, denoiser="folder:ab", timestep=12)  # read back
    with pytest.raises(SmoothcertError, match="pass its denoiser"):
        RunConfig(**base, timestep=3)
    with pytest.raises(SmoothcertError, match="timestep"):
        RunConfig(**base, denoiser="folder:ab", timestep=-1)


def test_data_dependent_sigma_runs_behind_a_trained_denoiser_not_a_diffusion_one(files,
                                                                                 tmp_path):
    options = {"num_steps": 2, "num_samples": 4}
    rows = certify_dataset(files["clf"], load_dataset("digits", "test"), **PY_RUN,
                           certifier="data-dependent", options=options,
                           denoiser=str(files["dncnn"]))
    assert len(rows) == 3 and any(r["sigma"] != SIGMA for r in rows)
    out = tmp_path / "dd.tsv"
    with pytest.raises(SmoothcertError, match="own sigma.*diffusion denoiser"):
        certify_dataset(files["clf"], load_dataset("digits", "test"), **PY_RUN,
                        certifier="data-dependent", options=options, out=out,
                        denoiser=f"diffusers:{files['ddpm']}")
    assert not list(tmp_path.iterdir())


def test_a_diffusion_denoiser_built_for_another_sigma_is_refused(files, tmp_path):
    from smoothcert.denoisers import DiffusionDenoiser

    classifier, _ = model_from_checkpoint(files["clf"])
    other = DiffusionDenoiser.from_pretrained(files["ddpm"], sigma=0.5)
    with pytest.raises(SmoothcertError, match="built for sigma 0.5"):
        certify_dataset(Denoised(other, classifier), load_dataset("digits", "test"), **PY_RUN,
                        out=tmp_path / "r.tsv")
    assert not list(tmp_path.iterdir())
    same = DiffusionDenoiser.from_pretrained(files["ddpm"], sigma=SIGMA)
    rows = certify_dataset(Denoised(same, classifier), load_dataset("digits", "test"),
                           **PY_RUN, out=tmp_path / "r.tsv")
    assert read_records(tmp_path / "r.tsv").manifest["identity"]["timestep"] == t_star()
    cli = tmp_path / "cli.tsv"
    assert certify(files["clf"], "--denoiser", f"diffusers:{files['ddpm']}", "--out", cli) == 0
    assert timeless(cli) == timeless(rows)


def test_a_denoised_module_and_a_denoiser_are_not_both_taken(files):
    classifier, _ = model_from_checkpoint(files["clf"])
    denoiser, _ = model_from_checkpoint(files["dncnn"])
    with pytest.raises(SmoothcertError, match="holds its denoiser already"):
        certify_dataset(Denoised(denoiser, classifier), load_dataset("digits", "test"),
                        **PY_RUN, denoiser=denoiser)


def test_the_classifier_may_take_another_size(files, tmp_path):
    """A 28×28 LeNet behind an 8×8 DnCNN: Denoised resizes the denoised digits to 28×28."""
    lenet = write_checkpoint(tmp_path / "lenet.pt", arch="lenet", input_shape=(1, 28, 28))
    rows = certify_dataset(str(lenet), load_dataset("digits", "test"), **PY_RUN,
                           denoiser=str(files["dncnn"]))
    assert len(rows) == 3


def test_a_classifier_trained_without_noise_needs_sigma(files, tmp_path, capsys):
    from smoothcert.models.checkpoint import save_checkpoint

    model, meta = model_from_checkpoint(files["clf"])
    standard = save_checkpoint(tmp_path / "standard.pt", model,
                               {**meta, "noise": None, "method": {"name": "standard"}})
    out = tmp_path / "r.tsv"
    assert certify(standard, "--denoiser", files["dncnn"], "--out", out, sigma=None) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trained without noise; pass --sigma" in err, err
    assert not out.exists()
    assert certify(standard, "--denoiser", files["dncnn"], "--out", out) == 0
    assert np.all(read_records(out)["sigma"] == SIGMA)


def test_report_reads_a_denoised_record_file_with_the_usual_columns(files, tmp_path, capsys):
    plain, behind = tmp_path / "plain.tsv", tmp_path / "behind.tsv"
    assert certify(files["clf"], "--out", plain) == 0
    assert certify(files["clf"], "--denoiser", f"diffusers:{files['ddpm']}", "--out",
                   behind) == 0
    assert read_records(plain).columns_order == read_records(behind).columns_order
    capsys.readouterr()
    assert main(["report", str(plain), "--format", "csv"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert main(["report", str(behind), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == header
    manifest = json.loads((tmp_path / "behind.tsv.manifest.json").read_text())
    assert manifest["provenance"]["denoiser"] == f"diffusers:{files['ddpm']}"


def test_engine_accelerations_apply_to_the_denoiser_and_the_classifier(files):
    classifier, _ = model_from_checkpoint(files["clf"])
    denoiser, _ = model_from_checkpoint(files["dncnn"])
    convs = [m.weight for m in (*denoiser.modules(), *classifier.modules())
             if isinstance(m, torch.nn.Conv2d) and m.in_channels > 1]  # 1 channel: both formats
    nhwc = [w.is_contiguous(memory_format=torch.channels_last) for w in convs]
    assert len(convs) >= 3 and not any(nhwc)
    rows = certify_dataset(Denoised(denoiser, classifier), load_dataset("digits", "test"),
                           **PY_RUN, engine={"channels_last": True, "precision": "bf16"})
    assert len(rows) == 3  # the engine converted both modules' weights, in place
    assert all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
