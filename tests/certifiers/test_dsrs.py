"""The dsrs certifier (Li et al. 2022): statistical soundness on the worst classifier with an
unsound control, Q's sampler against its law, the records through the runner, the CLI."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from conftest import Halfspace, write_checkpoint
from smoothcert.certifiers import CERTIFIERS
from smoothcert.certifiers.dsrs import dsrs_certificate, heuristic_th, parse_th
from smoothcert.cli.app import main
from smoothcert.errors import SmoothcertError
from smoothcert.noise.dsrs_q import TruncatedGaussian
from smoothcert.runs import certify_dataset
from smoothcert.stats import clopper_pearson_lower
from smoothcert.stats.dsrs import ball, dsrs_radius, inner_mass

pytestmark = pytest.mark.filterwarnings(
    "ignore::smoothcert.smoothing.smoothed.InputRangeWarning")


def test_false_certificates_stay_below_alpha_and_the_unsound_controls_exceed_it():
    """The classifier that is worst for (p, q) = (0.6, 0.99), th 0.8, d 784: its exact radius
    along e₁ is DSRS's at the true (p, q) (test_dsrs_golden.py checks that classifier by quad),
    so a certificate beyond it is false. Counts are binomial draws (numpy, seed 0), 150 inputs
    of n_P = nq = 100 draws at α = 0.2. Tolerance: 3 binomial standard deviations above α.
    Here q·th > p, so the certificate rests on q_lower: the controls that take q̂ (Q's point
    estimate; with and without p's bound) certify past the truth about half the time."""
    p, q, th, d, n, alpha, trials = 0.6, 0.99, 0.8, 784, 100, 0.2, 150
    truth = dsrs_radius(p, q, 1.0, d, th)
    assert truth > 5 * stats.norm.ppf(p)  # Q carries the certificate
    rng = np.random.default_rng(0)
    pairs = list(zip(rng.binomial(n, p, trials), rng.binomial(n, q, trials)))
    sound = [dsrs_certificate(a, n, b, n, alpha, 0.5, 1.0, d, th).radius for a, b in pairs]
    q_hat = [dsrs_radius(clopper_pearson_lower(a, n, alpha / 2), b / n, 1.0, d, th)
             for a, b in pairs]
    limit = alpha + 3 * math.sqrt(alpha * (1 - alpha) / trials)
    assert np.mean(np.array(sound) > truth) <= limit
    assert np.mean(np.array(q_hat) > truth) > limit


def test_q_draws_follow_the_truncated_gaussian_and_its_halfspace_mass():
    sigma, th, shape, count = 0.5, 0.3, (1, 28, 28), 3000
    d = math.prod(shape)
    q = TruncatedGaussian(sigma, th)
    x = torch.full(shape, 0.25)
    out = torch.empty((count, *shape))
    q.perturb_(out, x, torch.Generator().manual_seed(0))
    delta = (out - x).flatten(1).double()
    sq = (delta.norm(dim=1) / sigma).pow(2).numpy()
    assert sq.max() <= ball(d, th) * (1 + 1e-5)  # inside the ball (float32 rounding)
    truncated = stats.kstest(sq, lambda v: stats.chi2.cdf(v, d) / th)
    assert truncated.pvalue > 0.01
    # P_Q(δ₁ < a) of the certificate's Q, against the draws (4 standard errors)
    a = -0.3
    law = inner_mass(a, d, th) / th
    seen = float((delta[:, 0] / sigma < a).double().mean())
    assert abs(seen - law) < 4 * math.sqrt(law * (1 - law) / count)
    again = torch.empty_like(out)
    q.perturb_(again, x, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)  # from the generator alone


def test_th_options_and_the_authors_heuristic():
    assert parse_th("0.25") == 0.25 and parse_th("x") == "x" and parse_th("x+") == "x+"
    assert CERTIFIERS["dsrs"](th=0.25).th == "0.25"  # a number, as YAML reads --opt th=0.25
    assert CERTIFIERS["dsrs"]().th == "x+"  # the authors' best, the default
    for bad in ("1.5", "0", "1", "x2", "nan", 1.5, True):
        with pytest.raises(SmoothcertError, match="th must be a percentile"):
            CERTIFIERS["dsrs"](th=bad)
    # th_heuristic.get_beta: 0.08·(−ln(1 − p) − 5) + 0.6, 0.5 below ½
    assert heuristic_th(0.99) == pytest.approx(0.08 * (-math.log(0.01) - 5) + 0.6)
    assert heuristic_th(0.4) == 0.5 and heuristic_th(1 - 1e-12) == 0.99
    with pytest.raises(SmoothcertError, match="q_share must be in"):
        CERTIFIERS["dsrs"](q_share=1.0)


def test_records_hold_both_bounds_and_never_fall_below_cohen():
    shape = (1, 28, 28)
    w = torch.zeros(shape)
    w[0, 0, 0] = 1.0
    xs = torch.zeros(3, *shape)
    xs[:, 0, 0, 0] = torch.tensor([0.9, 0.45, 0.21])
    data = torch.utils.data.TensorDataset(xs, (xs[:, 0, 0, 0] > 0.2).long())
    rows = certify_dataset(Halfspace(w, b=0.2, input_shape=shape), data, certifier="dsrs",
                           noise="gaussian", sigma=0.25, n0=20, n=1000, alpha=0.01,
                           batch=500, seed=1, num_classes=2, options={"th": "0.5"})
    assert set(CERTIFIERS["dsrs"].columns) <= set(rows[0])
    for row in rows:
        assert row["n"] + row["nq"] == 1000 or row["predict"] == -1
        assert row["radius"] >= row["radius_np"]
        assert row["radius"] == row["radius_l2"]
        if row["predict"] >= 0:  # the halfspace: never past the hyperplane
            assert row["radius"] <= abs(xs[row["idx"], 0, 0, 0].item() - 0.2) + 1e-9
            cohen = 0.25 * stats.norm.ppf(row["p_lower"])  # the walk stops 1e-4·σ short at most
            assert cohen - 0.25 * 2e-4 <= row["radius_np"] <= cohen
            assert row["q_lower"] > 0 and row["th"] == 0.5
    assert max(r["radius"] for r in rows) > 0


def test_cli_lists_dsrs_and_refuses_a_bad_threshold(tmp_path, capsys):
    assert main(["certify", "--help"]) == 0
    out = capsys.readouterr().out
    assert "dsrs" in out and "q_share" in out and "alpha_split" in out
    checkpoint = write_checkpoint(tmp_path / "c.pt")
    code = main(["certify", str(checkpoint), "--certifier", "dsrs", "--opt", "th=1.5",
                 "--n0", "20", "--n", "100", "--max", "1", "--no-progress", "--device", "cpu",
                 "--out", str(tmp_path / "r.tsv")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "th must be a percentile" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
