"""Metrics against hand-computed golden numbers on a hand-written Cohen et al. record file."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import COHEN_ROWS, GRID
from smoothcert.errors import SmoothcertError
from smoothcert.evaluation.metrics import (
    abstention_rate,
    average_certified_radius,
    certified_accuracy,
    certified_accuracy_curve,
    clean_accuracy,
    parse_radii,
    summarize,
)
from smoothcert.runs.records import read_records

# Correct examples' radii: 0.25, 0.5, 1.2, 0.1, 0.75 (5 of 8). Certified at r = #{radius >= r}/8:
#   r=0: 5/8 = 0.625;  r=0.25: {0.25, 0.5, 1.2, 0.75} 4/8 = 0.5;
#   r=0.5: {0.5, 1.2, 0.75} 3/8 = 0.375;  r=0.75: {1.2, 0.75} 2/8 = 0.25;
#   r=1.0: {1.2} 1/8 = 0.125;  r=1.25: none, 0.0
EXPECTED_CA = [0.625, 0.5, 0.375, 0.25, 0.125, 0.0]
# ACR = (0.25 + 0.5 + 1.2 + 0.1 + 0.75) / 8 = 2.8 / 8 (the wrong 0.8 and abstentions count 0)
EXPECTED_ACR = 0.35
EXPECTED_ABSTAIN = 0.25  # 2 of 8
EXPECTED_CLEAN = 0.625  # 5 of 8
# Times 1.5 + 2.5 + 1 + 3 + 2 + 1 + 0.5 + 60.5 = 72 s over 8 examples
EXPECTED_TIME = 9.0


def write_tsv(path, header, rows):
    lines = ["\t".join(header)] + ["\t".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def cohen(tmp_path):
    header = ("idx", "label", "predict", "radius", "correct", "time")
    return read_records(write_tsv(tmp_path / "cohen_noise_0.25.tsv", header, COHEN_ROWS))


def test_certified_accuracy_matches_hand_computation(cohen):
    acc = certified_accuracy(cohen, GRID)
    assert acc.dtype == np.float64 and acc.shape == (len(GRID),)
    np.testing.assert_array_equal(acc, EXPECTED_CA)  # k/8 are exact binary fractions


def test_scalar_metrics_match_hand_computation(cohen):
    assert average_certified_radius(cohen) == pytest.approx(EXPECTED_ACR, rel=1e-12)
    assert abstention_rate(cohen) == EXPECTED_ABSTAIN
    assert clean_accuracy(cohen) == EXPECTED_CLEAN
    assert clean_accuracy(cohen) == certified_accuracy(cohen, [0.0])[0]


def test_summary(cohen):
    s = summarize(cohen, GRID)
    assert s.name == "cohen_noise_0.25" and s.count == 8
    assert s.radii == GRID and s.certified_accuracy == tuple(EXPECTED_CA)
    assert s.acr == pytest.approx(EXPECTED_ACR, rel=1e-12)
    assert (s.clean_accuracy, s.abstention_rate) == (EXPECTED_CLEAN, EXPECTED_ABSTAIN)
    assert s.mean_time == pytest.approx(EXPECTED_TIME, rel=1e-12)
    with pytest.raises(AttributeError):
        s.count = 3  # frozen


def test_curve_is_the_exact_step_function(cohen):
    r, acc = certified_accuracy_curve(cohen)
    np.testing.assert_array_equal(r, [0.0, 0.1, 0.25, 0.5, 0.75, 1.2])  # 0.8 is wrong: absent
    np.testing.assert_array_equal(acc, [5 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8])
    # between breakpoints the value is that of the right end: r in (0.5, 0.75] → CA(0.75)
    assert certified_accuracy(cohen, [0.6])[0] == acc[4]


def test_predict_file_has_no_radius_metrics(tmp_path):
    header = ("idx", "label", "predict", "correct", "time", "count", "runner_up", "pvalue", "n",
              "alpha", "sigma", "seed")
    rows = [
        (0, 1, 1, 1, 0.5, 90, 5, 1e-20, 100, 0.001, 0.25, 0),
        (1, 2, -1, 0, 0.5, 50, 48, 0.9, 100, 0.001, 0.25, 0),
        (2, 3, 4, 0, 0.5, 80, 10, 1e-10, 100, 0.001, 0.25, 0),
        (3, 5, 5, 1, 0.5, 99, 1, 1e-25, 100, 0.001, 0.25, 0),
    ]
    s = summarize(read_records(write_tsv(tmp_path / "pred.tsv", header, rows)), GRID)
    assert (s.clean_accuracy, s.abstention_rate) == (0.5, 0.25)  # 2 of 4 right, 1 of 4 abstained
    assert s.acr is None and s.certified_accuracy == () and not s.has_radius


def test_empty_record_file_raises(tmp_path):
    header = ("idx", "label", "predict", "radius", "correct", "time")
    records = read_records(write_tsv(tmp_path / "empty.tsv", header, []))
    for fn in (average_certified_radius, abstention_rate, clean_accuracy):
        with pytest.raises(SmoothcertError, match="no rows"):
            fn(records)
    with pytest.raises(SmoothcertError, match="no rows"):
        certified_accuracy(records, GRID)
    with pytest.raises(SmoothcertError, match="no rows"):
        summarize(records, GRID)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0:1:0.25", (0.0, 0.25, 0.5, 0.75, 1.0)),
        ("0:0.5:0.1", (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)),
        ("0.5:1.5:0.5", (0.5, 1.0, 1.5)),
        ("0:1:0.3", (0.0, 0.3, 0.6, 0.9)),  # stop not on the grid: not included
        ("0:0:1", (0.0,)),
        (" 0:4:0.5 ", tuple(0.5 * i for i in range(9))),
        ("0,0.5,1", (0.0, 0.5, 1.0)),
        ("0.25", (0.25,)),
        ("1, 0.5", (1.0, 0.5)),  # a list keeps the order given
    ],
)
def test_parse_radii(text, expected):
    assert parse_radii(text) == expected


def test_parse_radii_has_no_accumulated_error():
    radii = parse_radii("0:0.5:0.1")
    assert len(radii) == 6 and radii[3] == 0.3 and repr(radii[3]) == "0.3"
    assert parse_radii("0:2:0.1")[-1] == 2.0 and len(parse_radii("0:2:0.1")) == 21


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("a:1:0.1", "not a number"),
        ("0,x,1", "not a number"),
        ("0,,1", "not a number"),
        ("0:1:0", "step must be positive"),
        ("0:1:-0.25", "step must be positive"),
        ("1:0:0.25", "below start"),
        ("0:1", "start:stop:step"),
        ("0:1:0.1:2", "start:stop:step"),
        ("-0.5,0", "negative"),
        ("-1:1:0.5", "negative"),
        ("0,nan", "finite"),
        ("0:inf:1", "finite"),
        ("0,0.5,0.5", "only once"),
        ("0:1000:1e-6", "at most"),
    ],
)
def test_parse_radii_rejects_bad_text(text, message):
    with pytest.raises(SmoothcertError, match=message) as info:
        parse_radii(text)
    assert "\n" not in str(info.value)
