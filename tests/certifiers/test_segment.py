"""The segment certifier (``certifiers/segment.py``, Fischer et al. 2021) through
``certify_dataset``: a fully convolutional model whose pixels' smoothed class probabilities are
closed forms, the record columns (pixel counts, per-class tp/fp/fn, the ``map`` artifact),
a resume after a kill, options and refusals."""

import re

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn

from conftest import dying_writer
from smoothcert.certifiers import CERTIFIERS
from smoothcert.certifiers.columns import parse_vector
from smoothcert.certifiers.segment import SEGMENT_COLUMNS, segment_counts
from smoothcert.errors import SmoothcertError
from smoothcert.runs import certify_dataset
from smoothcert.runs.artifacts import read_artifact
from smoothcert.runs.records import merge_records, read_records, shard_path
from smoothcert.stats.segmentation import certify_pixels

SIGMA, TAU = 0.1, 0.75
R = SIGMA * norm.ppf(TAU)  # the certified radius, ≈ 0.067
IGNORE = 255


class Bands(nn.Module):
    """A 1×1 convolution with 3 classes by pixel value: logits (0, 6x − 2, 12x − 6), so class
    0 below 1/3, 1 up to 2/3, 2 above. Pixel i's class reads x_i alone, so under N(0, σ²I)
    its smoothed probabilities are closed forms in x_i (:func:`band_probability`)."""

    task = "segmentation"
    num_classes = 3

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.tensor([0.0, 6.0, 12.0]).view(3, 1, 1, 1))
            self.conv.bias.copy_(torch.tensor([0.0, -2.0, -6.0]))

    def forward(self, x):
        return self.conv(x)


def band_probability(x, c, sigma=SIGMA):
    """P(class c at a pixel of value x + σε): the normal mass of c's band."""
    edges = [-np.inf, 1 / 3, 2 / 3, np.inf]
    return norm.cdf((edges[c + 1] - x) / sigma) - norm.cdf((edges[c] - x) / sigma)


# Two 4×4 images: far inside a band (p ≥ 0.9), near an edge (p ≈ ½: must abstain); the labels
# hold right, wrong and unlabelled pixels.
VALUES = torch.tensor([[[0.0, 0.05, 0.5, 0.5], [1.0, 0.95, 0.3, 0.36],
                        [0.0, 1.0, 0.5, 0.66], [0.7, 0.64, 0.02, 1.0]],
                       [[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0],
                        [0.5, 0.5, 0.5, 0.5], [0.34, 0.33, 0.67, 0.66]]]).unsqueeze(1)
LABELS = torch.tensor([[[0, 0, 1, 2], [2, 2, IGNORE, 1], [0, 1, 1, 2], [2, 1, 0, 2]],
                       [[2, 2, IGNORE, 0], [0, 0, 0, 1], [1, 1, 1, 1], [1, 1, 2, 1]]])


class Masks(torch.utils.data.TensorDataset):
    """Images and their (H, W) masks, unlabelled pixels IGNORE (what runs/tasks.py reads)."""

    task, ignore_index = "segmentation", IGNORE


def run(out=None, options=None, **kwargs):
    data = Masks(VALUES, LABELS)
    settings = dict(n0=20, n=300, alpha=0.001, batch=256, seed=4, num_classes=3) | kwargs
    return certify_dataset(Bands(), data, certifier="segment", sigma=SIGMA, out=out,
                           options={"tau": TAU, **(options or {})}, **settings)


def test_certified_pixels_keep_their_closed_form_class_on_the_ball():
    """Each certified pixel's smoothed class is its class on [x_i − R, x_i + R] (band
    probabilities are log-concave in x_i: their least on the interval is at an end); each
    pixel with a class of probability ≥ 0.9 is certified (its votes are far past α / 16)."""
    rows = run()
    assert set(rows[0]) - {"artifacts"} == set(SEGMENT_COLUMNS)
    for row, x in zip(rows, VALUES[:, 0].numpy().reshape(2, -1)):
        cmap = row["artifacts"]["map"]
        assert cmap.dtype == np.uint8 and cmap.shape == (4, 4)
        for value, c in zip(x, cmap.reshape(-1)):
            top = max(band_probability(value, k) for k in range(3))
            if c == 255:
                assert top < 0.9, value
                continue
            assert min(band_probability(value - R, c), band_probability(value + R, c)) > 0.5
        assert row["radius"] == pytest.approx(R, rel=1e-12) and row["tau"] == TAU
        assert (row["n0"], row["n"], row["alpha"], row["sigma"]) == (20, 300, 0.001, SIGMA)
        assert row["correction"] == "holm"
    assert 0 < sum(r["certified"] for r in rows) < 32  # some pixels of each kind


def test_counts_and_per_class_vectors_are_the_maps_against_the_labels():
    for row, label in zip(run(), LABELS.numpy()):
        cmap, label = row["artifacts"]["map"].reshape(-1).astype(int), label.reshape(-1)
        labelled = label != IGNORE
        tp = [int(((cmap == c) & (label == c)).sum()) for c in range(3)]
        fp = [int(((cmap == c) & (label != c) & labelled).sum()) for c in range(3)]
        fn = [int(((cmap != c) & (label == c)).sum()) for c in range(3)]
        assert parse_vector(row["tp"]).tolist() == tp
        assert parse_vector(row["fp"]).tolist() == fp
        assert parse_vector(row["fn"]).tolist() == fn
        assert row["labelled"] == labelled.sum() and row["certified_correct"] == sum(tp)
        assert row["certified"] == (cmap != 255).sum() and \
            row["abstained"] == (cmap == 255).sum() == 16 - row["certified"]
        assert row["pixel_accuracy"] == sum(tp) / labelled.sum()
        assert row["abstain_rate"] == row["abstained"] / 16
    assert sum(parse_vector(r["fp"]).sum() for r in run()) > 0  # the wrong labels count


def test_bonferroni_certifies_a_subset_of_holm_at_the_same_draws():
    holm, bonf = run(), run(options={"correction": "bonferroni"})
    for h, b in zip(holm, bonf):
        hm, bm = h["artifacts"]["map"], b["artifacts"]["map"]
        assert ((bm == 255) | (bm == hm)).all() and b["certified"] <= h["certified"]


def test_records_hold_the_map_and_resume_after_a_kill(tmp_path, monkeypatch):
    whole = run(tmp_path / "whole.tsv")
    records = read_records(tmp_path / "whole.tsv")
    assert records.columns_order == SEGMENT_COLUMNS
    # the file keeps comma strings, the Python rows lists of ints
    assert [parse_vector(r["tp"]).tolist() for r in records.rows()] == [r["tp"] for r in whole]
    for row in whole:
        cmap = read_artifact(tmp_path / "whole.tsv", "map", row["idx"], row["map_sha256"])
        assert cmap.shape == (4, 4) and cmap.dtype == np.uint8
    restore = dying_writer(monkeypatch, rows=1, torn="1\t12\t")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut.tsv")
    restore()
    resumed = run(tmp_path / "cut.tsv")
    drop = ("time",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed] == \
        [{k: v for k, v in r.items() if k not in drop} for r in whole]


def test_shards_merge_to_one_run_with_their_maps(tmp_path):
    whole = run()
    for k in range(2):
        run(tmp_path / "s.tsv", shard=(k, 2))
    merged = merge_records([shard_path(tmp_path / "s.tsv", k, 2) for k in range(2)],
                           tmp_path / "m.tsv")
    rows = read_records(merged).rows()
    assert [r["map_sha256"] for r in rows] == [r["map_sha256"] for r in whole]
    for row, done in zip(rows, whole):
        np.testing.assert_array_equal(
            read_artifact(merged, "map", row["idx"], row["map_sha256"]),
            done["artifacts"]["map"])


def test_counts_of_a_hand_made_image():
    """3 pixels, 3 classes: certified 2 (label 2: tp), certified 0 (label 1: fp of 0, fn of 1),
    abstains (label 1: fn of 1), and an unlabelled certified pixel (in no vector)."""
    sel = np.array([[0, 0, 9], [9, 0, 0], [0, 9, 0], [9, 0, 0]])
    est = np.array([[0, 0, 100], [100, 0, 0], [0, 50, 50], [100, 0, 0]])
    c = certify_pixels(sel, est, 0.75, 0.01)
    s = segment_counts(c, np.array([2, 1, 1, IGNORE]), IGNORE, 3)
    assert c.certified.tolist() == [True, True, False, True]
    assert (s.labelled, s.certified, s.certified_correct, s.abstained) == (3, 3, 1, 1)
    assert (s.tp.tolist(), s.fp.tolist(), s.fn.tolist()) == ([0, 0, 1], [1, 0, 0], [0, 2, 0])
    assert s.pixel_accuracy == 1 / 3


def test_options_and_refusals():
    cls = CERTIFIERS["segment"]
    assert cls.tasks == ("segmentation",) and cls.noises == ("gaussian",) and cls.needs_n0
    assert cls().options() == {"tau": 0.75, "correction": "holm"}
    with pytest.raises(SmoothcertError, match="tau"):
        cls(tau=0.4)
    with pytest.raises(SmoothcertError, match="correction"):
        cls(correction="fdr")
    with pytest.raises(SmoothcertError, match="labels outside the model's 3 classes"):
        certify_dataset(Bands(), Masks(VALUES[:1], torch.full((1, 4, 4), 7)),
                        certifier="segment", sigma=SIGMA, n0=5, n=20, num_classes=3)
    with pytest.raises(SmoothcertError, match="certifies segmentation, not this classif"):
        certify_dataset(nn.Sequential(nn.Flatten(), nn.Linear(16, 3)), [(VALUES[0], 0)],
                        certifier="segment", sigma=SIGMA, n0=5, n=20, num_classes=3)


def test_a_dataset_without_an_ignore_index_labels_every_pixel():
    labels = LABELS.clone()
    labels[labels == IGNORE] = 0
    rows = certify_dataset(Bands(), type("Plain", (torch.utils.data.TensorDataset,),
                                         {"task": "segmentation"})(VALUES, labels),
                           certifier="segment", sigma=SIGMA, n0=20, n=300, alpha=0.001,
                           seed=4, num_classes=3)
    assert [r["labelled"] for r in rows] == [16, 16]


@pytest.mark.parametrize(("column", "value", "says"), [
    ("tp", "4,-2,3", "tp is one count per class"),
    ("map_sha256", "beef", "map_sha256 is a SHA-256"),
    ("correction", "fdr", "correction is one of holm, bonferroni"),
    ("radius", "0.5", "sigma * Phi^-1(tau)"),
    ("certified_correct", "14", "counts labelled pixels certified with their label"),
])
def test_a_tampered_record_is_refused_in_one_line(tmp_path, column, value, says):
    run(tmp_path / "r.tsv")
    lines = (tmp_path / "r.tsv").read_text().splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if line.startswith("idx\t"))
    cells = lines[-1].rstrip("\n").split("\t")
    cells[lines[header].rstrip("\n").split("\t").index(column)] = value
    (tmp_path / "r.tsv").write_text("".join(lines[:-1]) + "\t".join(cells) + "\n")
    with pytest.raises(SmoothcertError, match=re.escape(says)):
        read_records(tmp_path / "r.tsv")


class Shaped(Masks):
    """Masks that state their ``input_shape``, as a segfolder at its ``--image-size`` does."""

    input_shape = (1, 4, 4)


@pytest.mark.parametrize("side, smallest", [(4, 34), (64, 53)])
def test_too_few_draws_are_said_for_the_run_s_image_size(caplog, side, smallest):
    """0.75^n must reach α / (H·W) of the run's images, not of the registry's 224×224:
    n = 34 for 16 pixels, 53 for 4096 (α = 1e-3)."""
    pixels = side * side
    assert 0.75**smallest <= 1e-3 / pixels < 0.75**(smallest - 1)
    data = Shaped(VALUES, LABELS)
    data.input_shape = (1, side, side)  # what the note reads; the draws stay 4×4
    with caplog.at_level("WARNING"):
        certify_dataset(Bands(), data, certifier="segment", sigma=SIGMA, n0=20, n=10,
                        alpha=1e-3, batch=256, seed=4, num_classes=3, max_count=1,
                        options={"tau": TAU})
    assert "cannot certify any input" in caplog.text and f"{pixels} pixels" in caplog.text
    assert f"--n at least {smallest}" in caplog.text


def test_enough_draws_for_the_run_s_image_size_say_nothing(caplog):
    with caplog.at_level("WARNING"):
        certify_dataset(Bands(), Shaped(VALUES, LABELS), certifier="segment", sigma=SIGMA,
                        n0=20, n=34, alpha=1e-3, batch=256, seed=4, num_classes=3,
                        max_count=1, options={"tau": TAU})
    assert "cannot certify" not in caplog.text


def test_more_classes_than_an_8_bit_map_holds_are_refused(tmp_path):
    wide = nn.Conv2d(1, 256, 1)
    wide.task = "segmentation"
    with pytest.raises(SmoothcertError, match="at most 255 classes, got 256"):
        certify_dataset(wide, Masks(VALUES, torch.zeros(2, 4, 4, dtype=torch.long)),
                        certifier="segment", sigma=SIGMA, n0=5, n=20, num_classes=256,
                        out=tmp_path / "r.tsv")
    assert not list(tmp_path.iterdir())
