"""The runner-up's bound (certifiers/runner_up.py): closed-form radii against CERTIFY's, and the
false-certificate rate against α, with an unsound control (bounding only the class that looks
second in the selection draws)."""

import numpy as np
import pytest
from scipy.stats import beta, norm

from smoothcert.certifiers.runner_up import clopper_pearson_upper, runner_up_certificate
from smoothcert.errors import SmoothcertError
from smoothcert.stats import clopper_pearson_lower

ALPHA, SIGMA = 0.001, 0.5


def certify_radius(n_a, n, alpha=ALPHA):
    """CERTIFY's radius σΦ⁻¹(p_lower), 0 on abstention."""
    p = clopper_pearson_lower(n_a, n, alpha)
    return SIGMA * norm.ppf(p) if p >= 0.5 else 0.0


def test_spread_mass_gives_a_strictly_larger_radius_in_closed_form():
    # 10 classes, 10,000 draws: ĉ_A has 6,000, eight classes 500 each, one none. Bounds from
    # the Beta quantiles directly: p_lower at α/2, each other class's upper bound at α/18.
    counts = np.array([6000] + [500] * 8 + [0])
    c = runner_up_certificate(0, counts, ALPHA, SIGMA)
    p_lower = beta.ppf(ALPHA / 2, 6000, 10_000 - 6000 + 1)
    p_upper = beta.ppf(1 - ALPHA / 18, 500 + 1, 10_000 - 500)
    assert c.p_lower == pytest.approx(p_lower, rel=1e-12)
    assert c.p_upper == pytest.approx(p_upper, rel=1e-9)
    assert c.radius == pytest.approx(SIGMA / 2 * (norm.ppf(p_lower) - norm.ppf(p_upper)),
                                     rel=1e-9)
    assert c.prediction == 0 and c.runner_up in range(1, 9) and c.runner_up_count == 500
    assert c.radius > 2.5 * certify_radius(6000, 10_000)  # 0.62 against CERTIFY's 0.11


def test_a_top_class_below_one_half_is_certified_where_certify_abstains():
    counts = np.array([4000] + [1000] * 6)
    c = runner_up_certificate(0, counts, ALPHA, SIGMA)
    assert certify_radius(4000, 10_000) == 0.0
    lower = beta.ppf(ALPHA / 2, 4000, 6001)
    upper = beta.ppf(1 - ALPHA / 12, 1001, 9000)  # 6 other classes: α/(2·6) each
    assert not c.abstained and c.radius == pytest.approx(
        SIGMA / 2 * (norm.ppf(lower) - norm.ppf(upper)), rel=1e-9)
    assert c.radius > 0.2  # σ/2·(−0.30 + 1.22)


def test_two_classes_give_certify_at_half_the_level():
    """With K = 2 the other class's upper bound is exactly 1 − p_lower (both at α/2), so the
    radius is σ/2·(Φ⁻¹(p) − Φ⁻¹(1 − p)) = σΦ⁻¹(p): CERTIFY's at level α/2."""
    for n_a in (5200, 7000, 9990, 10_000):
        c = runner_up_certificate(1, np.array([10_000 - n_a, n_a]), ALPHA, SIGMA)
        assert c.radius == pytest.approx(certify_radius(n_a, 10_000, ALPHA / 2), rel=1e-9,
                                         abs=1e-12)


def test_no_margin_abstains():
    c = runner_up_certificate(0, np.array([500, 480, 20]), ALPHA, SIGMA)
    assert c.abstained and c.prediction is None and c.radius == 0.0


def test_upper_bound_is_the_mirrored_lower_bound():
    assert clopper_pearson_upper(0, 100, 0.01) == pytest.approx(1 - 0.01 ** (1 / 100))
    assert clopper_pearson_upper(100, 100, 0.01) == 1.0


def literal_runner_up(selection, counts, alpha, sigma):
    """The unsound control: the runner-up taken from the selection draws and only its count
    bounded (at α/2), as if it were the largest other class."""
    order = np.argsort(-selection, kind="stable")
    a, b = int(order[0]), int(order[1])
    n = int(counts.sum())
    lower = clopper_pearson_lower(int(counts[a]), n, alpha / 2)
    upper = min(clopper_pearson_upper(int(counts[b]), n, alpha / 2), 1 - lower)
    return (a, sigma / 2 * (norm.ppf(lower) - norm.ppf(upper))) if lower > upper else (None, 0.0)


def false_certificate_rate(certify, p, trials=3000, n0=10, n=1000, alpha=0.05, seed=0):
    """Share of trials whose certificate is false: a class other than g(x) = argmax p, or a
    radius beyond the true σ/2·(Φ⁻¹(p_A) − Φ⁻¹(p_B))."""
    rng = np.random.default_rng(seed)
    p = np.asarray(p)
    top = int(np.argmax(p))
    true = SIGMA / 2 * (norm.ppf(p[top]) - norm.ppf(np.max(np.delete(p, top))))
    false = 0
    for _ in range(trials):
        selection, counts = rng.multinomial(n0, p), rng.multinomial(n, p)
        predicted, radius = certify(selection, counts, alpha)
        false += predicted is not None and (predicted != top or radius > true)
    return false / trials


def ours(selection, counts, alpha):
    c = runner_up_certificate(int(np.argmax(selection)), counts, alpha, SIGMA)
    return c.prediction, c.radius


@pytest.mark.parametrize("p", [(0.5, 0.3, 0.2), (0.45, 0.1, 0.1, 0.1, 0.1, 0.1, 0.05),
                               (0.7, 0.3)])
def test_false_certificate_rate_stays_below_alpha(p):
    """α = 0.05, 3,000 trials each (fixed seed): the rate must stay ≤ α + 3 standard errors
    (0.062); the bound is conservative, so it is usually far below. The control certifies
    falsely whenever the selection draws rank the 0.2 class above the 0.3 one (~25%)."""
    assert false_certificate_rate(ours, p) <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 3000)


def test_the_unsound_control_exceeds_alpha():
    def control(selection, counts, alpha):
        return literal_runner_up(selection, counts, alpha, SIGMA)

    assert false_certificate_rate(control, (0.5, 0.3, 0.2)) > 0.15


def test_one_class_is_refused():
    with pytest.raises(SmoothcertError, match="at least 2 classes"):
        runner_up_certificate(0, np.array([10]), ALPHA, SIGMA)


@pytest.mark.parametrize(("flags", "match"), [
    (["--noise", "uniform"], "runner-up"),
    (["--opt", "level=0.5"], "level"),
])
def test_cli_refuses_bad_runner_up_input_in_one_line(tmp_path, capsys, flags, match):
    from conftest import write_checkpoint
    from smoothcert.cli.app import main

    ck = write_checkpoint(tmp_path / "m.pt")
    out = tmp_path / "r.tsv"
    code = main(["certify", str(ck), "--certifier", "runner-up", *flags, "--n", "50",
                 "--max", "1", "--device", "cpu", "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and match in err and len(err.splitlines()) == 1, err
    assert not out.exists()
