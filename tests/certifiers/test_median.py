"""The median certifier (``certifiers/median.py``): its options, and runs through
``certify_dataset`` on a linear regression model whose smoothed median is known in closed form
(every certified interval holds the true percentile's range over the ball), through a record
file, a kill and its resume, shards and a merge; a classification model and another noise are
refused."""

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from conftest import Halfspace, dying_writer
from smoothcert.certifiers import CERTIFIERS
from smoothcert.certifiers.columns import parse_vector
from smoothcert.certifiers.median import parse_eps
from smoothcert.errors import SmoothcertError
from smoothcert.registry import parse_options
from smoothcert.runs import certify_dataset
from smoothcert.runs.records import merge_records, read_records, shard_path
from smoothcert.runs.rows import python_row
from smoothcert.stats.median import order_indices

pytestmark = pytest.mark.filterwarnings(
    "ignore::smoothcert.smoothing.smoothed.InputRangeWarning")

SIGMA, N, ALPHA, EPS = 0.25, 300, 0.01, (0.1, 0.36, 2.0)


class Linear(nn.Module):
    """f(x) = W x + b, D = 3 outputs: under N(0, σ²I) output d is N(w_d·x + b_d, σ²‖w_d‖²),
    whose median at x + δ is w_d·(x + δ) + b_d, within ε‖w_d‖ of its value at x on the ball."""

    task = "regression"

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = nn.Parameter(torch.randn(3, 16, generator=g) * 0.5)
        self.bias = nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))

    def forward(self, x):
        return x.flatten(1) @ self.weight.T + self.bias


def data():
    g = torch.Generator().manual_seed(1)
    xs, labels = torch.rand(4, 1, 4, 4, generator=g), torch.randn(4, 3, generator=g) * 0.1
    dataset = torch.utils.data.TensorDataset(xs, labels)
    dataset.task = "regression"  # what a registered dataset's spec says
    return dataset


def run(out=None, **kwargs):
    options = {"eps": ",".join(map(str, EPS)), **kwargs.pop("options", {})}
    return certify_dataset(Linear(), data(), sigma=SIGMA, certifier="median", n=N,
                           alpha=ALPHA, batch=128, seed=3, num_classes=3, out=out,
                           options=options, **kwargs)


def without_time(rows):
    return [{k: v for k, v in r.items() if k != "time"}
            for r in sorted(rows, key=lambda r: r["idx"])]


def test_options():
    median = CERTIFIERS["median"]
    assert median.tasks == ("regression",) and not median.needs_n0
    assert parse_eps("0.1,0.25,0.5") == (0.1, 0.25, 0.5)
    for bad in ("", "0.1,x", "-0.1", "0.5,0.25", "0.1,inf"):
        with pytest.raises(SmoothcertError, match="median eps"):
            parse_eps(bad)
    with pytest.raises(SmoothcertError, match="percentile"):
        median(percentile=1.0)
    with pytest.raises(SmoothcertError):
        median(correction="holm")


@pytest.mark.parametrize("typed, says", [  # --opt eps=TYPED: each VALUE as the CLI's YAML reads it
    ("0.5,", "median eps '0.5,' has an empty item"),
    ("nan", "median eps must be finite numbers >= 0, got 'nan'"),
    ("inf", "median eps must be finite numbers >= 0, got 'inf'"),
    ("", "median eps is empty"),
    ("0.1,x", "median eps: 'x' is not a number"),
    ("-1", "median eps must be finite numbers >= 0"),
    ("true", "median eps: 'True' is not a number"),
])
def test_eps_as_typed_on_the_command_line_says_what_is_wrong(typed, says):
    with pytest.raises(SmoothcertError, match=re.escape(says)):
        parse_options("certifier", "median", CERTIFIERS["median"].Options,
                      {"eps": yaml.safe_load(typed)})


@pytest.mark.parametrize("typed, eps", [("0.1", "0.1"), ("0", "0.0"), ("[0.1, 0.2]", "0.1,0.2"),
                                        ("0.1,0.25", "0.1,0.25")])
def test_one_eps_or_a_list_is_taken(typed, eps):
    """One ε was refused as "eps must be a string, got 0.1" (YAML reads 0.1 as a number)."""
    options = parse_options("certifier", "median", CERTIFIERS["median"].Options,
                            {"eps": yaml.safe_load(typed)})
    assert options.eps == eps and parse_eps(options.eps) == tuple(map(float, eps.split(",")))


def test_intervals_hold_the_true_median_over_each_ball(tmp_path, monkeypatch):
    rows = run(tmp_path / "r.tsv")
    model, (xs, labels) = Linear(), data().tensors
    with torch.no_grad():
        truth = model(xs).double().numpy()  # the smoothed median at x: the model at x
    norms = model.weight.detach().double().norm(dim=1).numpy()
    eps = np.array(EPS)[:, None]
    assert [r["idx"] for r in rows] == [0, 1, 2, 3]
    for r, centre, label in zip(rows, truth, labels):
        lower, upper = parse_vector(r["lower"]), parse_vector(r["upper"])
        assert lower.shape == upper.shape == (3, 3)
        assert (lower <= centre - eps * norms).all() and (upper >= centre + eps * norms).all()
        assert np.isneginf(lower[2]).all() and np.isposinf(upper[2]).all()  # ε = 8σ: no bound
        assert (upper[:2] - lower[:2] < 2 * eps[:2] * norms + 1.5 * SIGMA * norms).all()
        assert np.abs(parse_vector(r["median"]) - centre).max() < 0.3 * SIGMA * norms.max()
        np.testing.assert_allclose(parse_vector(r["target"]), label.numpy(), rtol=1e-6)
        assert parse_vector(r["eps"]).tolist() == list(EPS)
        assert (r["percentile"], r["n"], r["alpha"], r["sigma"]) == (0.5, N, ALPHA, SIGMA)
        assert "label" not in r
    found = order_indices(N, 0.5, EPS[0] / SIGMA, ALPHA / (2 * 3 * 3))  # bonferroni: α/(2·D·E)
    assert 1 <= found.k_lower < found.k_upper <= N
    restore = dying_writer(monkeypatch, rows=2, torn="2\t0.1,0.2")  # killed mid-row
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut.tsv")
    restore()
    resumed = run(tmp_path / "cut.tsv")  # rows 0, 1 read back through the vector columns
    assert without_time(resumed) == without_time(rows)


def test_shards_merge_to_the_whole_run(tmp_path):
    whole = run()
    out = tmp_path / "s.tsv"
    for k in range(2):
        run(out, shard=(k, 2))
    merged = [python_row(r) for r in read_records(merge_records(
        [shard_path(out, k, 2) for k in range(2)], tmp_path / "m.tsv")).rows()]
    assert without_time(merged) == without_time(whole)


def test_correction_none_is_narrower():
    joint = run(options={"correction": "bonferroni"}, max_count=1)[0]
    each = run(options={"correction": "none"}, max_count=1)[0]
    assert parse_vector(joint["median"]).tolist() == parse_vector(each["median"]).tolist()
    assert (parse_vector(each["lower"])[:2] >= parse_vector(joint["lower"])[:2]).all()
    assert (parse_vector(each["upper"])[:2] <= parse_vector(joint["upper"])[:2]).all()


def test_refuses_a_classifier_and_other_noises():
    xs = torch.rand(2, 1, 4, 4)
    with pytest.raises(SmoothcertError, match="regression|task"):
        certify_dataset(Halfspace(torch.ones(16)), torch.utils.data.TensorDataset(
            xs, torch.tensor([0, 1])), sigma=SIGMA, certifier="median", n=50, num_classes=2)
    with pytest.raises(SmoothcertError, match="gaussian|noise"):
        run(noise="uniform")


def test_a_note_names_the_radii_no_order_statistic_bounds(caplog):
    median = CERTIFIERS["median"](eps="0.1,0.5,2")
    with caplog.at_level("WARNING"):
        median.check(SimpleNamespace(n=N, alpha=ALPHA, sigma=SIGMA))
    assert "bounds no percentile at eps 2 (sigma 0.25)" in caplog.text
    caplog.clear()
    median = CERTIFIERS["median"](eps="0.1,0.5")
    with caplog.at_level("WARNING"):
        median.check(SimpleNamespace(n=N, alpha=ALPHA, sigma=SIGMA))
    assert caplog.text == ""
