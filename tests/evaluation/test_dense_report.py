"""report's tables of segmentation and median files (evaluation/dense.py): the dataset's numbers
are sums over the images' counts, and flags of CERTIFY files are refused in one line."""

import sys
from pathlib import Path

import numpy as np
import pytest

from smoothcert.certifiers.columns import parse_vector
from smoothcert.errors import SmoothcertError
from smoothcert.evaluation.dense import summarize_median, summarize_segment
from smoothcert.evaluation.report import report
from smoothcert.runs.records import read_records

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "certifiers"))
import test_median  # noqa: E402
import test_segment  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dense")
    test_segment.run(out=folder / "seg.tsv")
    test_median.run(out=folder / "med.tsv")
    return folder / "seg.tsv", folder / "med.tsv"


def test_segment_summary_sums_the_images_counts(files):
    r = read_records(files[0])
    s = summarize_segment(r)
    assert s.pixel_accuracy == r["certified_correct"].sum() / r["labelled"].sum()
    assert s.abstain_rate == r["abstained"].sum() / (16 * len(r))
    tp, fp, fn = (sum(parse_vector(c) for c in r[k]) for k in ("tp", "fp", "fn"))
    present = tp + fn > 0
    assert np.isclose(s.miou, np.mean((tp / (tp + fp + fn))[present]))
    assert "| seg |" in report([files[0]], "0")


def test_median_summary_is_the_mean_width_per_eps(files):
    r = read_records(files[1])
    s = summarize_median(r)
    widths = np.stack([parse_vector(u) - parse_vector(lo)
                       for u, lo in zip(r["upper"], r["lower"])])
    assert np.allclose(s.width, widths.mean(axis=(0, 2)))
    assert "w@" in report([files[1]], "0")


def test_flags_of_certify_files_and_mixed_files_are_refused(files, tmp_path):
    with pytest.raises(SmoothcertError, match="--envelope needs CERTIFY record files"):
        report([files[0]], "0", envelope=True)
    with pytest.raises(SmoothcertError, match="--plot needs CERTIFY"):
        report([files[1]], "0", plot=tmp_path / "p.png")
    with pytest.raises(SmoothcertError, match="cannot share one table"):
        report(list(files), "0")
