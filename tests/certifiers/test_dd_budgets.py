"""Data-dependent σ at the papers' budgets: the ``preset`` (paper / package) and ``clamp``
options of the data-dependent certifier, how they enter a run's identity, and the σ_x columns
and histogram of ``smoothcert report``."""

import csv
import io

import numpy as np
import pytest
import torch
from scipy.stats import norm

from conftest import Halfspace, write_checkpoint
from smoothcert.cli.app import main
from smoothcert.errors import SmoothcertError
from smoothcert.evaluation.metrics import certified_agreement
from smoothcert.runs import RunConfig
from smoothcert.runs.records import read_records
from smoothcert.smoothing import sigma_optimization as dd

RUN = ["--n0", "10", "--n", "100", "--batch", "50", "--max", "4", "--no-progress",
       "--device", "cpu"]
SMALL = ["--opt", "preset=package", "--opt", "num_steps=3", "--opt", "num_samples=2"]
SIGMA = 0.25  # the checkpoint's σ, where OptimizeSigma starts


def config(**options):
    return RunConfig(certifier="data-dependent", checkpoint_sha256="0" * 64, dataset="digits",
                     split="test", sigma=SIGMA, n=10, alpha=0.01, batch=10, seed=0, n0=10,
                     options=options)


# --------------------------------------------------------------------------- options → identity
def test_package_preset_resolves_to_the_package_defaults():
    # the authors' ddsmoothing package (commit 3a06e82): scripts/run_optimization_dataset.py
    # --iterations 900 (lines 46-49), --learning-rate 0.04 (54-57), --num-samples 100 (58-61);
    # ddsmoothing/certificate.py clamp_(0.001, 0.999) (lines 64-66)
    assert (dd.PACKAGE_NUM_STEPS, dd.PACKAGE_STEP_SIZE, dd.PACKAGE_NUM_SAMPLES,
            dd.PACKAGE_CLAMP) == (900, 0.04, 100, (0.001, 0.999))
    assert config(preset="package").options == {
        "num_steps": dd.PACKAGE_NUM_STEPS, "step_size": dd.PACKAGE_STEP_SIZE,
        "num_samples": dd.PACKAGE_NUM_SAMPLES, "memory": True,
        "clamp": list(dd.PACKAGE_CLAMP), "preset": "package"}
    # the paper's budget keeps the identity of the runs from before presets (they resume)
    assert config().options == config(preset="paper").options == {
        "num_steps": dd.NUM_STEPS, "step_size": dd.STEP_SIZE, "num_samples": dd.NUM_SAMPLES,
        "memory": True}


def test_explicit_options_override_the_preset():
    got = config(preset="package", num_steps=3, step_size=1, clamp="0.1, 0.9").options
    assert got == {"num_steps": 3, "step_size": 1.0, "num_samples": dd.PACKAGE_NUM_SAMPLES,
                   "memory": True, "clamp": [0.1, 0.9], "preset": "package"}
    paper = config(num_steps=900, clamp=[0.001, 0.999]).options  # K = 900 at α_σ = 1e-4
    assert paper["num_steps"] == 900 and paper["step_size"] == dd.STEP_SIZE
    assert paper["clamp"] == [0.001, 0.999] and paper["preset"] == "paper"
    again = config(**got).options  # the identity rebuilds the same certifier
    assert again == got


def test_identity_differs_between_presets():
    same_numbers = {"num_steps": 3, "step_size": 0.04, "num_samples": 2,
                    "clamp": "0.001,0.999"}
    assert config(preset="package", **same_numbers).options \
        != config(preset="paper", **same_numbers).options
    with pytest.raises(SmoothcertError, match="unknown preset 'authors'; known: package, paper"):
        config(preset="authors")


def test_nine_hundred_steps_run_uncapped():
    """K = 900 at the paper's α_σ = 1e-4 runs all its steps: on the halfspace softmax(±10·x₀)
    at distance 2, every draw has ψ_A > 0.98 (it would take δ < −1.8, over 6σ for σ ≤ 0.29),
    so ψ is clamped to (0.98, 0.02), the soft radius is σ·Φ⁻¹(0.98) and each step adds exactly
    α_σ·Φ⁻¹(0.98): σ_K = σ0 + K·α_σ·Φ⁻¹(0.98)."""
    model = Halfspace((10.0, 0.0), input_shape=(1, 1, 2))
    x = torch.tensor([2.0, 0.3]).reshape(1, 1, 1, 2)
    for k in (100, 900):
        sigma = dd.optimize_sigma(model, x, 0.1, num_steps=k, step_size=dd.STEP_SIZE,
                                  generator=torch.Generator().manual_seed(0))
        expected = 0.1 + k * dd.STEP_SIZE * norm.ppf(dd.CLAMP[1])
        assert float(sigma[0]) == pytest.approx(expected, rel=1e-4), k


# --------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A fixed-σ CERTIFY file and a data-dependent one (package preset, shrunk) of the same 4
    digits test images, with a tiny untrained model."""
    folder = tmp_path_factory.mktemp("budgets")
    checkpoint = write_checkpoint(folder / "checkpoint.pt")
    fixed, dependent = folder / "fixed.tsv", folder / "dd.tsv"
    assert main(["certify", str(checkpoint), *RUN, "--out", str(fixed)]) == 0
    assert main(["certify", str(checkpoint), "--certifier", "data-dependent", *RUN, *SMALL,
                 "--out", str(dependent)]) == 0
    return checkpoint, fixed, dependent


def dd_certify(checkpoint, out, *options):
    return main(["certify", str(checkpoint), "--certifier", "data-dependent", *RUN, *options,
                 "--out", str(out)])


def test_package_run_records_sigma_x_and_its_resolved_budget(runs):
    _, _, dependent = runs
    rec = read_records(dependent)
    assert np.all(rec["sigma"] > 0) and np.all(rec["sigma"] != SIGMA)  # σ_x, not the run's σ
    assert rec.manifest["identity"]["options"] == {
        "num_steps": 3, "step_size": 0.04, "num_samples": 2, "memory": True,
        "clamp": [0.001, 0.999], "preset": "package"}
    assert "adjusted" in rec and set(rec["adjusted"]) <= {0, 1}


def test_the_clamp_reaches_optimize_sigma(runs, tmp_path):
    """The untrained model's mean softmax has top-2 entries near 0.12 (< 0.2): clamped to
    [0.2, 0.8] both sit at 0.2, the soft radius is 0 with zero gradient, and σ_x stays σ."""
    checkpoint, _, _ = runs
    out = tmp_path / "clamped.tsv"
    assert dd_certify(checkpoint, out, *SMALL, "--opt", "clamp=0.2,0.8") == 0
    assert np.all(read_records(out)["sigma"] == SIGMA)


def test_a_resume_with_another_preset_or_budget_is_refused(runs, tmp_path, capsys):
    checkpoint, _, dependent = runs
    out = tmp_path / "dd.tsv"
    out.write_bytes(dependent.read_bytes())
    (tmp_path / "dd.tsv.manifest.json").write_bytes(
        dependent.with_name("dd.tsv.manifest.json").read_bytes())
    before = out.read_text()
    paper_same_numbers = ["--opt", "preset=paper", "--opt", "step_size=0.04", "--opt",
                          "num_steps=3", "--opt", "num_samples=2", "--opt", "clamp=0.001,0.999"]
    for options in (paper_same_numbers, [*SMALL, "--opt", "num_steps=4"]):
        assert dd_certify(checkpoint, out, *options) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "differs in: options" in err
    assert dd_certify(checkpoint, out, *SMALL) == 0  # the same run: nothing left to do
    assert out.read_text() == before


@pytest.mark.parametrize("clamp", ["0.5,0.2", "0,1", "0.1", "low,high", "[0.1,0.9,0.95]"])
def test_bad_clamp_is_refused_in_one_line(runs, tmp_path, capsys, clamp):
    checkpoint, _, _ = runs
    assert dd_certify(checkpoint, tmp_path / "x.tsv", "--opt", f"clamp={clamp}") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "clamp must be two numbers low,high with 0 < low < high < 1" \
        in err
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- report
def test_report_sigma_columns_and_histogram(runs, tmp_path, capsys):
    _, fixed, dependent = runs
    image = tmp_path / "sigma.png"
    assert main(["report", str(fixed), str(dependent), "--format", "csv", "--radii", "0",
                 "--sigma-hist", str(image)]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["name"] for r in rows] == ["fixed", "dd"]
    sigma = read_records(dependent)["sigma"]
    got = [float(rows[1][k]) for k in ("sigma_min", "sigma_mean", "sigma_max")]
    assert got == [float(np.min(sigma)), pytest.approx(float(np.mean(sigma)), rel=1e-12),
                   float(np.max(sigma))]
    assert got[0] < got[2]
    assert [float(rows[0][k]) for k in ("sigma_min", "sigma_mean", "sigma_max")] == [SIGMA] * 3
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 1000
    assert main(["report", str(fixed), "--format", "csv", "--radii", "0"]) == 0
    assert "sigma_min" not in capsys.readouterr().out  # one σ everywhere: the table as before


def test_latex_header_of_the_sigma_columns(runs, capsys):
    _, fixed, dependent = runs
    assert main(["report", str(fixed), str(dependent), "--format", "latex", "--radii", "0"]) == 0
    assert r"$\sigma_x$ min & $\sigma_x$ mean & $\sigma_x$ max \\" in capsys.readouterr().out


def test_sigma_hist_of_a_file_without_sigma_is_one_line(runs, tmp_path, capsys):
    _, fixed, _ = runs
    cohen = tmp_path / "cohen.tsv"
    cohen.write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\t0.5\t1\t0.1\n")
    image = tmp_path / "sigma.png"
    assert main(["report", str(fixed), str(cohen), "--sigma-hist", str(image)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--sigma-hist needs a sigma column" in err
    assert not image.exists()
    assert main(["report", str(fixed), str(fixed), "--agreement", "--sigma-hist",
                 str(image)]) == 2
    assert "--sigma-hist does not apply to --agreement" in capsys.readouterr().err


def test_agreement_of_a_fixed_sigma_file_and_a_data_dependent_one(runs, capsys):
    """Paired per-image gains and losses: the data-dependent file writes its rows in the order
    it certified them, the fixed-σ one by idx; they are paired by idx."""
    _, fixed, dependent = runs
    assert main(["report", str(fixed), str(dependent), "--agreement", "--radii", "0,0.1",
                 "--format", "csv"]) == 0
    (row,) = csv.DictReader(io.StringIO(capsys.readouterr().out))
    a, b = read_records(fixed), read_records(dependent)
    expected = certified_agreement(a, b, (0.0, 0.1))
    assert (row["first"], row["second"], int(row["n"])) == ("fixed", "dd", 4)
    assert [row["r=0"], row["r=0.1"]] == [f"{f}/{s}" for f, s in
                                          zip(expected.first_only, expected.second_only)]
    by_idx = {int(i): (c, r) for i, c, r in zip(b["idx"], b["correct"], b["radius"])}
    gains = sum(1 for i, c, r in zip(a["idx"], a["correct"], a["radius"])
                if not (c and r >= 0.0) and by_idx[int(i)][0])
    assert expected.second_only[0] == gains


def test_common_compares_files_on_their_shared_examples(runs, tmp_path, capsys):
    """A file of the first 2 images against one of 4: --common reports both on those 2, and the
    longer file's row equals its own 2-image prefix; --agreement --common pairs them too."""
    checkpoint, fixed, dependent = runs
    short = tmp_path / "short.tsv"
    assert dd_certify(checkpoint, short, *SMALL, "--max", "2") == 0
    capsys.readouterr()
    assert main(["report", str(fixed), str(short), "--format", "csv", "--radii", "0,0.1"]) == 0
    assert [r["n"] for r in csv.DictReader(io.StringIO(capsys.readouterr().out))] == ["4", "2"]
    assert main(["report", str(fixed), str(short), "--common", "--format", "csv",
                 "--radii", "0,0.1"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["n"] for r in rows] == ["2", "2"]
    prefix = tmp_path / "prefix.tsv"
    assert main(["certify", str(checkpoint), *RUN[:-5], "--max", "2", "--no-progress",
                 "--device", "cpu", "--out", str(prefix)]) == 0
    capsys.readouterr()
    assert main(["report", str(prefix), "--format", "csv", "--radii", "0,0.1"]) == 0
    (alone,) = csv.DictReader(io.StringIO(capsys.readouterr().out))
    assert {k: rows[0][k] for k in alone if k != "name"} == {
        k: v for k, v in alone.items() if k != "name"}
    assert main(["report", str(fixed), str(short), "--agreement", "--radii", "0"]) == 2
    capsys.readouterr()
    assert main(["report", str(fixed), str(short), "--agreement", "--common", "--format", "csv",
                 "--radii", "0"]) == 0
    (pair,) = csv.DictReader(io.StringIO(capsys.readouterr().out))
    assert pair["n"] == "2"
