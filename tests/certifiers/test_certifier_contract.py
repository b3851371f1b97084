"""The contract every registered certifier keeps, with every noise it certifies with (as
``test_methods.py`` does for training methods): sound on the closed-form halfspace oracle, the
same rows after a kill and a resume, and the same rows from shards and a merge (or sharding
refused, when its certificates depend on one global order)."""

import pytest
import torch

from conftest import Halfspace, dying_writer
from smoothcert.certifiers import CERTIFIERS, certifying
from smoothcert.errors import SmoothcertError
from smoothcert.noise.base import NOISES
from smoothcert.runs import certify_dataset
from smoothcert.runs.records import merge_records, read_records, shard_path

# The oracles' points lie off [0, 1] on purpose (their radii are exact on all of R^d): the
# warning that says so to a user (smoothed.InputRangeWarning) is expected here.
pytestmark = pytest.mark.filterwarnings(
    "ignore::smoothcert.smoothing.smoothed.InputRangeWarning")

B = 0.2  # the hyperplane x[0, 0, 0] = B; class 1 beyond it
POINTS = (-0.5, -0.2, 0.1, 0.18, 0.25, 0.45, 0.7, 0.9)
LEVELS = (0, 26, 46, 50, 53, 64, 115, 179, 230, 255)  # the sound noises' inputs: 8-bit values
# A certifier that draws no noise (``uses_noise`` False: ablation, whose radius is in pixels and
# whose model reads ablated pixels) keeps the same contract in its own tests
# (tests/certifiers/test_ablation.py: kill and resume, shards and merge; soundness by exhaustive
# patch search in test_ablation_soundness.py).
# A certifier of another task than classification (``tasks``: segment, median) cannot run on
# this classification oracle; each keeps the contract in its own tests (segment:
# tests/certifiers/test_segment.py, kill and resume; test_segment_soundness.py).
# The other models of a certifier that composes several (``model_roles``), built from the
# oracle: ACES takes it as its 2-class selection (the robust model where x₀ > B, the core model
# below) and as its core model, so that the composed model is the oracle itself.
ROLE_MODELS = {"aces": lambda oracle: {"selection": oracle, "core": oracle}}
CASES = [(name, noise) for name in certifying() if CERTIFIERS[name].uses_noise
         and "classification" in CERTIFIERS[name].tasks
         for noise in (NOISES[n].example or n for n in CERTIFIERS[name].noises or sorted(NOISES))]


def points(noise):
    """x₀ of the inputs: the 8-bit grid's values for the discrete Gaussian (float32 m/255)."""
    if noise.startswith("discrete"):
        return torch.tensor(LEVELS, dtype=torch.float32) / 255
    return torch.tensor(POINTS)


def true_radius(x0: float, noise: str) -> float:
    """The distance from x₀ to the nearest input of the other class: |x₀ − B|, and for the
    discrete noises (whose certificate is for perturbations on the grid, B = 51/255 on it) the
    nearest grid point of the other class, 52/255 − x₀ below B."""
    if noise.startswith("discrete") and x0 <= B:
        return 52 / 255 - x0
    return abs(x0 - B)


def oracle(noise="gaussian"):
    """The halfspace f(x) = [x₀ > B] along one axis: its smoothed classifier's exact radius at x
    is |x₀ − B| in L2 and in L1 (one coordinate), under Gaussian and uniform noise alike (and
    the soft smoothed classifier of its logits (−z, z) has the same decision boundary)."""
    w = torch.zeros(1, 4, 4)
    w[0, 0, 0] = 1.0
    x0 = points(noise)
    xs = torch.zeros(len(x0), 1, 4, 4)
    xs[:, 0, 0, 0] = x0
    labels = (xs[:, 0, 0, 0] > B).long()
    model = Halfspace(w, b=B, input_shape=(1, 4, 4))
    model.num_classes = 2  # what a model in a role must say (runs.inputs.load_source)
    return model, torch.utils.data.TensorDataset(xs, labels)


def run(name, noise, **kwargs):
    model, data = oracle(noise)
    models = ROLE_MODELS[name](model) if name in ROLE_MODELS else None
    return certify_dataset(model, data, certifier=name, noise=noise, sigma=0.5, n0=50, n=2000,
                           alpha=0.001, batch=500, seed=3, num_classes=2, models=models,
                           **kwargs)


def without_time(rows):
    """The rows by idx, without the wall-time column (an order-dependent certifier writes its
    rows in the order it certified them, not by idx)."""
    return [{k: v for k, v in row.items() if k != "time"}
            for row in sorted(rows, key=lambda r: r["idx"])]


@pytest.mark.parametrize(("name", "noise"), CASES)
def test_sound_on_the_halfspace_oracle(name, noise):
    rows = run(name, noise)
    x0s = points(noise).tolist()
    assert sorted(int(r["idx"]) for r in rows) == list(range(len(x0s)))
    answered = [r for r in rows if r["predict"] >= 0]
    assert answered, "every input abstained: the test would prove nothing"
    for row in answered:
        x0 = x0s[int(row["idx"])]
        assert row["predict"] == int(x0 > B), row
        if "radius" in row and row.get("guarantee") != "heuristic":
            assert row["radius"] <= true_radius(x0, noise) + 1e-9, row  # never past it
    if "radius" in CERTIFIERS[name].columns:
        assert max(r["radius"] for r in answered) > 0


@pytest.mark.parametrize(("name", "noise"), CASES)
def test_resumes_after_a_kill_to_the_rows_of_an_uninterrupted_run(name, noise, tmp_path,
                                                                   monkeypatch):
    whole = run(name, noise, out=tmp_path / "whole.tsv")
    if CERTIFIERS[name]().shardable():  # order-free answers are written in idx order
        assert [r["idx"] for r in whole] == sorted(r["idx"] for r in whole)
    restore = dying_writer(monkeypatch, rows=3, torn="5\t1\t")
    with pytest.raises(KeyboardInterrupt):
        run(name, noise, out=tmp_path / "cut.tsv")
    restore()
    resumed = run(name, noise, out=tmp_path / "cut.tsv")
    assert without_time(resumed) == without_time(whole)


@pytest.mark.parametrize(("name", "noise"), CASES)
def test_shards_merge_to_one_run_or_sharding_is_refused(name, noise, tmp_path):
    whole = run(name, noise)
    out = tmp_path / "s.tsv"
    if not CERTIFIERS[name]().shardable():
        with pytest.raises(SmoothcertError, match="needs every input in one run"):
            run(name, noise, out=out, shard=(0, 2))
        assert not list(tmp_path.iterdir())
        return
    for k in range(2):
        run(name, noise, out=out, shard=(k, 2))
    merged = merge_records([shard_path(out, k, 2) for k in range(2)], tmp_path / "m.tsv")
    assert without_time(read_records(merged).rows()) == without_time(whole)
