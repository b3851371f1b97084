"""ACES' selection model trained with ``train --label-records``: the training set is exactly the
recorded examples with the rule's labels, the checkpoint has 2 classes and serves as ACES'
selection model, records of another split or dataset and a changed label file are refused in
one line, and ``train --help`` shows the flags."""

from __future__ import annotations

import json
import logging
import math
import shutil

import numpy as np
import pytest
import torch

from conftest import write_checkpoint
from smoothcert import SmoothcertError
from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.io import file_sha256
from smoothcert.models.checkpoint import load_checkpoint
from smoothcert.runs import certify_dataset
from smoothcert.runs.records import manifest_path, read_records
from smoothcert.training import TrainConfig, Trainer, train
from smoothcert.training.labels import labelled_split

TRAIN_IDX = list(range(0, 600, 20))  # 30 training examples


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A robust and a core checkpoint, the robust model's records of 30 training and 6 test
    examples (few draws at α 0.1: certified radii that differ between examples)."""
    d = tmp_path_factory.mktemp("selection")
    robust, core = write_checkpoint(d / "robust.pt"), write_checkpoint(d / "core.pt")
    draws = dict(n0=8, n=48, alpha=0.1, batch=512)
    certify_dataset(robust, load_dataset("digits", "train"), indices=TRAIN_IDX,
                    out=d / "train.tsv", **draws)
    certify_dataset(robust, load_dataset("digits", "test"), max_count=6, out=d / "test.tsv",
                    **draws)
    return {"dir": d, "robust": robust, "core": core, "train": d / "train.tsv",
            "test": d / "test.tsv"}


def config(files, **kw) -> TrainConfig:
    fields = dict(dataset="digits", arch="digits_cnn", sigma=0.25, epochs=1, batch_size=16,
                  lr=0.05, label_records=str(files["train"]))
    return TrainConfig(**{**fields, **kw})


def expected_labels(path, rule: str, radius: float) -> tuple[list[int], list[int]]:
    """The recorded idx in order and each one's label, from the rows themselves."""
    rows = sorted(read_records(path).rows(), key=lambda r: r["idx"])
    labels = [int(r["predict"] != -1 and r["radius"] >= radius
                  and (rule == "certified" or bool(r["correct"]))) for r in rows]
    return [int(r["idx"]) for r in rows], labels


def test_the_training_set_is_exactly_the_recorded_examples_with_the_rules_labels(files):
    radii = read_records(files["train"])["radius"]
    r = float(np.median(radii[radii > 0]))  # splits the certified examples
    full = load_dataset("digits", "train")
    trainer = Trainer(config(files, label_rule="certified", label_radius=r))
    idx, labels = expected_labels(files["train"], "certified", r)
    assert sorted(TRAIN_IDX) == idx and 0 < sum(labels) < len(labels)  # both classes occur
    assert torch.equal(trainer.train_data.images, full.images[idx])
    assert trainer.train_data.labels.tolist() == labels
    assert trainer.train_data.num_classes == 2 and trainer.model(full.batch(
        torch.tensor(idx[:3]))[0]).shape == (3, 2)
    for rule, radius in (("correct", 0.0), ("correct", r), ("certified", 0.0)):
        split = labelled_split(config(files, label_rule=rule, label_radius=radius), "train")
        assert split.labels.tolist() == expected_labels(files["train"], rule, radius)[1]
    # without test records the log's test columns are not measured
    assert all(math.isnan(v) for v in trainer.test_columns().values())


@pytest.fixture(scope="module")
def selection_run(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("sel-run")
    cfg = config(files, label_test_records=str(files["test"]), label_radius=0.0)
    train(cfg, out, progress=False)
    return cfg, out


def test_the_checkpoint_has_two_classes_its_provenance_and_serves_as_aces_selection(
        files, selection_run):
    cfg, out = selection_run
    meta = load_checkpoint(out / "checkpoint.pt").meta
    assert (meta["num_classes"], meta["classes"]) == (2, ["core", "robust"])
    labels = meta["selection_labels"]
    assert labels["sha256"] == file_sha256(files["train"]) == cfg.label_sha256
    assert (labels["radius"], labels["rule"]) == (0.0, "correct")
    assert labels["robust_checkpoint_sha256"] == file_sha256(files["robust"])
    ones = sum(expected_labels(files["train"], "correct", 0.0)[1])
    assert labels["counts"] == {"core": len(TRAIN_IDX) - ones, "robust": ones}
    header, row = (out / "log.tsv").read_text().splitlines()
    test_acc = float(dict(zip(header.split("\t"), row.split("\t")))["test_acc"])
    assert 0.0 <= test_acc <= 1.0  # measured on the 6 labelled test examples
    rows = certify_dataset(files["robust"], load_dataset("digits", "test"), certifier="aces",
                           models={"selection": out / "checkpoint.pt", "core": files["core"]},
                           n0=8, n=32, max_count=2, sigma=0.25)
    assert len(rows) == 2 and all(r["selected"] in (-1, 0, 1) for r in rows)


def test_resume_with_another_or_a_changed_label_file_is_refused(files, selection_run,
                                                                tmp_path):
    cfg, out = selection_run
    other = tmp_path / "other.tsv"
    shutil.copy(files["train"], other)
    shutil.copy(manifest_path(files["train"]), manifest_path(other))
    lines = other.read_text().splitlines(keepends=True)
    other.write_text("".join(lines[:-1]))  # one example fewer: another file
    run = tmp_path / "run"
    shutil.copytree(out, run)
    with pytest.raises(SmoothcertError, match="config differs.*label_sha256"):
        train(config(files, epochs=2, label_records=str(other),
                     label_test_records=str(files["test"])), run, resume=True, progress=False)
    stored = TrainConfig.from_dict(load_checkpoint(run / "checkpoint.pt").meta["config"])
    moved = TrainConfig.from_dict({**stored.to_dict(), "label_records": str(other)})
    with pytest.raises(SmoothcertError, match="changed since the run started"):
        Trainer(moved)


def one_line_refusal(capsys, args, message):
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_records_of_another_split_or_dataset_or_without_manifest_are_refused(
        files, tmp_path, capsys):
    base = ["--dataset", "digits", "--arch", "digits_cnn", "--sigma", "0.25", "--epochs", "1",
            "--no-progress", "--device", "cpu"]
    out = tmp_path / "run"
    one_line_refusal(capsys, [*base, "--label-records", str(files["test"]), "--out", str(out)],
                     "split 'test'; this run needs 'digits' split 'train'")
    one_line_refusal(capsys, [*base, "--label-records", str(files["train"]),
                              "--label-test-records", str(files["train"]), "--out", str(out)],
                     "this run needs 'digits' split 'test'")
    other = tmp_path / "mnist.tsv"
    shutil.copy(files["train"], other)
    manifest = json.loads(manifest_path(files["train"]).read_text())
    manifest["identity"]["dataset"] = "mnist"
    manifest_path(other).write_text(json.dumps(manifest))
    one_line_refusal(capsys, [*base, "--label-records", str(other), "--out", str(out)],
                     "hold 'mnist' split 'train'")
    manifest_path(other).unlink()
    one_line_refusal(capsys, [*base, "--label-records", str(other), "--out", str(out)],
                     "have no manifest")
    assert not out.exists()


@pytest.mark.parametrize("fields, message", [
    ({"label_records": None, "label_radius": 0.5}, "--label-radius needs --label-records"),
    ({"label_records": None, "label_rule": "certified"}, "--label-rule needs --label-records"),
    ({"train_size": 20}, "--train-size and --label-records exclude each other"),
    ({"label_radius": -0.1}, "label_radius must be a finite number >= 0"),
    ({"label_rule": "robust"}, "unknown label_rule 'robust'; known: correct, certified"),
    ({"label_sha256": "abc"}, "label_sha256 must be 64 lowercase hex digits"),
    ({"label_records": "missing.tsv"}, "have no manifest"),
])
def test_misuse_is_one_line(files, fields, message):
    with pytest.raises(SmoothcertError, match=message.replace("(", r"\(")) as err:
        config(files, **fields)
    assert "\n" not in str(err.value)


def test_train_help_shows_the_label_flags(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["train", "--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--label-records FILE", "--label-test-records FILE", "--label-radius R",
                 "--label-rule RULE", "--label-sha256 HEX"):
        assert flag in text
    assert "certified and correct" in text


def test_training_at_another_noise_than_the_records_is_warned_about(files, caplog):
    with caplog.at_level(logging.WARNING, logger="smoothcert.training.labels"):
        labelled_split(config(files), "train")
        assert not caplog.records  # the records' Gaussian σ = 0.25: this run's
        labelled_split(config(files, sigma=0.5), "train")
    (record,) = caplog.records
    assert "certify with noise gaussian at sigma 0.25, this run trains at gaussian sigma 0.5" \
        in record.getMessage()
