"""Attacks on smoothed classifiers: the ε-ball and the box from the CLI, the minimal distance on a
halfspace (closed form), resume and shards of attack records, bad input, and the report of a
hand-written attack record file (median, mean, attack curve)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from conftest import Halfspace, dying_writer
from smoothcert import Gaussian, Smoothed
from smoothcert.certifiers.attack import AttackSettings, SmoothedAttack
from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.evaluation.metrics import attack_curve, attack_success, summarize_attack
from smoothcert.evaluation.report import report
from smoothcert.models.checkpoint import model_from_checkpoint
from smoothcert.rng import example_generator
from smoothcert.runs.records import read_records
from smoothcert.smoothing.attacks import (
    PGDL2,
    FreshNoiseObjective,
    SoftSmoothedObjective,
    draw_noises,
)

pytestmark = pytest.mark.usefixtures("one_thread")


# Small on purpose: PREDICT with 100 draws, 4 noises in the soft objective, 3 steps.
FAST = ["--steps", "3", "--noise-draws", "4", "--n", "100", "--batch", "100", "--max", "6",
        "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "run"
    assert main(["train", "--dataset", "digits", "--arch", "digits_cnn", "--method", "gaussian",
                 "--sigma", "0.25", "--epochs", "2", "--batch", "64", "--lr", "0.1",
                 "--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    return out / "checkpoint.pt"


def attack(checkpoint, out, *extra):
    return main(["attack", str(checkpoint), *FAST, "--out", str(out), *extra])


def rows_without_time(path):
    return [{k: v for k, v in r.items() if k != "time"} for r in read_records(path).rows()]


@pytest.fixture(scope="module")
def min_distance_run(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("attack") / "min.tsv"
    assert attack(checkpoint, out, "--min-distance", "--max-epsilon", "1.5",
                  "--epsilon-step", "0.5") == 0
    return out


# --------------------------------------------------------------------------- the ε-ball and box
def recompute(checkpoint, records, idx):
    """The attack of example ``idx`` again through the Python API, from the run's manifest."""
    cfg = records.manifest["identity"]
    model, _ = model_from_checkpoint(checkpoint)
    smoothed = Smoothed(model, Gaussian(cfg["sigma"]), 10)
    runner = SmoothedAttack(smoothed, AttackSettings(**cfg["options"]), n=cfg["n"],
                            alpha=cfg["alpha"], batch_size=7)  # any batch gives the same draws
    x, label = load_dataset("digits", "test").example(idx)
    return x, runner(x, label, example_generator(cfg["seed"], idx))


@pytest.mark.parametrize("name,extra", [("pgd", []), ("ddn", []), ("pgd", ["--fresh-noise"])])
def test_fixed_epsilon_never_leaves_the_ball_or_the_box(checkpoint, tmp_path, name, extra):
    out = tmp_path / f"{name}.tsv"
    assert attack(checkpoint, out, "--attack", name, "--epsilon", "0.3", *extra) == 0
    rec = read_records(out)
    assert list(rec["idx"]) == list(range(6)) and rec.manifest["identity"]["certifier"] == "attack"
    assert rec.columns_order[:6] == ("idx", "label", "predict_clean", "predict_adv", "success",
                                     "distance")
    assert (rec["distance"] <= 0.3 + 1e-6).all()
    attacked = np.flatnonzero(rec["predict_clean"] == rec["label"])
    assert attacked.size >= 2  # a 2-epoch digits CNN gets some digits right
    for i in attacked[:2]:
        x, outcome = recompute(checkpoint, rec, int(rec["idx"][i]))
        assert float(outcome.adversarial.min()) >= 0.0 and float(outcome.adversarial.max()) <= 1
        assert float((outcome.adversarial - x).norm()) <= 0.3 + 1e-6
        assert outcome.distance == rec["distance"][i]  # the same draws: the same attack
        assert int(outcome.success) == rec["success"][i]


def test_min_distance_stays_below_the_cap_and_its_budget(min_distance_run):
    rec = read_records(min_distance_run)
    budgets = {0.0, 0.5, 1.0, 1.5}
    assert (rec["distance"] <= 1.5 + 1e-6).all()
    assert (rec["distance"] <= rec["epsilon"] + 1e-6).all()
    assert set(rec["epsilon"]) <= budgets
    clean_wrong = rec["predict_clean"] != rec["label"]
    assert (rec["success"][clean_wrong] == 1).all() and (rec["distance"][clean_wrong] == 0).all()
    failed = rec["success"] == 0
    assert (rec["epsilon"][failed] == 1.5).all() and (rec["attempts"][failed] == 3).all()
    flipped = (rec["success"] == 1) & ~clean_wrong
    assert (rec["predict_adv"][flipped] != rec["label"][flipped]).all()


def test_attack_settings_budgets():
    assert AttackSettings(epsilon=0.7).budgets() == (0.7,)
    grid = AttackSettings(min_distance=True, max_epsilon=1.0, epsilon_step=0.3).budgets()
    assert grid == (0.3, 0.6, 0.9, 1.0)
    assert AttackSettings(min_distance=True, max_epsilon=4.0).budgets()[-1] == 4.0
    assert len(AttackSettings(min_distance=True).budgets()) == 16


# --------------------------------------------------------------------------- closed form
D = 16


def halfspace_problem(seed):
    """A two-class halfspace on 4×4 inputs near ½ and one input x at distance d from its
    hyperplane, which is the smoothed classifier's exact minimal flipping distance in L2 (the
    [0, 1] box does not bind for these seeds: the test checks the attack stays inside it)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(D, generator=gen)
    x = (0.5 + 0.05 * torch.randn(D, generator=gen)).clamp(0, 1).view(1, 4, 4)
    z = float(x.flatten() @ w)
    return Halfspace(w, input_shape=(1, 4, 4)), x, int(z > 0), abs(z) / float(w.norm())


@pytest.mark.parametrize("name", ["pgd", "ddn"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_min_distance_on_a_halfspace_is_the_distance_to_the_hyperplane(name, seed):
    """PGD on a linear model moves straight along −ŵ, so the first grid ε at or past the
    hyperplane flips PREDICT. Tolerance: one grid step (0.05) above; below, PREDICT may abstain
    where p_A = Φ(margin/σ) is within the binomial test's reach of ½: with n = 10⁴, α = 10⁻³
    that needs margin ≲ 0.011 for σ = 0.25, so 0.03 below is a stated, generous bound."""
    model, x, label, d = halfspace_problem(seed)
    settings = AttackSettings(attack=name, min_distance=True, max_epsilon=1.0,
                              epsilon_step=0.05, steps=10, noise_draws=16)
    runner = SmoothedAttack(Smoothed(model, Gaussian(0.25), 2), settings, n=10_000,
                            alpha=0.001, batch_size=10_000)
    outcome = runner(x, label, torch.Generator().manual_seed(seed))
    assert outcome.clean.prediction == label and outcome.success
    assert d - 0.03 <= outcome.distance <= d + 0.05 + 1e-6, (d, outcome.distance)
    assert float(outcome.adversarial.min()) >= 0 and float(outcome.adversarial.max()) <= 1


def test_fresh_noise_objective_redraws_at_every_call():
    model, x, label, _ = halfspace_problem(0)
    y = torch.tensor([label])
    fresh = FreshNoiseObjective(model, y, Gaussian(0.25), 8, torch.Generator().manual_seed(0))
    first = fresh(x[None]).loss
    noises = fresh.noises.clone()
    second = fresh(x[None]).loss
    assert fresh.noises.shape == (8, 1, 1, 4, 4) and not torch.equal(noises, fresh.noises)
    assert not torch.equal(first, second)
    fixed = SoftSmoothedObjective(model, y, noises)  # the same draws: the same loss
    torch.testing.assert_close(fixed(x[None]).loss, first)
    adv = PGDL2(num_steps=5).attack_objective(model, fresh, x[None], epsilon=0.2,
                                              generator=torch.Generator().manual_seed(1))
    assert float((adv - x[None]).norm()) <= 0.2 + 1e-6 and float(adv.min()) >= 0
    draws = draw_noises(Gaussian(0.25), x[None], 3, torch.Generator().manual_seed(2))
    assert draws.shape == (3, 1, 1, 4, 4)


# --------------------------------------------------------------------------- resume and shards
def test_interrupted_attack_resumes_to_the_same_records(checkpoint, min_distance_run, tmp_path,
                                                        monkeypatch):
    cut = tmp_path / "cut.tsv"
    restore = dying_writer(monkeypatch, rows=2, torn="2\t1\t1\t0")
    args = ["--min-distance", "--max-epsilon", "1.5", "--epsilon-step", "0.5"]
    assert attack(checkpoint, cut, *args) == 130
    restore()
    assert len(read_records(cut)) == 2
    assert attack(checkpoint, cut, *args) == 0
    assert rows_without_time(cut) == rows_without_time(min_distance_run)
    assert attack(checkpoint, cut, *args[:-1], "0.25") == 2  # another grid: refused


def test_attack_shards_merge_to_the_single_run(checkpoint, min_distance_run, tmp_path):
    args = ["--min-distance", "--max-epsilon", "1.5", "--epsilon-step", "0.5"]
    for k in range(2):
        assert attack(checkpoint, tmp_path / "s.tsv", *args, "--num-shards", "2",
                      "--shard-index", str(k)) == 0
    shards = sorted(tmp_path.glob("s.shard*-of-2.tsv"))
    assert [list(read_records(s)["idx"]) for s in shards] == [[0, 2, 4], [1, 3, 5]]
    assert main(["merge", *map(str, shards), "--out", str(tmp_path / "m.tsv")]) == 0
    assert rows_without_time(tmp_path / "m.tsv") == rows_without_time(min_distance_run)


# --------------------------------------------------------------------------- bad input
BAD = {
    "negative epsilon": (["--epsilon", "-1"], "epsilon"),
    "both budgets": (["--epsilon", "1", "--min-distance"], "not allowed with"),
    "no budget": ([], "one of the arguments"),
    "zero steps": (["--epsilon", "1", "--steps", "0"], "steps"),
    "zero noise draws": (["--epsilon", "1", "--noise-draws", "0"], "noise_draws"),
    "step above the cap": (["--min-distance", "--epsilon-step", "5"], "epsilon_step"),
    "ddn gamma": (["--epsilon", "1", "--ddn-gamma", "1.5"], "ddn_gamma"),
    "unknown attack": (["--epsilon", "1", "--attack", "cw"], "invalid choice"),
    "zero n": (["--epsilon", "1", "--n", "0"], "n must"),
    "bad shard": (["--epsilon", "1", "--num-shards", "2", "--shard-index", "5"], "shard-index"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_attack_input_one_line_exit_2(case, checkpoint, tmp_path, capsys):
    extra, match = BAD[case]
    out = tmp_path / "bad.tsv"
    assert main(["attack", str(checkpoint), "--out", str(out), "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err, err
    assert not out.exists()


def test_certify_does_not_offer_the_attack_which_certifies_nothing(checkpoint, tmp_path, capsys):
    assert main(["certify", str(checkpoint), "--certifier", "attack",
                 "--out", str(tmp_path / "c.tsv")]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_settings_validate_at_the_boundary():
    with pytest.raises(SmoothcertError, match="unknown attack"):
        AttackSettings(attack="fgsm")
    with pytest.raises(SmoothcertError, match="min_distance"):
        AttackSettings(min_distance=1)


# --------------------------------------------------------------------------- report
ATTACK_HEADER = ("idx", "label", "predict_clean", "predict_adv", "success", "distance", "time",
                 "epsilon", "attempts", "count_adv", "runner_up_adv", "pvalue_adv", "n",
                 "alpha", "sigma", "seed")
# idx 0: clean wrong (not attacked); 1–5 attacked: flipped at 0.4, 1.0, 0.25, 2.0; idx 5 failed
# (distance of the last attempt, 4.0). idx 6: clean abstention (not attacked).
ATTACK_ROWS = [
    (0, 3, 5, 5, 1, 0.0, 0.1, 0.0, 0, 90, 5, 1e-9, 100, 0.001, 0.25, 0),
    (1, 1, 1, 7, 1, 0.4, 0.1, 0.5, 2, 80, 10, 1e-9, 100, 0.001, 0.25, 0),
    (2, 2, 2, -1, 1, 1.0, 0.1, 1.0, 4, 50, 45, 0.6, 100, 0.001, 0.25, 0),
    (3, 4, 4, 0, 1, 0.25, 0.1, 0.25, 1, 70, 20, 1e-6, 100, 0.001, 0.25, 0),
    (4, 6, 6, 2, 1, 2.0, 0.1, 2.0, 8, 60, 30, 1e-3, 100, 0.001, 0.25, 0),
    (5, 8, 8, 8, 0, 4.0, 0.1, 4.0, 16, 95, 2, 1e-20, 100, 0.001, 0.25, 0),
    (6, 9, -1, -1, 1, 0.0, 0.1, 0.0, 0, 40, 38, 0.9, 100, 0.001, 0.25, 0),
]
# Attacked: idx 1–5 (clean prediction = label). Distances with failure = inf:
# [0.4, 1.0, 0.25, 2.0, inf] → median 1.0, mean of the flipped (0.4+1+0.25+2)/4 = 0.9125,
# success 4/5; curve at 0, 0.25, 0.5, 1, 2, 4: 0, 1/5, 2/5, 3/5, 4/5, 4/5. Clean acc 5/7.


def write_attack_file(path, rows=ATTACK_ROWS):
    lines = ["\t".join(ATTACK_HEADER)] + ["\t".join(map(str, r)) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_report_distances_and_attack_curve_by_hand(tmp_path):
    rec = read_records(write_attack_file(tmp_path / "pgd.tsv"))
    grid = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
    s = summarize_attack(rec, grid)
    assert s.count == 7 and s.clean_accuracy == pytest.approx(5 / 7)
    assert s.success_rate == pytest.approx(4 / 5)
    assert s.median_distance == pytest.approx(1.0)
    assert s.mean_distance == pytest.approx((0.4 + 1.0 + 0.25 + 2.0) / 4)
    np.testing.assert_allclose(s.attacked_at, [0, 1 / 5, 2 / 5, 3 / 5, 4 / 5, 4 / 5])
    breaks, flipped = attack_curve(rec)
    np.testing.assert_allclose(breaks, [0, 0.25, 0.4, 1.0, 2.0])
    np.testing.assert_allclose(flipped, [0, 1 / 5, 2 / 5, 3 / 5, 4 / 5])
    np.testing.assert_allclose(attack_success(rec, [0.39, 0.4]), [1 / 5, 2 / 5])  # inclusive


def test_report_of_attack_files_in_md_json_and_plot(tmp_path, capsys):
    path = write_attack_file(tmp_path / "pgd.tsv")
    (row,) = json.loads(report([path], "0,0.5,1", fmt="json"))
    assert row == pytest.approx({"name": "pgd", "attack": None, "n": 7, "clean_accuracy": 5 / 7,
                                 "attacked": 0.8, "median_distance": 1.0,
                                 "mean_distance": 0.9125, "d<=0": 0.0, "d<=0.5": 0.4,
                                 "d<=1": 0.6})
    plot = tmp_path / "curve.png"
    assert main(["report", str(path), "--radii", "0:1:0.5", "--plot", str(plot)]) == 0
    text = capsys.readouterr().out
    assert "| pgd | – | 7 | 71.4% | 80.0% | 1.000 | 0.912 | 0.0% | 40.0% | 60.0% |" in text
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert "d \\le 0.5" in report([path], "0,0.5", fmt="latex")


def test_median_is_infinite_when_most_attacks_fail(tmp_path):
    rows = [(i, 1, 1, 1, 0, 4.0, 0.1, 4.0, 16, 90, 5, 1e-9, 100, 0.001, 0.25, 0)
            for i in range(3)]
    rows[0] = (0, 1, 1, 2, 1, 0.5, 0.1, 0.5, 2, 90, 5, 1e-9, 100, 0.001, 0.25, 0)
    path = write_attack_file(tmp_path / "strong.tsv", rows)
    s = summarize_attack(read_records(path), [1.0])
    assert math.isinf(s.median_distance) and s.mean_distance == 0.5
    assert json.loads(report([path], "1", fmt="json"))[0]["median_distance"] is None
    assert "inf" in report([path], "1", fmt="md")


def test_attack_and_certify_files_do_not_mix(tmp_path, min_distance_run, capsys):
    attack_file = write_attack_file(tmp_path / "a.tsv")
    cohen = tmp_path / "c.tsv"
    cohen.write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\t0.5\t1\t1.0\n")
    assert main(["report", str(attack_file), str(cohen)]) == 2
    assert main(["report", str(attack_file), "--envelope"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "separately" in err[0] and "CERTIFY" in err[1]
    # a real attack run names its attack from the manifest
    assert json.loads(report([min_distance_run], "1", fmt="json"))[0]["attack"] == "pgd"


def test_run_config_validates_attack_options():
    from smoothcert.runs import RunConfig

    base = dict(certifier="attack", checkpoint_sha256="0", dataset="digits", split="test",
                sigma=0.25, n=100, alpha=0.001, batch=100, seed=0)
    assert RunConfig(**base, options={"attack": "ddn"}).options["steps"] == 20
    with pytest.raises(SmoothcertError, match="steps"):
        RunConfig(**base, options={"steps": 0})
