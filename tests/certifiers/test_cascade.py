"""The cascade certifier (``certifiers/cascade.py``): the authors' numbers (their
``SmoothedConfidence`` and ``certify.py`` loop, tests/fixtures/smoothing-multiscale/), its
options and models per level, and runs through ``certify_dataset`` with a resume."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import norm

from conftest import Halfspace, dying_writer
from smoothcert.certifiers import CERTIFIERS
from smoothcert.certifiers.cascade import (
    NO_EARLIER_BOUND,
    CascadeRule,
    LevelDraws,
    _level_model,
    run_cascade,
)
from smoothcert.denoisers.composition import Denoised
from smoothcert.errors import SmoothcertError
from smoothcert.runs import certify_dataset

GOLDEN = json.loads((Path(__file__).parents[1] / "fixtures" / "smoothing-multiscale"
                     / "golden.json").read_text())
TOL = dict(rel=1e-9, abs=1e-12)  # the same formulas; SciPy's quantiles differ in the last bits

pytestmark = pytest.mark.filterwarnings(
    "ignore::smoothcert.smoothing.smoothed.InputRangeWarning")


def test_one_levels_decision_is_the_authors_certified_radius():
    for case in GOLDEN["certified"]:
        rule = CascadeRule(2, case["alpha"], case["skip_p"], "paper", "goodman")
        draws = LevelDraws(case["sigma"], case["selected"], np.array(case["counts"]))
        c = rule.certificate([draws])
        if case["pred"] >= 0:
            assert (c.prediction, c.level) == (case["pred"], 1), case
            assert c.radius == pytest.approx(case["radius"], **TOL)
        else:
            assert c.prediction is None and c.radius == 0.0
            assert rule.goes_on(draws, 0) == (case["pred"] == -1), case


def test_off_class_radii_are_the_authors():
    for case in GOLDEN["off_class"]:
        rule = CascadeRule(2, case["alpha"], case["skip_p"], "paper", "goodman")
        draws = LevelDraws(case["sigma"], case["selected"], np.array(case["counts"]))
        ours = rule.off_radius(draws, case["c"], case["alpha"])
        if math.isinf(case["radius"]):  # their bound 1: ours Φ⁻¹ of the float below 1 (finite)
            assert ours == case["sigma"] * (norm.ppf(np.nextafter(1.0, 0.0))
                                            - norm.ppf(case["skip_p"])) > 0, case
            continue
        assert ours == pytest.approx(case["radius"], **TOL), case


def test_cascades_are_the_authors_certify_loop():
    """Their loop with magnitude 1: class (−1 and −2 both an abstention), radius, radius_neg,
    and the stage they stopped at (ours: the levels drawn; the level answering or 0)."""
    for case in GOLDEN["cascades"]:
        stages = [LevelDraws(s, c, np.array(counts)) for s, c, counts in case["stages"]]
        rule = CascadeRule(len(stages), case["alpha"], case["skip_p"], "paper", "goodman")
        drawn = []
        c = run_cascade(rule, lambda k, drawn=drawn, stages=stages: drawn.append(k) or stages[k])
        assert len(drawn) == case["stage"] + 1, case
        assert (-1 if c.prediction is None else c.prediction) == max(case["pred"], -1), case
        assert c.radius == pytest.approx(case["radius"], **TOL)
        assert c.radius_neg == pytest.approx(case["radius_neg"], **TOL)
        assert c.level == (case["stage"] + 1 if case["pred"] >= 0 else 0)


def test_a_veto_and_the_radius_of_earlier_levels():
    rule = CascadeRule(2, 0.001)
    first = LevelDraws(1.0, 0, np.array([200, 480, 320]))  # class 1 may reach ½ at level 1
    c = rule.certificate([first, LevelDraws(0.5, 2, np.array([0, 0, 1000]))])
    assert c.prediction is None and c.radius_neg > 0 and c.level == 0
    first = LevelDraws(1.0, 0, np.array([400, 300, 300]))
    c = rule.certificate([first, LevelDraws(0.5, 1, np.array([0, 1000, 0]))])
    cap = -rule.off_radius(first, 1, rule.off_level(1))
    assert c.prediction == 1 and c.radius == cap == -c.radius_neg and c.level == 2
    assert rule.certificate([first]).radius_neg == NO_EARLIER_BOUND


def test_bonferroni_levels_add_up_to_alpha():
    for levels in (1, 2, 3, 5):
        rule = CascadeRule(levels, 0.01)
        spent = sum(rule.own_level(k) for k in range(levels)) + (levels - 1) * rule.off_level(0)
        assert spent == pytest.approx(0.01, rel=1e-12)
    assert CascadeRule(3, 0.01, split="paper").own_level(2) == pytest.approx(0.01 / 3)


@pytest.mark.parametrize("options, says", [
    ({"sigmas": "0.25,0.5"}, "strictly decreasing"),
    ({"sigmas": "1.0,1.0"}, "strictly decreasing"),
    ({"sigmas": "1,x"}, "cascade sigmas: 'x' is not a number"),
    ({"sigmas": "1,-0.5"}, "numbers > 0"),
    ({"p0": 0.4}, r"p0 must be in \[0.5, 1\)"),
    ({"p0": 1.0}, r"p0 must be in \[0.5, 1\)"),
    ({"alpha_split": "holm"}, "alpha_split"),
])
def test_bad_options_are_one_line(options, says):
    with pytest.raises(SmoothcertError, match=says):
        CERTIFIERS["cascade"](**options)


def test_models_per_level():
    cascade = CERTIFIERS["cascade"](sigmas="1.0,0.5,0.25")
    assert cascade.checkpoint_roles(1) is None
    assert cascade.checkpoint_roles(3) == ("level2", "level3")
    with pytest.raises(SmoothcertError, match="takes one checkpoint .* or 3"):
        cascade.checkpoint_roles(2)
    cascade.check_models(frozenset())
    cascade.check_models(frozenset({"level2", "level3"}))
    with pytest.raises(SmoothcertError, match="level2, level3"):
        cascade.check_models(frozenset({"level2"}))
    assert CERTIFIERS["cascade"]().checkpoint_roles(1) is None
    with pytest.raises(SmoothcertError, match="got 2 checkpoints and one sigma"):
        CERTIFIERS["cascade"]().checkpoint_roles(2)  # not a one-level cascade of an ensemble


class OneShot(torch.nn.Module):
    """A stand-in for a diffusion denoiser: ``with_sigma`` as ``DiffusionDenoiser``'s."""

    def __init__(self, sigma):
        super().__init__()
        self.sigma = sigma

    def with_sigma(self, sigma):
        return OneShot(sigma)

    def forward(self, x):
        return x


class Run:
    def __init__(self, model, models=None):
        self.smoothed = type("S", (), {"model": model})()
        self.models = models or {}


def test_one_diffusion_model_denoises_each_level_at_its_sigma():
    classifier = Halfspace(torch.ones(16), input_shape=(1, 4, 4))
    model, new_classes = _level_model(Run(Denoised(OneShot(1.0), classifier)), 2, 0.5)
    assert isinstance(model, Denoised) and model.denoiser.sigma == 0.5 and new_classes is None
    assert model.classifier is classifier
    assert _level_model(Run(classifier), 2, 0.5) == (None, None)  # the same model


def oracle():
    """Level 1: f = [x₀ > 0.2] at σ 1; level 2 (σ 0.5): [x₀ > −1]. At x₀ = 0.3 level 1's
    p is Φ(0.1) ≈ 0.54 < p0 = 0.7 (on to level 2, p = Φ(2.6)); at x₀ = 3, Φ(2.8): level 1."""
    w = torch.zeros(1, 4, 4)
    w[0, 0, 0] = 1.0
    first, second = Halfspace(w, b=0.2, input_shape=(1, 4, 4)), \
        Halfspace(w, b=-1.0, input_shape=(1, 4, 4))
    second.num_classes = 2
    xs = torch.zeros(3, 1, 4, 4)
    xs[:, 0, 0, 0] = torch.tensor([0.3, 3.0, 0.25])
    return first, second, torch.utils.data.TensorDataset(xs, torch.tensor([1, 1, 1]))


def run(out=None, **kwargs):
    first, second, data = oracle()
    return certify_dataset(first, data, sigma=1.0, certifier="cascade", n0=50, n=500,
                           alpha=0.001, batch=256, seed=2, num_classes=2, out=out,
                           options={"sigmas": "1.0,0.5", "p0": 0.7},
                           models={"level2": second}, **kwargs)


def test_runs_through_the_engine_and_says_which_level_answered(tmp_path, monkeypatch):
    rows = run(tmp_path / "whole.tsv")
    assert [r["level"] for r in rows] == [2, 1, 2]
    assert [r["sigma_level"] for r in rows] == [0.5, 1.0, 0.5]
    assert all(r["predict"] == r["predict_clean"] == 1 and r["sigma"] == 1.0 for r in rows)
    assert rows[1]["radius_neg"] == NO_EARLIER_BOUND and rows[0]["radius_neg"] < 0
    for r in rows:  # never past the true cascade's radius (x₀ + 1 at level 2; level 1's cap)
        assert 0 < r["radius"] == r["radius_l2"] <= r["radius_l1"]
    assert rows[1]["radius"] <= 3.0 - 0.2 - norm.ppf(0.7)
    restore = dying_writer(monkeypatch, rows=2, torn="2\t1\t")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut.tsv")
    restore()
    resumed = run(tmp_path / "cut.tsv")
    strip = [{k: v for k, v in r.items() if k != "time"} for r in rows]
    assert [{k: v for k, v in r.items() if k != "time"} for r in resumed] == strip


def test_an_abstention_records_the_clean_prediction_of_the_last_level():
    first, second, data = oracle()
    rows = certify_dataset(first, data, sigma=1.0, certifier="cascade", n0=20, n=30,
                           alpha=0.001, batch=64, seed=2, num_classes=2, max_count=1,
                           options={"sigmas": "1.0,0.5", "p0": 0.99},
                           models={"level2": second})
    assert rows[0]["predict"] == -1 and rows[0]["level"] == 0 and rows[0]["radius"] == 0
    assert rows[0]["predict_clean"] == 1  # the level-2 model on x₀ = 0.3 > −1


def test_the_first_sigma_must_be_the_runs():
    first, second, data = oracle()
    with pytest.raises(SmoothcertError, match="the first level is the run's sigma"):
        certify_dataset(first, data, sigma=0.5, certifier="cascade", n=10, num_classes=2,
                        options={"sigmas": "1.0,0.5"})
    assert math.isfinite(NO_EARLIER_BOUND)
