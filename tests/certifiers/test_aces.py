"""ACES (certifiers/aces.py): the false-certificate rate of the composed model against its exact
value on halfspaces (with two unsound controls the test catches), the halfspace oracle end to
end (the certifier contract's checks: soundness, a kill and a resume, shards and a merge), the
entropy selection, the models by role, and the command line."""

import numpy as np
import pytest
import torch
from scipy.stats import norm

from conftest import Halfspace, write_checkpoint
from smoothcert import Gaussian, SmoothcertError
from smoothcert.certifiers import CERTIFIERS
from smoothcert.certifiers.aces import (
    AcesAnswer,
    EntropySelection,
    combine,
    counts_certificate,
    normalized_entropy,
)
from smoothcert.cli.app import main
from smoothcert.runs import certify_dataset
from smoothcert.runs.records import read_records

pytestmark = pytest.mark.filterwarnings(
    "ignore::smoothcert.smoothing.smoothed.InputRangeWarning")


# --------------------------------------------------------------------------- statistical soundness
# Along one axis t (x at t = 0, σ = 1): the selection's base classifier votes robust (1) where
# t > −m_s, the robust model votes 1 where t > −m_r, the core model is the constant 0. Each
# smoothed halfspace is its own base classifier, so the ACES model is A(t) = 1 exactly where
# t > −min(m_s, m_r), else 0; its votes at x are Bernoulli(Φ(m)). A certificate (c, R) is
# false when A ≠ c somewhere on (−R, R) (at t = 0 for R = 0): c = 0 always (A(0) = 1), c = 1
# when R > min(m_s, m_r).
TRIALS = 20_000
TOLERANCE = 3 * np.sqrt(0.1 * 0.9 / TRIALS)  # 3 standard errors of a rate at α = 0.1


def certificates(rng, margin, n0, n, alpha):
    """One CERTIFY per trial of the halfspace at ``margin`` (Bernoulli(Φ(margin)) votes for 1),
    through :func:`counts_certificate`, tabulated per (ĉ, n_A) (the only inputs it reads)."""
    p = norm.cdf(margin)
    first, votes = rng.binomial(n0, p, TRIALS), rng.binomial(n, p, TRIALS)
    c_hat = (first > n0 - first).astype(int)  # the argmax, class 0 on a tie
    n_a = np.where(c_hat == 1, votes, n - votes)
    table = {key: counts_certificate(Gaussian(1.0), np.eye(2)[key[0]], [n - key[1], key[1]]
                                     if key[0] else [key[1], n - key[1]], n0, alpha, 1)
             for key in set(zip(c_hat.tolist(), n_a.tolist()))}
    return [table[key] for key in zip(c_hat.tolist(), n_a.tolist())]


def false_rate(m_s, m_r, n0, n, alpha, split=True, robust_radius_only=False, seed=0):
    rng = np.random.default_rng(seed)
    alphas = (alpha / 2, alpha / 2) if split else (alpha, alpha)  # unsplit: each at full α
    selections = certificates(rng, m_s, n0, n, alphas[0])
    robusts = certificates(rng, m_r, n0, n, alphas[1])
    false = 0
    for s, r in zip(selections, robusts):
        a = combine(s, r, core=0)
        if robust_radius_only and a.selected == 1:
            a = AcesAnswer(a.prediction, r.radius, 1)  # unsound: R_s ignored
        false += a.prediction == 0 or (a.prediction == 1 and a.radius > min(m_s, m_r))
    return false / TRIALS


def test_false_certificates_stay_below_alpha_where_either_bound_alone_can_fail():
    # Both votes at Φ(0.0005) ≈ ½: a bound that fails certifies class 0 (n0 = 2 picks 0 on a
    # tie, 3 times in 4). n = 119 puts the binomial test's size near its level at α/2 and α.
    # Either failure alone gives a false certificate, so the union bound over the two is
    # tight: without the α split the rate is ≈ 1.4·α.
    sound = false_rate(0.0005, 0.0005, 2, 119, 0.1)
    unsplit = false_rate(0.0005, 0.0005, 2, 119, 0.1, split=False)
    assert 0.05 < sound <= 0.1 + TOLERANCE, sound  # measured 0.072
    assert unsplit > 0.1 + TOLERANCE, unsplit  # measured 0.14


def test_the_radius_is_capped_by_the_selection_radius():
    # the selection barely picks the robust model (m_s = 0.4), the robust model is sure (m_r =
    # 3): its radius alone (≈ 1.96) overshoots the selection's boundary whenever it is certified
    sound = false_rate(0.4, 3.0, 10, 119, 0.1)
    robust_only = false_rate(0.4, 3.0, 10, 119, 0.1, robust_radius_only=True)
    assert sound <= 0.1 + TOLERANCE, sound
    assert robust_only > 0.5, robust_only


# --------------------------------------------------------------------------- the halfspace oracle
class Constant(torch.nn.Module):
    """A core model that always says ``c`` (2 classes)."""

    num_classes = 2

    def __init__(self, c):
        super().__init__()
        self.register_buffer("logits", torch.eye(2)[c])

    def forward(self, x):
        return self.logits.expand(x.shape[0], 2)


class Oracle(Halfspace):
    num_classes = 2


B_SEL, B_ROB = 0.0, 0.2  # selection: robust where x₀ > 0; robust model: class 1 where x₀ > 0.2
POINTS = (-0.5, -0.2, -0.05, 0.05, 0.1, 0.15, 0.25, 0.45, 0.7, 0.9)


def oracle_models(scale=1.0):
    w = torch.zeros(1, 4, 4)
    w[0, 0, 0] = scale
    robust = Oracle(w, b=scale * B_ROB, input_shape=(1, 4, 4))
    selection = Oracle(w, b=B_SEL, input_shape=(1, 4, 4))
    xs = torch.zeros(len(POINTS), 1, 4, 4)
    xs[:, 0, 0, 0] = torch.tensor(POINTS)
    data = torch.utils.data.TensorDataset(xs, (xs[:, 0, 0, 0] > B_ROB).long())
    return robust, selection, data


def holds(x0, c, r):
    """Whether the ACES model of the oracle (core ≡ 1: A = 0 exactly on (0, 0.2]) predicts c on
    the open interval (x0 − r, x0 + r), at x0 itself when r = 0."""
    if c == 0:
        return B_SEL < x0 <= B_ROB and x0 - r >= B_SEL and x0 + r <= B_ROB
    return (x0 <= B_SEL or x0 > B_ROB) and (x0 + r <= B_SEL or x0 - r >= B_ROB)


def run(**kwargs):
    robust, selection, data = oracle_models()
    return certify_dataset(robust, data, certifier="aces", sigma=0.5, n0=50, n=2000,
                           alpha=0.001, batch=700, seed=3,
                           models={"selection": selection, "core": Constant(1)}, **kwargs)


def without_time(rows):
    return [{k: v for k, v in row.items() if k != "time"}
            for row in sorted(rows, key=lambda r: r["idx"])]


def test_sound_on_the_halfspace_oracle_in_every_branch():
    rows = run()
    assert [r["idx"] for r in rows] == list(range(len(POINTS)))
    for row in rows:
        x0 = POINTS[row["idx"]]
        if row["predict"] >= 0:
            assert holds(x0, row["predict"], row["radius"]), row
        assert row["radius"] <= min(row["selection_radius"], row["robust_radius"]) + 1e-12
        assert row["core_predict"] == 1 and row["alpha"] == 0.001
    by_x = {POINTS[r["idx"]]: r for r in rows}
    assert by_x[-0.5]["selected"] == 0 and by_x[-0.5]["predict"] == 1  # core, radius 0
    robust = [r for r in rows if r["selected"] == 1 and r["robust_predict"] >= 0]
    assert all(r["radius"] == min(r["selection_radius"], r["robust_radius"]) for r in robust)
    # both bounds are the smaller one somewhere: x₀ = 0.05 is nearer the selection's boundary
    assert by_x[0.05]["radius"] == by_x[0.05]["selection_radius"] > 0
    assert by_x[0.9]["radius"] == by_x[0.9]["robust_radius"] > 0
    assert by_x[0.05]["predict"] == 0 and by_x[0.05]["radius"] <= 0.05
    assert by_x[0.9]["radius_l2"] == by_x[0.9]["radius"] > by_x[0.9]["radius_linf"] > 0


def test_the_identity_holds_both_other_models(tmp_path):
    """Kill, resume, shards and merge: the certifier contract test (with these roles)."""
    run(out=tmp_path / "whole.tsv")
    assert read_records(tmp_path / "whole.tsv").manifest["identity"]["models"].keys() == \
        {"selection", "core"}


def test_another_selection_model_is_another_run(tmp_path):
    run(out=tmp_path / "r.tsv", max_count=2)
    robust, _, data = oracle_models()
    other = Oracle(torch.ones(1, 4, 4), input_shape=(1, 4, 4))
    with pytest.raises(SmoothcertError, match="differs in: models"):
        certify_dataset(robust, data, certifier="aces", sigma=0.5, n0=50, n=2000, alpha=0.001,
                        seed=3, max_count=2, out=tmp_path / "r.tsv",
                        models={"selection": other, "core": Constant(1)})


# --------------------------------------------------------------------------- entropy selection
def test_normalized_entropy_and_the_entropy_vote():
    logits = torch.tensor([[0.0, 0.0, 0.0], [9.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    h = normalized_entropy(logits)
    p = torch.softmax(logits, 1)
    assert torch.allclose(h, -(p * p.log()).sum(1) / np.log(3))
    assert h[0] == pytest.approx(1.0) and h[1] < 0.01
    votes = EntropySelection(torch.nn.Identity(), float(h[2])).forward(logits).argmax(1)
    assert votes.tolist() == [0, 1, 1]  # ≤ θ votes robust (a tie at θ too, as theirs)


def test_entropy_selection_reads_the_robust_model_and_needs_no_selection_model():
    robust, _, data = oracle_models(scale=10.0)  # logits ±z, z = 10(x₀ − 0.2): entropy ≤ ½
    options = {"selection": "entropy", "entropy_threshold": 0.5}  # where |z| ≥ 1.1
    rows = certify_dataset(robust, data, certifier="aces", options=options, sigma=0.02, n0=20,
                           n=500, alpha=0.01, batch=500, seed=0, models={"core": Constant(0)})
    by_x = {POINTS[r["idx"]]: r for r in rows}
    assert by_x[0.9]["selected"] == 1 and by_x[0.9]["predict"] == 1 > 0 < by_x[0.9]["radius"]
    assert by_x[0.25]["selected"] == 0 and by_x[0.25]["predict"] == 0 == by_x[0.25]["radius"]
    with pytest.raises(SmoothcertError, match="takes the models core, not selection"):
        certify_dataset(robust, data, certifier="aces", options=options, sigma=0.25,
                        models={"core": Constant(0), "selection": Constant(0)})


# --------------------------------------------------------------------------- options and models
@pytest.mark.parametrize("role", ["core", "selection"])
def test_a_model_of_ablation_encoded_inputs_is_refused_in_any_role(tmp_path, role):
    """An ablation-trained model reads (x, 1 − x)-encoded pixels: as the run's model a noise
    certifier refuses it, and so as ACES' core or selection model (it was accepted as core)."""
    robust, selection, data = oracle_models()
    models = {"selection": selection, "core": Constant(1)}
    marked = models[role]
    marked.input_encoding = "ablation"
    with pytest.raises(SmoothcertError, match=f"the {role} model reads ablation-encoded "
                                              "inputs .* not 'aces'"):
        certify_dataset(robust, data, certifier="aces", sigma=0.25, n0=10, n=20,
                        models=models, out=tmp_path / "r.tsv")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("options, message", [
    ({"selection": "entropy"}, "selection=entropy needs entropy_threshold in"),
    ({"selection": "entropy", "entropy_threshold": 1.5}, "needs entropy_threshold in"),
    ({"entropy_threshold": 0.5}, "entropy_threshold is for selection=entropy"),
    ({"alpha_split": 1.0}, "alpha_split must be in"),
    ({"selection_n": 0}, "selection_n must be"),
    ({"selection": "margin"}, "margin"),
])
def test_bad_options_are_one_line(options, message):
    with pytest.raises(SmoothcertError, match=message):
        CERTIFIERS["aces"](**options)


def test_models_by_role_are_checked():
    aces = CERTIFIERS["aces"]()
    with pytest.raises(SmoothcertError, match="needs a model for core"):
        aces.check_models(frozenset({"selection"}))
    with pytest.raises(SmoothcertError, match="not denoiser"):
        aces.check_models(frozenset({"selection", "core", "denoiser"}))
    aces.check_models(frozenset({"selection", "core"}))
    robust, selection, data = oracle_models()
    with pytest.raises(SmoothcertError, match="the core model has 2 classes, the robust"):
        certify_dataset(robust, data, certifier="aces", sigma=0.5, num_classes=3,
                        models={"selection": selection, "core": Constant(1)})


def test_the_selection_n_and_alpha_split_options_are_used():
    rows = run(options={"selection_n": 100, "alpha_split": 0.2}, max_count=2)
    full = run(max_count=2)
    assert all(r["selection_p_lower"] > 0 for r in rows)
    # fewer selection draws at a smaller α share: a looser selection bound
    assert all(a["selection_p_lower"] < b["selection_p_lower"] for a, b in zip(rows, full))


# --------------------------------------------------------------------------- command line
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("aces")
    return {name: write_checkpoint(folder / f"{name}.pt", num_classes=classes)
            for name, classes in (("robust", 10), ("core", 10), ("selection", 2),
                                  ("wide", 10))}


def cli(checkpoints, out, *models):
    flags = [f"--model={role}={checkpoints[name]}" for role, name in models]
    return main(["certify", str(checkpoints["robust"]), "--certifier", "aces", *flags,
                 "--n0", "8", "--n", "32", "--batch", "64", "--max", "2", "--out", str(out),
                 "--no-progress", "--device", "cpu"])


def test_the_command_line_runs_aces_and_refuses_missing_or_wrong_models(checkpoints, tmp_path,
                                                                        capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["certify", "--help"]) == 0
    assert "ACES (Horváth et al. 2022)" in capsys.readouterr().out
    assert cli(checkpoints, tmp_path / "r.tsv", ("selection", "selection"), ("core", "core")) == 0
    rec = read_records(tmp_path / "r.tsv")
    assert rec.columns_order[-7:] == ("selected", "selection_p_lower", "selection_radius",
                                      "robust_predict", "robust_radius", "core_predict", "seed")
    assert list(rec["idx"]) == [0, 1]
    capsys.readouterr()
    assert cli(checkpoints, tmp_path / "a.tsv", ("selection", "selection")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a model for core" in err
    assert cli(checkpoints, tmp_path / "b.tsv", ("selection", "wide"), ("core", "core")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "selection model must have 2 classes" in err


def test_a_wrong_selection_model_is_refused_before_anything_is_written(checkpoints, tmp_path):
    assert cli(checkpoints, tmp_path / "b.tsv", ("selection", "wide"), ("core", "core")) == 2
    assert list(tmp_path.iterdir()) == []
