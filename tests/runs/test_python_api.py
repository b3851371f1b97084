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

import pytest
import torch

from conftest import Halfspace
from smoothcert import Smoothed, certify_dataset

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
