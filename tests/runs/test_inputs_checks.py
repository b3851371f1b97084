"""What ``certify_dataset`` checks before (or while) it writes (step 13, items 4, 5.4, 5.8,
5.9): labels outside the model's classes are refused before the first row, so the record file
stays readable; numpy numbers are numbers; a model of non-finite logits writes no row; a σ other
than the checkpoint's training σ is noted in one line."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from conftest import Halfspace, write_checkpoint
from smoothcert import SmoothcertError, certify_dataset
from smoothcert.cli.app import main
from smoothcert.runs.inputs import ModelSource, sigma_and_noise
from smoothcert.runs.records import read_records

RUN = dict(sigma=0.5, n0=10, n=100, batch=100, num_classes=2)


def halfspace():
    return Halfspace(torch.ones(1, 2, 2), input_shape=(1, 2, 2))


def items(labels):
    return [(torch.full((1, 2, 2), 0.25 * (i % 4)), y) for i, y in enumerate(labels)]


class Streamed(torch.utils.data.Dataset):
    """A map-style dataset whose labels are known only by reading its examples."""

    def __init__(self, labels):
        self.items = items(labels)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        return self.items[idx]


@pytest.mark.parametrize("dataset", [
    items([1, 0, -1, 1]),
    torch.utils.data.TensorDataset(torch.zeros(4, 1, 2, 2), torch.tensor([1, 0, -1, 1])),
])
def test_a_negative_label_is_refused_before_the_file_is_opened(dataset, tmp_path):
    # before: every row was written, then reading the file back failed ("label is -1"), and
    # report, merge and a rerun stopped at that line until the file was deleted by hand
    out = tmp_path / "r.tsv"
    with pytest.raises(SmoothcertError, match=r"\[2\] has label -1, outside the model's 2 "
                                              r"classes 0\.\.1"):
        certify_dataset(halfspace(), dataset, **RUN, out=out)
    assert not out.exists()


def test_a_label_beyond_the_classes_is_refused_not_counted_wrong(tmp_path):
    # before: label 42 of 10 classes was certified and reported as 0% accuracy
    dataset = [(torch.zeros(1, 8, 8), 0), (torch.zeros(1, 8, 8), 42)]
    with pytest.raises(SmoothcertError, match=r"\[1\] has label 42, outside the model's 10 "):
        certify_dataset(str(write_checkpoint(tmp_path / "ck.pt")), dataset, n0=10, n=100,
                        batch=100, out=tmp_path / "r.tsv")
    assert not (tmp_path / "r.tsv").exists()


def test_labels_read_with_their_examples_stop_the_run_before_their_row(tmp_path):
    out = tmp_path / "r.tsv"
    with pytest.raises(SmoothcertError, match=r"Streamed\[3\] has label 2, outside"):
        certify_dataset(halfspace(), Streamed([1, 0, 1, 2]), **RUN, out=out)
    records = read_records(out)  # still readable: it holds only rows of valid labels
    assert set(records["label"].tolist()) <= {0, 1} and 3 not in records["idx"].tolist()
    rows = certify_dataset(halfspace(), Streamed([1, 0, 1, 0]), **RUN, out=out)  # resumes
    assert [int(r["idx"]) for r in rows] == [0, 1, 2, 3]


def test_numpy_numbers_and_labels_are_numbers(tmp_path):
    plain = certify_dataset(halfspace(), items([1, 0, 1]), **RUN)
    numpy = certify_dataset(
        halfspace(), items([np.int64(1), np.int32(0), np.int64(1)]), sigma=np.float32(0.5),
        n0=np.int64(10), n=np.int64(100), batch=np.int32(100), num_classes=np.int64(2),
        alpha=np.float64(0.001), seed=np.int64(0), indices=np.arange(3), shard=(np.int64(0), 1),
        out=tmp_path / "r.tsv")  # the manifest is JSON: numpy scalars would not serialise
    assert [r["nA"] for r in plain] == [int(r["nA"]) for r in numpy]
    identity = json.loads((tmp_path / "r.tsv.manifest.json").read_text())["identity"]
    assert identity["n"] == 100 and identity["sigma"] == 0.5


class NaNWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)
        nn.init.constant_(self.linear.weight, float("nan"))

    def forward(self, x):
        return self.linear(x.flatten(1))


def test_a_model_of_nan_weights_writes_no_row(tmp_path):
    # before: every input was certified as class 0 at radius 0.375 (argmax of NaN is 0)
    out = tmp_path / "r.tsv"
    with pytest.raises(SmoothcertError, match=r"NaN/inf logits for 110 of 110 noisy copies of "
                                              r"input 0"):
        certify_dataset(NaNWeights(), items([0, 1]), **RUN, out=out)
    assert len(read_records(out)) == 0


def test_progress_must_be_a_mode(tmp_path):
    with pytest.raises(SmoothcertError, match="progress must be True, False, 'bar' or 'lines'"):
        certify_dataset(halfspace(), items([0]), **RUN, progress="yes", out=tmp_path / "r.tsv")
    assert not (tmp_path / "r.tsv").exists()


# --------------------------------------------------------------------------- σ note
def source(meta):
    return ModelSource(halfspace(), meta, 2, "0" * 64, "ck.pt", torch.device("cpu"))


TRAINED = {"noise": {"name": "gaussian", "sigma": 0.25}, "dataset": "digits"}


@pytest.mark.parametrize("meta, sigma, noise, denoised, note", [
    (TRAINED, 0.5, None, False, "certifying with sigma 0.5; the checkpoint ck.pt was trained "
                                "with gaussian noise at sigma 0.25"),
    (TRAINED, 0.5, "uniform", False, "certifying with uniform noise at sigma 0.5; the "
                                     "checkpoint ck.pt was trained with gaussian noise at "
                                     "sigma 0.25"),
    (TRAINED, 0.25, "uniform", False, None),  # a comparison of noises at the training σ
    (TRAINED, None, None, False, None),  # the checkpoint's own σ
    (TRAINED, 0.25, "gaussian", False, None),
    (TRAINED, 0.5, None, True, None),  # behind a denoiser the classifier is clean by design
    ({"dataset": "digits"}, 0.5, None, False, None),  # a standard (noise-free) checkpoint
    ({}, 0.5, None, False, None),  # a module: no training σ known
])
def test_a_sigma_other_than_the_training_sigma_is_noted(caplog, meta, sigma, noise, denoised,
                                                        note):
    with caplog.at_level(logging.WARNING):
        sigma_and_noise(sigma, noise, source(meta), denoised=denoised)
    notes = [r.getMessage() for r in caplog.records]
    assert notes == ([f"note: {note}"] if note else [])


def test_the_cli_notes_another_sigma_in_one_line(tmp_path, caplog):
    # a logging warning: one line on stderr where logging is not configured, as in the CLI
    checkpoint = write_checkpoint(tmp_path / "ck.pt")  # trained at σ = 0.25
    args = ["certify", str(checkpoint), "--n0", "5", "--n", "20", "--max", "1", "--device",
            "cpu", "--no-progress"]
    with caplog.at_level(logging.WARNING, logger="smoothcert.runs.inputs"):
        assert main(args + ["--sigma", "0.5", "--out", str(tmp_path / "a.tsv")]) == 0
        assert main(args + ["--out", str(tmp_path / "b.tsv")]) == 0
    (note,) = [r.getMessage() for r in caplog.records if r.name == "smoothcert.runs.inputs"]
    assert "\n" not in note and "sigma 0.5" in note and "sigma 0.25" in note


# --- a train run folder names its checkpoint (item 4) -----------------------------------------

CLI_RUN = ["--sigma", "0.25", "--n0", "10", "--n", "100", "--batch", "100", "--max", "2",
           "--no-progress", "--device", "cpu"]


def test_certify_takes_a_train_run_folder_for_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_checkpoint(run / "checkpoint.pt")
    by_folder, by_file = tmp_path / "folder.tsv", tmp_path / "file.tsv"
    assert main(["certify", str(run), *CLI_RUN, "--out", str(by_folder)]) == 0
    assert main(["certify", str(run / "checkpoint.pt"), *CLI_RUN, "--out", str(by_file)]) == 0
    # the same model, so the same identity (the checkpoint's hash) and the same rows
    ids = [json.loads((tmp_path / f"{n}.tsv.manifest.json").read_text())["identity"]
           for n in ("folder", "file")]
    assert ids[0] == ids[1]
    assert by_folder.read_text().splitlines()[0] == by_file.read_text().splitlines()[0]
    rows = [[{k: v for k, v in r.items() if k != "time"} for r in read_records(p).rows()]
            for p in (by_folder, by_file)]
    assert len(rows[0]) == 2 and rows[0] == rows[1]


def test_certify_on_a_folder_without_a_checkpoint_says_what_it_holds(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.tsv").write_text("epoch\n")
    assert main(["certify", str(run), *CLI_RUN, "--out", str(tmp_path / "r.tsv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "checkpoint.pt" in err and "log.tsv" in err
    assert not (tmp_path / "r.tsv").exists()


class Boxes(nn.Module):
    """A regression model of 4 outputs (what ``lenet_box`` is)."""

    task, num_classes = "regression", 4

    def forward(self, x):
        return x.flatten(1)[:, :4]


class TenClasses(torch.utils.data.TensorDataset):
    num_classes = 10


def test_a_model_of_another_task_is_told_so_before_its_classes(tmp_path):
    """A box model on a 10-class dataset: the mismatch is the task (it said "num_classes
    mismatch: the model has 4 classes"), and the run's small n says no note before it."""
    data = TenClasses(torch.rand(2, 1, 4, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(SmoothcertError, match="is a regression model but dataset .* is for "
                                              "classification"):
        certify_dataset(Boxes(), data, certifier="median", sigma=0.25, n=10,
                        out=tmp_path / "r.tsv")
    assert not list(tmp_path.iterdir())


def test_changed_classes_are_said_in_the_dataset_s_words():
    """Not "class folders" (a segfolder has none): the dataset's classes."""
    from smoothcert.runs.inputs import check_compatible

    source = ModelSource(model=nn.Identity(), meta={"classes": ["a", "b"]}, num_classes=2,
                         sha256="0" * 64, label="m.pt", device=torch.device("cpu"))
    data = SimpleNamespace(num_classes=2, classes=["a", "c"], input_shape=None, name="segfolder")
    with pytest.raises(SmoothcertError, match=r"differ from the 2 classes of 'segfolder' "
                                              r"\(names only in one: b, c\)"):
        check_compatible(source, data)
