"""`report --train`: the training-cost table of run folders, from their files."""

import json

import pytest
import yaml

from smoothcert.cli.app import main
from smoothcert.errors import SmoothcertError
from smoothcert.evaluation.train_report import read_run, train_report
from smoothcert.models import build_model
from smoothcert.models.checkpoint import (
    checkpoint_meta,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
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


@pytest.mark.parametrize("log, message", [
    (b"epoch\tseconds\tpeak_mem_mb\n1\t2.0\t10\n2\tabc\t10\n",
     r"log\.tsv line 3: seconds must be a number >= 0, got 'abc'$"),
    (b"epoch\tseconds\tpeak_mem_mb\n1\t2.0\n", r"log\.tsv line 2: 2 cells, but the header has 3$"),
    (b"epoch\tseconds\n1\t-1\n", r"log\.tsv line 2: seconds must be a number >= 0, got '-1'$"),
    (b"epoch\tseconds\n1\tnan\n", r"log\.tsv line 2: seconds must be a number >= 0"),
    (b"epoch\tloss\n1\t2.0\n", r"log\.tsv line 1: the header has no 'seconds' column"),
    (b"\x00\xff\xfe\n\x89PNG\n", r"log\.tsv is not a text file: byte 0xff at offset 1 is not "
                                 r"UTF-8$"),
])
def test_a_bad_training_log_is_one_line_naming_file_and_line(tmp_path, capsys, log, message):
    run = make_run(tmp_path / "run")
    (run / "log.tsv").write_bytes(log)
    with pytest.raises(SmoothcertError, match=message):
        read_run(run)
    assert main(["report", "--train", str(run)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_an_unmeasured_peak_memory_is_nan_not_an_error(tmp_path):
    run = make_run(tmp_path / "run", mem=(float("nan"), float("nan")))
    summary = read_run(run)
    assert summary.seconds_per_epoch == 3.0 and summary.peak_mem_mb != summary.peak_mem_mb


@pytest.mark.parametrize("config, message", [
    (b"\xff\xfe\x00", r"run config .*config\.yaml is not a text file: byte 0xff at offset 0"),
    (b"method: [consistency\n", r"config\.yaml is not valid YAML: .* \(line 2, column 1\)$"),
    (b"method: !!python/object/apply:os.system ['true']\n",
     r"tag '!!python/object/apply:os.system' is not allowed"),
    (b"- consistency\n", r"config\.yaml: it must be a mapping with the method's name"),
    (b"method: {name: x}\n", r"config\.yaml: it must be a mapping with the method's name"),
    (b"method: consistency\nmethod_params: 3\n", r"must be a mapping with the method's name"),
])
def test_a_bad_run_config_is_one_line_naming_it(tmp_path, capsys, config, message):
    run = make_run(tmp_path / "run")
    (run / "checkpoint.pt").unlink()  # a published run folder: config.yaml, no checkpoint
    (run / "config.yaml").write_bytes(config)
    with pytest.raises(SmoothcertError, match=message):
        read_run(run)
    assert main(["report", "--train", str(run)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


SELF = {"target": "self", "num_noise": 4, "epsilon": 1.0, "num_steps": 4, "lbd": 1.0,
        "confidence_mask": False, "double_epsilon_epoch": None, "teacher_checkpoint": None,
        "teacher_sigma": 0.25, "teacher_draws": 16}
TEACHER = {**SELF, "target": "teacher", "teacher_checkpoint": "runs/teacher/checkpoint.pt"}


def test_the_method_column_names_the_variant_a_checkpoint_records(tmp_path, capsys):
    """catrs with target=self is not the paper's CAT-RS: the table says so."""
    run = make_run(tmp_path / "self", method="catrs", hparams=SELF)
    meta_path = run / "checkpoint.pt"
    model, meta = model_from_checkpoint(meta_path)
    save_checkpoint(meta_path, model, {**meta, "method": {**meta["method"],
                                                          "variant": "target=self"}},
                    load_checkpoint(meta_path).train_state)
    make_run(tmp_path / "paper", method="catrs", hparams=TEACHER)
    assert read_run(run).variant == "target=self" and read_run(run).method == "catrs"
    text = train_report([run, tmp_path / "paper"], fmt="md")
    assert "| self | catrs (target=self) | 10 |" in text and "| paper | catrs | 10 |" in text
    assert main(["report", "--train", str(run), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["method"] == "catrs (target=self)"


@pytest.mark.parametrize("params, label", [(SELF, "catrs (target=self)"), (TEACHER, "catrs")])
def test_a_run_folder_without_checkpoint_gets_its_variant_from_config_yaml(tmp_path, params,
                                                                           label):
    """A published run keeps config.yaml (method_params.target), not the checkpoint that records
    the variant: the method's own ``named_variant`` of those hyperparameters labels it; so does
    a checkpoint saved before variants were recorded (hparams only)."""
    run = make_run(tmp_path / "run", method="catrs", hparams=params)
    assert read_run(run).method_label == label  # an older checkpoint: no "variant" key
    (run / "config.yaml").write_text(yaml.safe_dump({"method": "catrs", "method_params": params}))
    (run / "checkpoint.pt").unlink()
    assert read_run(run).method_label == label
    assert f"| run | {label} | 10 |" in train_report([run])
