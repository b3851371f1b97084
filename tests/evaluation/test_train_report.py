"""`report --train`: the training-cost table of run folders, from their files."""

import json

import pytest

from smoothcert.cli.app import main
from smoothcert.errors import SmoothcertError
from smoothcert.evaluation.train_report import read_run, train_report
from smoothcert.models import build_model
from smoothcert.models.checkpoint import checkpoint_meta, save_checkpoint
from smoothcert.runs.records import open_records


def make_run(folder, method="gaussian", hparams=None, seconds=(2.0, 4.0), mem=(10.0, 30.0),
             certify_rows=None):
    folder.mkdir(parents=True)
    model = build_model("digits_cnn", 10, (1, 8, 8), [0.3], [0.4])
    meta = checkpoint_meta(arch="digits_cnn", dataset="digits", num_classes=10,
                           input_shape=(1, 8, 8), mean=(0.3,), std=(0.4,),
                           noise={"name": "gaussian", "sigma": 0.25},
                           method={"name": method, "hparams": hparams or {"num_noise": 1}},
                           epoch=len(seconds), config={})
    save_checkpoint(folder / "checkpoint.pt", model, meta)
    lines = ["epoch\tseconds\tpeak_mem_mb"] + [
        f"{i + 1}\t{s}\t{m}" for i, (s, m) in enumerate(zip(seconds, mem))]
    (folder / "log.tsv").write_text("\n".join(lines) + "\n")
    if certify_rows:
        cols = ("idx", "label", "predict", "radius", "correct", "time")
        writer, _ = open_records(folder / "certify.tsv", cols,
                                 {"identity": {"certifier": "certify"}, "shard": {}})
        with writer:
            for i, (radius, correct) in enumerate(certify_rows):
                writer.write({"idx": i, "label": 1, "predict": 1 if correct else 2,
                              "radius": radius, "correct": int(correct), "time": 0.1})
    return folder


def test_run_summary_from_files(tmp_path):
    run = make_run(tmp_path / "cons", method="consistency",
                   hparams={"num_noise": 2, "lbd": 10.0, "eta": 0.5},
                   certify_rows=[(0.5, True), (1.0, True), (0.7, False), (0.0, False)])
    summary = read_run(run)
    assert summary.method == "consistency" and summary.num_hparams == 3
    assert summary.epochs == 2 and summary.seconds_per_epoch == 3.0
    assert summary.peak_mem_mb == 30.0
    assert summary.acr == pytest.approx((0.5 + 1.0) / 4)  # wrong and abstained count 0


def test_table_formats_and_cli(tmp_path, capsys):
    make_run(tmp_path / "a" / "run")
    make_run(tmp_path / "b" / "run", seconds=(1.0,), mem=(5.0,))
    text = train_report([tmp_path / "a" / "run", tmp_path / "b" / "run"], fmt="md")
    assert "| a/run | gaussian | 1 | 2 | 3.00 | 30.00 | – |" in text
    rows = json.loads(train_report([tmp_path / "b" / "run"], fmt="json"))
    assert rows == [{"name": "run", "method": "gaussian", "num_hparams": 1, "epochs": 1,
                     "seconds_per_epoch": 1.0, "peak_mem_mb": 5.0, "acr": None}]
    assert main(["report", "--train", str(tmp_path / "a" / "run"), "--format", "csv"]) == 0
    assert "seconds_per_epoch" in capsys.readouterr().out


def test_not_a_run_folder(tmp_path, capsys):
    with pytest.raises(SmoothcertError, match="no checkpoint.pt"):
        read_run(tmp_path)
    assert main(["report", "--train", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_run_folder_without_checkpoint_reads_config_yaml(tmp_path):
    # a published run (a study's records/RUN/) keeps config.yaml, log.tsv and the records, not
    # its checkpoint
    run = make_run(tmp_path / "cons", method="consistency",
                   hparams={"num_noise": 2, "lbd": 10.0, "eta": 0.5},
                   certify_rows=[(0.5, True), (0.0, False)])
    with_checkpoint = read_run(run)
    (run / "config.yaml").write_text(
        "method: consistency\nmethod_params:\n  num_noise: 2\n  lbd: 10.0\n  eta: 0.5\n"
        "sigma: 0.25\n")
    (run / "checkpoint.pt").unlink()
    assert read_run(run) == with_checkpoint
    (run / "config.yaml").write_text("sigma: 0.25\n")
    with pytest.raises(SmoothcertError, match="cannot read the method of"):
        read_run(run)
