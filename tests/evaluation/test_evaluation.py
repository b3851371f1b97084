"""Evaluation from records (Sun et al. 2024's recommendations): the σ-envelope, the p̂_A ECDF, and
the easy/hard gradient norms of a method's loss (closed form on a linear model, and the CLI)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch
from torch import nn

from conftest import COHEN_ROWS, GRID
from smoothcert import Gaussian
from smoothcert.cli.app import main
from smoothcert.evaluation.analysis import (
    easy_hard,
    easy_hard_table,
    gradient_norms,
    label_frequency,
)
from smoothcert.evaluation.metrics import (
    certified_accuracy,
    certified_accuracy_envelope,
    ecdf,
    envelope_curve,
    pa_ecdf,
    pa_hat,
)
from smoothcert.evaluation.report import report
from smoothcert.evaluation.tables import get_format
from smoothcert.methods import build_method
from smoothcert.models import build_model
from smoothcert.models.checkpoint import save_checkpoint, versions
from smoothcert.runs.records import read_records

pytestmark = pytest.mark.usefixtures("one_thread")


COHEN_HEADER = ("idx", "label", "predict", "radius", "correct", "time")
# A second file, crossing the first (conftest: CA = 5/8, 4/8, 3/8, 2/8, 1/8, 0 at GRID):
# correct r=1.3, wrong (predict 5) r=0.9, abstain, correct r=0.1 → CA = 2/4, 1/4, 1/4, 1/4,
# 1/4, 1/4 at GRID. Envelope by hand: max of the two at each radius.
OTHER_ROWS = [
    (0, 1, 1, 1.3, 1, "0:00:01"),
    (1, 4, 5, 0.9, 0, "0:00:01"),
    (2, 3, -1, 0.0, 0, "0:00:01"),
    (3, 2, 2, 0.1, 1, "0:00:01"),
]
ENVELOPE = [0.625, 0.5, 0.375, 0.25, 0.25, 0.25]
# report's envelope needs files of the same examples (--common: idx 0..3, where the first file
# has CA = 2/4, 2/4, 1/4, 0, 0, 0 at GRID): the max of the two there.
ENVELOPE_COMMON = [0.5, 0.5, 0.25, 0.25, 0.25, 0.25]

OURS_HEADER = ("idx", "label", "predict", "radius", "correct", "time", "p_lower", "nA", "n0", "n",
               "alpha", "sigma", "seed")
# p̂_A of the true label, by hand: correct → nA/n; wrong class → 1 − nA/n; abstain → nA/n.
OURS_ROWS = [
    (0, 1, 1, 0.5, 1, 0.1, 0.88, 900, 100, 1000, 0.001, 0.25, 0),  # 0.9
    (1, 2, 2, 0.05, 1, 0.1, 0.56, 600, 100, 1000, 0.001, 0.25, 0),  # 0.6
    (2, 3, -1, 0.0, 0, 0.1, 0.41, 450, 100, 1000, 0.001, 0.25, 0),  # 0.45
    (3, 4, 5, 0.2, 0, 0.1, 0.77, 800, 100, 1000, 0.001, 0.25, 0),  # 0.2
    (4, 0, 0, 0.9, 1, 0.1, 0.999, 1000, 100, 1000, 0.001, 0.25, 0),  # 1.0
]
PA = [0.9, 0.6, 0.45, 0.2, 1.0]


def write_tsv(path, header, rows):
    lines = ["\t".join(header)] + ["\t".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def certify_files(tmp_path):
    return (write_tsv(tmp_path / "sigma_0.25.tsv", COHEN_HEADER, COHEN_ROWS),
            write_tsv(tmp_path / "sigma_0.5.tsv", COHEN_HEADER, OTHER_ROWS))


# --------------------------------------------------------------------------- σ-envelope
def test_envelope_is_the_per_radius_max_by_hand(certify_files):
    records = [read_records(p) for p in certify_files]
    np.testing.assert_allclose(certified_accuracy_envelope(records, GRID), ENVELOPE)
    rows = list(csv.DictReader(io.StringIO(report(certify_files, GRID, fmt="csv",
                                                  envelope=True, common=True))))
    assert [r["name"] for r in rows] == ["sigma_0.25", "sigma_0.5", "envelope"]
    env = rows[-1]
    assert env["n"] == env["abstention_rate"] == env["acr"] == ""
    assert float(env["clean_accuracy"]) == pytest.approx(0.5)
    got = [float(env[f"r={r:g}"]) for r in GRID]
    np.testing.assert_allclose(got, ENVELOPE_COMMON)


def test_envelope_curve_is_exact_between_breakpoints(certify_files):
    records = [read_records(p) for p in certify_files]
    breaks, values = envelope_curve(records)
    probe = np.linspace(0, 1.4, 57)
    # value on (breaks[i-1], breaks[i]] is values[i]; 0 past the last breakpoint
    i = np.searchsorted(breaks, probe)
    expected = np.where(i < len(breaks), values[np.minimum(i, len(values) - 1)], 0.0)
    by_hand = np.max([certified_accuracy(r, probe) for r in records], axis=0)
    np.testing.assert_allclose(expected, by_hand)


def test_envelope_in_the_md_table_and_the_plot(certify_files, tmp_path, capsys):
    plot = tmp_path / "env.png"
    assert main(["report", *map(str, certify_files), "--radii", "0,1", "--envelope",
                 "--common", "--plot", str(plot)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "| envelope | – | 50.0% | – | – | 50.0% | 25.0% |"
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_envelope_needs_certify_files(certify_files, tmp_path, capsys):
    pred = write_tsv(tmp_path / "pred.tsv", ("idx", "label", "predict", "correct", "time"),
                     [(0, 1, 1, 1, 0.5)])
    assert main(["report", str(certify_files[0]), str(pred), "--envelope"]) == 2
    assert "radius" in capsys.readouterr().err


# --------------------------------------------------------------------------- p̂_A ECDF
def test_pa_hat_and_ecdf_by_hand(tmp_path):
    rec = read_records(write_tsv(tmp_path / "ours.tsv", OURS_HEADER, OURS_ROWS))
    np.testing.assert_allclose(pa_hat(rec), PA)
    np.testing.assert_allclose(ecdf(PA, [0.0, 0.2, 0.44, 0.5, 0.6, 0.95, 1.0]),
                               [0, 1 / 5, 1 / 5, 2 / 5, 3 / 5, 4 / 5, 1])
    points, cdf = pa_ecdf(rec)
    np.testing.assert_allclose(points, [0.2, 0.45, 0.6, 0.9, 1.0])
    np.testing.assert_allclose(cdf, [0.2, 0.4, 0.6, 0.8, 1.0])
    # easy/hard split of the paper: P(p̂_A ≥ ½) is the clean accuracy here (3/5)
    assert np.mean(pa_hat(rec) >= 0.5) == pytest.approx(3 / 5)


def test_ecdf_plot_is_written_and_needs_counts(tmp_path, certify_files, capsys):
    ours = write_tsv(tmp_path / "ours.tsv", OURS_HEADER, OURS_ROWS)
    image = tmp_path / "ecdf.png"
    assert main(["report", str(ours), "--ecdf", str(image)]) == 0
    assert image.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    missing = tmp_path / "none.png"
    assert main(["report", str(ours), str(certify_files[0]), "--ecdf", str(missing)]) == 2
    assert "nA" in capsys.readouterr().err and not missing.exists()


# --------------------------------------------------------------------------- gradient norms
def linear_problem():
    """A linear 3-class model on 2×2 inputs, 6 inputs: 3 it classifies as their label
    (easy: p̂_A = 1 under σ = 1e-6) and 3 it does not (hard: p̂_A = 0)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    x = torch.rand(6, 1, 2, 2, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        predicted = model(x).argmax(dim=1)
    y = torch.where(torch.arange(6) < 3, predicted, (predicted + 1) % 3)
    return model, x, y


def ce_gradient_norm(model, x, y):
    """‖∇_(W,b) CE(Wx + b, y)‖₂ by hand: ∇W = (p − e_y) xᵀ, ∇b = p − e_y, so the norm is
    ‖p − e_y‖₂ · √(‖x‖² + 1)."""
    linear = model[1]
    with torch.no_grad():
        p = torch.softmax(linear(x.flatten()), dim=0).double()
    residual = p - torch.nn.functional.one_hot(torch.tensor(y), 3).double()
    return float(residual.norm() * (x.double().flatten().norm() ** 2 + 1).sqrt())


def test_grad_norms_of_gaussian_ce_on_a_linear_model_by_hand():
    model, x, y = linear_problem()
    noise = Gaussian(1e-6)  # the CE is evaluated at x + δ with ‖δ‖ ~ 1e-6: tolerance 1e-4
    method = build_method("gaussian")
    result = gradient_norms(model, method, noise, x, y, n=50, num_classes=3, seed=3)
    np.testing.assert_array_equal(result.p_hat, [1, 1, 1, 0, 0, 0])
    by_hand = np.array([ce_gradient_norm(model, xi, int(yi)) for xi, yi in zip(x, y)])
    np.testing.assert_allclose(result.norms, by_hand, rtol=1e-4)
    summary = easy_hard(result)
    assert (summary.easy_count, summary.hard_count, summary.ties) == (3, 3, 0)
    assert summary.easy_mean == pytest.approx(by_hand[:3].mean(), rel=1e-4)
    assert summary.hard_mean == pytest.approx(by_hand[3:].mean(), rel=1e-4)
    assert summary.ratio == pytest.approx(by_hand[:3].mean() / by_hand[3:].mean(), rel=1e-4)
    assert not any(p.grad is not None for p in model.parameters())  # nothing accumulated
    text = get_format("md")(easy_hard_table(summary))
    assert f"| easy | > 0.5 | 3 | {summary.easy_mean:.3f} |" in text


def test_label_frequency_and_seeds_per_example():
    model, x, y = linear_problem()
    noise = Gaussian(0.5)
    gen = torch.Generator().manual_seed(0)
    p = label_frequency(model, x[0], int(y[0]), noise, 400, 3, 100, gen)
    assert 0 < p < 1 and p * 400 == int(p * 400)
    method = build_method("gaussian", num_noise=2)
    full = gradient_norms(model, method, noise, x, y, n=40, num_classes=3, seed=7)
    part = gradient_norms(model, method, noise, x[2:4], y[2:4], n=40, num_classes=3, seed=7,
                          idx=[2, 3])  # the same examples alone: the same draws
    np.testing.assert_array_equal(part.p_hat, full.p_hat[2:4])
    np.testing.assert_array_equal(part.norms, full.norms[2:4])


def write_digits_checkpoint(path, method="gaussian"):
    model = build_model("digits_cnn", 10, (1, 8, 8), [0.5], [0.5])
    meta = {"arch": "digits_cnn", "dataset": "digits", "num_classes": 10,
            "input_shape": [1, 8, 8], "mean": [0.5], "std": [0.5],
            "noise": {"name": "gaussian", "sigma": 0.25},
            "method": {"name": method, "hparams": {}}, "epoch": 1,
            "versions": versions(), "config": {"epochs": 1}}
    save_checkpoint(path, model, meta)
    return path


@pytest.mark.parametrize("extra", [
    [],
    ["--method", "macer", "--param", "num_noise=2"],
    ["--method", "heat", "--param", "num_projections=2", "--param", "num_steps=1"],
])
def test_grad_norms_cli_on_a_digits_checkpoint(tmp_path, capsys, extra):
    ckpt = write_digits_checkpoint(tmp_path / "ckpt.pt")
    assert main(["analyze", "grad-norms", str(ckpt), "--n", "10", "--max", "4", "--format",
                 "json", "--no-progress", "--device", "cpu", *extra]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["group"] for r in rows] == ["easy", "hard", "easy/hard"]
    assert rows[0]["count"] + rows[1]["count"] <= 4
    means = [r["mean_grad_norm"] for r in rows[:2] if r["count"]]
    assert means and all(m > 0 for m in means)


@pytest.mark.parametrize("extra,match", [
    (["--method", "nope"], "unknown method"),
    (["--param", "lbd=-1", "--method", "macer"], "lbd"),
    (["--n", "0"], "n must"),
    (["--split", "validation"], "invalid choice"),
])
def test_grad_norms_bad_input(tmp_path, capsys, extra, match):
    ckpt = write_digits_checkpoint(tmp_path / "ckpt.pt")
    assert main(["analyze", "grad-norms", str(ckpt), "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err, err
