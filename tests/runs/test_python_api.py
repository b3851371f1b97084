"""What the Python API says that the CLI cannot get wrong (Step 15, issue 36 item 2).

Inputs outside [0, 1]: the certificate still holds for the x given (the theorem is about g on
all of R^d, and the halfspace oracles of this suite use points such as −0.5), but its radius
is then in the units of x, not in pixels: an image in [0, 255] gets radii 255 times too small
to compare, a normalized one radii in standard deviations. ``Smoothed.predict``/``certify``
and ``certify_dataset`` warn (``InputRangeWarning``, a ``UserWarning``), once per call or run.

Rows: ``certify_dataset`` returns plain Python scalars (int, float, str), with a record file
and without, so ``json.dumps(rows)`` works and the two return the same types.
"""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest
import torch

from conftest import Halfspace
from smoothcert import SmoothcertError, Smoothed, certify_dataset

SHAPE = (1, 2, 2)


def model():
    return Halfspace(torch.ones(SHAPE), b=1.0, input_shape=SHAPE)


def data(*values):
    return [(torch.full(SHAPE, v), int(v * 4 > 1.0)) for v in values]


@pytest.mark.parametrize("x, span", [(200.0, "[200, 200]"), (-0.5, "[-0.5, -0.5]")])
@pytest.mark.parametrize("algorithm", ["certify", "predict"])
def test_smoothed_warns_when_an_input_leaves_the_unit_range(x, span, algorithm):
    smoothed = Smoothed(model(), 0.25, 2)
    said = re.escape(f"input values span {span}, outside [0, 1]")
    with pytest.warns(UserWarning, match=said) as seen:
        if algorithm == "certify":
            smoothed.certify(torch.full(SHAPE, x), 10, 50, 0.001, 64, generator=0)
        else:
            smoothed.predict(torch.full(SHAPE, x), 50, 0.001, 64, generator=0)
    (warning,) = seen
    assert "x / 255" in str(warning.message) and "\n" not in str(warning.message)
    assert warning.filename == __file__  # points at the caller's line, not the library's


def test_inputs_inside_the_unit_range_are_silent():
    smoothed = Smoothed(model(), 0.25, 2)
    edges = torch.tensor([0.0, 1.0, 0.5, 1.0]).view(SHAPE)  # both ends are inside
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        smoothed.certify(edges, 10, 50, 0.001, 64, generator=0)
        smoothed.predict(edges, 50, 0.001, 64, generator=0)
        certify_dataset(model(), data(0.0, 0.5, 1.0), sigma=0.25, n0=10, n=50, num_classes=2)


def test_certify_dataset_warns_once_naming_the_first_example_outside(tmp_path):
    examples = data(0.5, 0.25) + [(torch.full(SHAPE, 255.0), 1), (torch.full(SHAPE, -2.0), 0)]
    with pytest.warns(UserWarning) as seen:
        rows = certify_dataset(model(), examples, sigma=0.25, n0=10, n=50, num_classes=2,
                               out=tmp_path / "r.tsv")
    said = [str(w.message) for w in seen if "outside [0, 1]" in str(w.message)]
    assert len(said) == 1 and len(rows) == 4  # warned, not refused: the rows are written
    assert said[0].startswith("example 2: input values span [255, 255], outside [0, 1]")


@pytest.mark.parametrize("certifier", ["certify", "predict", "lbound"])
def test_rows_are_json_ready_python_scalars_with_and_without_a_file(tmp_path, certifier):
    run = dict(sigma=0.25, n0=10, n=60, num_classes=2, certifier=certifier, seed=1)
    kept = certify_dataset(model(), data(0.0, 0.5), **run)
    filed = certify_dataset(model(), data(0.0, 0.5), **run, out=tmp_path / "r.tsv")
    for rows in (kept, filed):
        json.dumps(rows)  # a numpy int64 is not JSON serialisable
        for row in rows:
            assert all(type(v) in (int, float, str) for v in row.values()), row
    assert [{k: type(v) for k, v in r.items()} for r in kept] == \
        [{k: type(v) for k, v in r.items()} for r in filed]
    assert [{k: v for k, v in r.items() if k != "time"} for r in kept] == \
        [{k: v for k, v in r.items() if k != "time"} for r in filed]


# --------------------------------------------------------------------------- issue 45
class Bands(torch.nn.Module):
    """A 1×1 convolution with 3 classes by pixel value (below 1/3, up to 2/3, above): a
    segmentation model whose pixels read their own value."""

    task, num_classes = "segmentation", 3

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 3, 1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor([0.0, 6.0, 12.0]).view(3, 1, 1, 1))
            self.conv.bias.copy_(torch.tensor([0.0, -2.0, -6.0]))

    def forward(self, x):
        return self.conv(x)


class Masks(torch.utils.data.TensorDataset):
    task, ignore_index = "segmentation", 255


def masks():
    values = torch.tensor([[0.0, 0.05, 0.5, 0.95], [1.0, 0.1, 0.9, 0.5]]).view(2, 1, 1, 4)
    labels = torch.tensor([[0, 0, 1, 2], [2, 1, 255, 1]]).view(2, 1, 4)
    return Masks(values, labels)


def test_segmentation_rows_hold_per_class_counts_as_lists_of_ints(tmp_path):
    """A Python caller reads a segmentation's per-class ``tp``, ``fp``, ``fn`` as lists of ints
    (they were the record cells' text "2,1,0"), with a file and without, while the file keeps
    its cells."""
    run = dict(certifier="segment", sigma=0.1, n0=20, n=300, alpha=0.001, num_classes=3,
               options={"tau": 0.75})
    kept = certify_dataset(Bands(), masks(), **run)
    filed = certify_dataset(Bands(), masks(), **run, out=tmp_path / "seg.tsv")
    for rows in (kept, filed):
        for row in rows:
            for column in ("tp", "fp", "fn"):
                assert type(row[column]) is list and len(row[column]) == 3, row[column]
                assert all(type(v) is int and v >= 0 for v in row[column]), row[column]
            assert sum(row["tp"]) == row["certified_correct"]
        json.dumps([{k: v for k, v in r.items() if k != "artifacts"} for r in rows])
    assert [[r[c] for c in ("tp", "fp", "fn")] for r in kept] == \
        [[r[c] for c in ("tp", "fp", "fn")] for r in filed]
    header, *lines = (tmp_path / "seg.tsv").read_text().splitlines()
    cells = dict(zip(header.split("\t"), lines[0].split("\t")))
    assert cells["tp"] == ",".join(map(str, filed[0]["tp"]))  # the file: "a,b,c"


def test_median_rows_hold_their_intervals_as_lists(tmp_path):
    """Every vector column reads the same way: median smoothing's radii, outputs and
    intervals (one row per radius, ±inf where no order statistic bounds a side)."""
    from smoothcert.certifiers.columns import parse_vector

    class Sums(torch.nn.Module):
        task = "regression"

        def forward(self, x):
            return torch.stack([x.flatten(1).sum(1), -x.flatten(1).sum(1)], dim=1)

    data = torch.utils.data.TensorDataset(torch.full((1, *SHAPE), 0.25),
                                          torch.tensor([[1.0, -1.0]]))
    data.task = "regression"
    row, = certify_dataset(Sums(), data, certifier="median", sigma=0.25, n=200, alpha=0.01,
                           num_classes=2, options={"eps": "0.1,4"}, out=tmp_path / "m.tsv")
    assert row["eps"] == [0.1, 4.0] and row["target"] == [1.0, -1.0]
    assert [len(r) for r in row["lower"]] == [2, 2] and row["lower"][1] == [-np.inf] * 2
    assert all(type(v) is float for v in row["median"])
    np.testing.assert_array_equal(parse_vector(row["upper"]), np.array(row["upper"]))


@pytest.mark.parametrize("given, said", [
    (dict(models="core"), r"^models must be a dict of role -> model, e\.g\. \{'core': model\} "
                          r"for certifier 'aces'; got str 'core'$"),
    (dict(models=["core"]), "models must be a dict of role -> model"),
    (dict(options=["th=0.5"]), r"^options must be a dict of name -> value of the certifier's "
                               r"options, e\.g\. \{'th': 0\.5\} for 'dsrs'; got list"),
    (dict(options="th=0.5"), "options must be a dict"),
    (dict(options={3: 0.5}), "options must be a dict .*; its key 3 is not a name"),
    (dict(engine=["compile"]), "engine must be a dict of setting -> value"),
    (dict(tune=3), "tune must be a smoothcert.smoothing.probe.Tuning"),
    (dict(device="gpu"), "device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got 'gpu'"),
    (dict(device=[0]), "device must be 'cpu', 'cuda'"),
    (dict(indices=3), "indices must be a non-empty list of integers >= 0"),
])
def test_certify_dataset_refuses_arguments_of_the_wrong_type_in_one_line(given, said,
                                                                         tmp_path):
    """Issue 45: ``models='core'`` and ``options=['th=0.5']`` were dict()'s ValueError
    ("dictionary update sequence element #0 has length 6"), ``tune=3`` an AttributeError,
    ``device='gpu'`` torch's RuntimeError, ``indices=3`` a TypeError; nothing is written."""
    out = tmp_path / "r.tsv"
    with pytest.raises(SmoothcertError, match=said) as error:
        certify_dataset(model(), data(0.0, 0.5), sigma=0.25, n0=10, n=50, num_classes=2,
                        out=out, **given)
    assert "\n" not in str(error.value) and not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA has the device")
def test_a_cuda_device_on_a_machine_without_cuda_is_one_line():
    with pytest.raises(SmoothcertError, match="device 'cuda' needs CUDA, which this machine "
                                              "has not; use device='cpu'"):
        certify_dataset(model(), data(0.0), sigma=0.25, n0=10, n=50, num_classes=2,
                        device="cuda")
