"""certify_dataset: the Python API over any model and dataset writes what the CLI writes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import norm

from conftest import Halfspace, write_checkpoint
from smoothcert import Gaussian, Uniform, certify_dataset
from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.runs.records import read_records

RUN = dict(n0=20, n=200, alpha=0.001, batch=128, seed=3, skip=40, max_count=5)
TIMELESS = ("idx", "label", "predict", "radius", "correct", "p_lower", "nA", "n0", "n",
            "alpha", "sigma", "seed")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("ck") / "checkpoint.pt")


def tensor_dataset(skip=1):
    digits = load_dataset("digits", "test")
    return torch.utils.data.TensorDataset(digits.images.float() / 16.0, digits.labels)


def test_tensor_dataset_equals_the_cli_record_for_record(checkpoint, tmp_path):
    cli = tmp_path / "cli.tsv"
    assert main(["certify", str(checkpoint), "--n0", "20", "--n", "200", "--batch", "128",
                 "--seed", "3", "--skip", "40", "--max", "5", "--device", "cpu",
                 "--no-progress", "--out", str(cli)]) == 0
    api = tmp_path / "api.tsv"
    rows = certify_dataset(str(checkpoint), tensor_dataset(), **RUN, out=api)
    a, b = read_records(cli), read_records(api)
    assert a.columns_order == b.columns_order and len(rows) == len(b) == 5
    for column in TIMELESS:
        assert np.array_equal(a[column], b[column]), column
    assert [int(r["idx"]) for r in rows] == list(range(0, 200, 40))
    manifest = json.loads((tmp_path / "api.tsv.manifest.json").read_text())
    assert manifest["identity"]["dataset"] == "TensorDataset"
    assert manifest["identity"]["checkpoint_sha256"] == \
        json.loads((tmp_path / "cli.tsv.manifest.json").read_text())["identity"][
            "checkpoint_sha256"]


def test_without_out_rows_equal_the_file_rows(checkpoint, tmp_path):
    in_memory = certify_dataset(str(checkpoint), tensor_dataset(), **RUN)
    on_disk = certify_dataset(str(checkpoint), tensor_dataset(), **RUN, out=tmp_path / "r.tsv")
    assert [r["nA"] for r in in_memory] == [int(r["nA"]) for r in on_disk]
    assert not list(tmp_path.glob("*.tmp"))


def test_module_closed_form_radius_and_resume(tmp_path):
    """A halfspace's smoothed classifier has the exact radius |w·x − b|/‖w‖: with n large the
    certified radius is below it and close to it; a resumed run keeps the rows; another module
    is refused."""
    w = torch.zeros(1, 4, 4)
    w[0, 0, 0] = 1.0
    model = Halfspace(w, b=0.2, input_shape=(1, 4, 4))
    xs = torch.zeros(6, 1, 4, 4)
    xs[:, 0, 0, 0] = torch.linspace(0.3, 0.8, 6)
    data = torch.utils.data.TensorDataset(xs, torch.ones(6, dtype=torch.long))
    out = tmp_path / "h.tsv"
    kwargs = dict(sigma=0.25, n0=50, n=20_000, alpha=0.001, batch=5000, num_classes=2, out=out)
    first = certify_dataset(model, data, indices=[0, 2, 4], **kwargs)
    exact = (xs[[0, 2, 4], 0, 0, 0] - 0.2).numpy()
    radii = np.array([r["radius"] for r in first])
    assert np.all(radii <= exact) and np.all(exact - radii < 0.1)
    # the same call resumes (nothing recomputed: the rows are the file's)
    again = certify_dataset(model, data, indices=[0, 2, 4], **kwargs)
    assert [r["time"] for r in again] == [r["time"] for r in first]
    other = Halfspace(2 * w, b=0.2, input_shape=(1, 4, 4))
    with pytest.raises(SmoothcertError, match="different configuration|was made with"):
        certify_dataset(other, data, indices=[0, 2, 4], **kwargs)
    # a certificate from Φ: p_A = Φ((w·x − b)/σ) at x_0 = 0.3 is Φ(0.4) ≈ 0.655
    assert abs(first[0]["nA"] / 20_000 - norm.cdf(0.4)) < 0.02


def test_noise_objects_choose_the_certifier(tmp_path):
    model = Halfspace(torch.ones(1, 2, 2), b=0.0, input_shape=(1, 2, 2))
    data = torch.utils.data.TensorDataset(torch.full((2, 1, 2, 2), 0.5), torch.ones(2).long())
    kwargs = dict(n0=10, n=500, batch=500, num_classes=2)
    g = certify_dataset(model, data, sigma=Gaussian(0.5), **kwargs)
    u = certify_dataset(model, data, sigma=Uniform(0.5), **kwargs, out=tmp_path / "u.tsv")
    manifest = json.loads((tmp_path / "u.tsv.manifest.json").read_text())
    identity = manifest["identity"]
    assert (identity["certifier"], identity["noise"]) == ("certify", "uniform")
    assert len(g) == len(u) == 2
    same = certify_dataset(model, data, sigma=Uniform(0.5), certifier="uniform", **kwargs,
                           out=tmp_path / "u.tsv")  # the same run: resumed, nothing redone
    assert [r["time"] for r in same] == [r["time"] for r in u]


def test_shards_cover_the_run(checkpoint, tmp_path):
    out = tmp_path / "s.tsv"
    parts = [certify_dataset(str(checkpoint), tensor_dataset(), **RUN, out=out, shard=(k, 2))
             for k in range(2)]
    assert sorted(int(r["idx"]) for p in parts for r in p) == list(range(0, 200, 40))
    assert (tmp_path / "s.shard0-of-2.tsv").exists() and (tmp_path / "s.shard1-of-2.tsv").exists()


@pytest.mark.parametrize("kwargs, match", [
    (dict(indices=[0, 0]), "must not repeat"),
    (dict(indices=[10_000]), "outside the dataset"),
    (dict(shard=(2, 2)), "0 <= index < count"),
    (dict(shard=3), "0 <= index < count"),
    (dict(certifier="nope"), "unknown certifier"),
    (dict(workers=-1), "workers must be"),
])
def test_bad_arguments_write_nothing(checkpoint, tmp_path, kwargs, match):
    out = tmp_path / "bad.tsv"
    with pytest.raises(SmoothcertError, match=match):
        certify_dataset(str(checkpoint), tensor_dataset(), **{**RUN, **kwargs}, out=out)
    assert not out.exists()


def test_bad_dataset_items_are_named(tmp_path):
    model = Halfspace(torch.ones(1, 2, 2), input_shape=(1, 2, 2))
    uint8 = torch.utils.data.TensorDataset(torch.zeros(2, 1, 2, 2, dtype=torch.uint8),
                                           torch.ones(2).long())
    with pytest.raises(SmoothcertError, match=r"TensorDataset\[0\] x must be a float tensor"):
        certify_dataset(model, uint8, sigma=0.5, n=10, n0=5, num_classes=2)
    with pytest.raises(SmoothcertError, match="pass sigma"):
        certify_dataset(model, uint8, n=10, n0=5, num_classes=2)
    with pytest.raises(SmoothcertError, match="num_classes"):
        certify_dataset(torch.nn.Identity(), uint8, sigma=0.5, n=10, n0=5)
