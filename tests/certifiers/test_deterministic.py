"""The deterministic certifier (CERTIFY with the clean prediction; Campbell et al.) against the
halfspace oracle, a model whose clean prediction is not the noisy majority, the guarantee's
failure rate, and every certifier of this step end to end through the CLI."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import binom, norm

from conftest import Halfspace, write_checkpoint
from smoothcert import Gaussian, SmoothcertError, Smoothed, clopper_pearson_lower
from smoothcert.certifiers.deterministic import certify_deterministic
from smoothcert.cli.app import main
from smoothcert.runs.records import read_records


def point(d):
    """A 2-D input at signed distance d from the hyperplane x₀ = 0 (shape (1, 1, 2))."""
    return torch.tensor([d, 0.3]).reshape(1, 1, 2)


def halfspace(sigma):
    return Smoothed(Halfspace((1.0, 0.0), input_shape=(1, 1, 2)), Gaussian(sigma), num_classes=2)


class Slab(torch.nn.Module):
    """Class 1 inside the slab |x₀| < width, class 0 outside: under N(0, σ²) noise at x₀ = 0,
    P(class 1) = 2Φ(width/σ) − 1, so the clean prediction (1) is a small noisy minority."""

    input_shape = (1, 1, 2)

    def __init__(self, width):
        super().__init__()
        self.width = width

    def forward(self, x):
        inside = (x.flatten(1)[:, 0].abs() < self.width).float()
        return torch.stack([1 - inside, inside], dim=1)


def test_prediction_is_the_clean_class_even_where_the_noisy_majority_disagrees():
    sigma, width, n = 0.5, 0.05, 5000
    smoothed = Smoothed(Slab(width), Gaussian(sigma), num_classes=2)
    x = point(0.0)
    p_clean = 2 * norm.cdf(width / sigma) - 1  # ≈ 0.08: P(f(x + δ) = clean class)
    cert = certify_deterministic(smoothed, x, n, 0.001, 1000, torch.Generator().manual_seed(0))
    # the counted class is the clean one (1), not the majority (0): its count is ≈ n·p_clean
    assert abs(cert.count - n * p_clean) < 4 * math.sqrt(n * p_clean * (1 - p_clean))
    assert cert.abstained and cert.prediction is None and cert.radius == 0.0 and cert.n0 == 0
    # Cohen's CERTIFY selects the noisy majority and certifies it
    cohen = smoothed.certify(x, 100, n, 0.001, 1000, torch.Generator().manual_seed(0))
    assert cohen.prediction == 0 and cohen.radius > 0


@pytest.mark.parametrize("d", [0.3, -0.3])
def test_halfspace_radius_approaches_the_distance_from_below(d):
    sigma = 0.5
    cert = certify_deterministic(halfspace(sigma), point(d), 200_000, 0.001, 10_000,
                                 torch.Generator().manual_seed(1))
    assert cert.prediction == int(d > 0) and cert.n0 == 0 and cert.n == 200_000
    assert cert.p_lower <= norm.cdf(abs(d) / sigma)
    assert abs(d) - 0.02 < cert.radius <= abs(d)
    assert cert.radius == pytest.approx(sigma * norm.ppf(cert.p_lower), rel=1e-12)
    assert cert.p_lower == clopper_pearson_lower(cert.count, cert.n, 0.001)


def test_rate_of_overclaimed_radii_is_at_most_alpha():
    """Over 2,000 seeded trials at a boundary case, P(radius > true radius) stays ≤ α.

    The clean class is 1 (d > 0) in every trial, so the radius exceeds d exactly when the CP
    bound exceeds p_A = Φ(d/σ): the failure probability is Σ_k P(Bin(n, p_A) = k)·[CP(k) > p_A].
    The empirical rate must match it within 4 standard errors, and it is ≤ α by the guarantee
    (α = 0.1 so that failures are observable).
    """
    sigma, d, n, alpha, trials = 1.0, 0.5, 50, 0.1, 2000
    p_a = norm.cdf(d / sigma)
    model = halfspace(sigma)
    over = 0
    for t in range(trials):
        g = torch.Generator().manual_seed(20_000 + t)
        cert = certify_deterministic(model, point(d), n, alpha, 64, g)
        assert cert.abstained or cert.prediction == 1
        over += (not cert.abstained) and cert.radius > d
    ks = np.arange(n + 1)
    exact = binom.pmf(ks, n, p_a)[clopper_pearson_lower(ks, n, alpha) > p_a].sum()
    assert 0.01 < exact <= alpha  # a case where the guarantee is nearly tight
    rate, se = over / trials, math.sqrt(exact * (1 - exact) / trials)
    assert abs(rate - exact) <= 4 * se + 1e-3
    assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / trials)


def test_same_seed_same_certificate_mode_restored_and_bad_input_refused():
    model = halfspace(0.5)
    model.model.train()
    a = certify_deterministic(model, point(0.2), 500, 0.01, 64, torch.Generator().manual_seed(5))
    b = certify_deterministic(model, point(0.2), 500, 0.01, 64, torch.Generator().manual_seed(5))
    assert a == b and model.model.training
    with pytest.raises(SmoothcertError, match="n must"):
        certify_deterministic(model, point(0.2), 0, 0.01, 64)
    with pytest.raises(SmoothcertError, match="alpha"):
        certify_deterministic(model, point(0.2), 10, 1.0, 64)
    with pytest.raises(SmoothcertError, match="input shape"):
        certify_deterministic(model, torch.zeros(1, 2, 2), 10, 0.01, 64)


# --------------------------------------------------------------------------- through the CLI
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "checkpoint.pt", method="heat")


def run(checkpoint, out, certifier, *extra):
    return main(["certify", str(checkpoint), "--certifier", certifier, "--n0", "16", "--n", "64",
                 "--batch", "32", "--max", "3", "--out", str(out), "--no-progress",
                 "--device", "cpu", *extra])


CLI_CASES = {
    "deterministic": ("deterministic", ()),
    "lbound": ("lbound", ()),
    "lbound-draws-top": ("lbound", ("--opt", "select=draws", "--opt", "bound=top")),
    "lbound-heuristic": ("lbound-heuristic", ()),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_every_certifier_runs_end_to_end_through_the_cli(case, checkpoint, tmp_path):
    certifier, extra = CLI_CASES[case]
    out = tmp_path / "r.tsv"
    assert run(checkpoint, out, certifier, *extra) == 0
    rec = read_records(out)
    assert list(rec["idx"]) == [0, 1, 2]
    assert rec.columns_order[:6] == ("idx", "label", "predict", "radius", "correct", "time")
    assert rec.manifest["identity"]["certifier"] == certifier
    assert np.all(rec["radius"] >= 0) and np.all((rec["predict"] == -1) <= (rec["radius"] == 0))
    if certifier == "deterministic":
        assert np.all(rec["n0"] == 0) and np.all(rec["n"] == 64) and "p_lower" in rec
    elif certifier == "lbound":
        assert set(rec["guarantee"]) == {"confidence"}
        assert np.all(rec["n0"] == (16 if "select=draws" in extra else 0))
        assert set(rec["bound"]) == {"top" if "bound=top" in extra else "pairwise"}
        assert np.all(rec["gap_lower"] <= rec["p_top"] - rec["p_runner_up"])
    else:
        assert set(rec["guarantee"]) == {"heuristic"}
        assert np.allclose(rec["radius"], 0.25 * math.sqrt(math.pi / 2)
                           * (rec["p_top"] - rec["p_runner_up"]), rtol=1e-12)
    assert run(checkpoint, out, certifier, *extra) == 0  # a rerun resumes: nothing to add
    assert len(read_records(out)) == 3


def test_bad_lbound_option_is_one_line_exit_2(checkpoint, tmp_path, capsys):
    assert run(checkpoint, tmp_path / "b.tsv", "lbound", "--opt", "bound=bernstein") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pairwise, top, none" in err, err
