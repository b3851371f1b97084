"""``smoothcert report`` and ``demo`` as a newcomer meets them: what they write, where they say
they wrote it, and the one line they print for a folder, an output that would overwrite an input,
or two files of different examples (Step 13, items 4 and 5.6)."""

import shutil

import pytest

from smoothcert.cli import demo
from smoothcert.cli.app import main
from smoothcert.io import format_row
from smoothcert.runs.records import manifest_path, open_records

CERTIFY = ("idx", "label", "predict", "radius", "correct", "time",
           "p_lower", "nA", "n0", "n", "alpha", "sigma", "seed")


def records(path, indices=range(6)):
    """A CERTIFY record file of ``indices`` with its manifest (idx 2 abstains)."""
    m = {"identity": {"certifier": "certify", "sigma": 0.25, "alpha": 0.001, "seed": 0},
         "shard": {"index": 0, "count": 1},
         "indices": {"dataset_size": 10, "skip": 1, "max_count": None}}
    open_records(path, CERTIFY, m)[0].close()
    rows = [{"idx": i, "label": i % 3, "predict": -1 if i == 2 else i % 3,
             "radius": 0.0 if i == 2 else 0.1 * i, "correct": int(i != 2), "time": 0.5,
             "p_lower": 0.4 if i == 2 else 0.9, "nA": 90, "n0": 100, "n": 100,
             "alpha": 0.001, "sigma": 0.25, "seed": 0} for i in indices]
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(format_row(r[c] for c in CERTIFY) for r in rows))
    return path


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


# --------------------------------------------------------------------------- item 5.6
@pytest.mark.parametrize("flag", ["--plot", "--ecdf", "--sigma-hist"])
def test_no_figure_overwrites_the_records_it_reads(tmp_path, capsys, flag):
    # The probe: cp a.tsv r.png; report r.png --plot r.png exited 0 and the records became a PNG.
    source = records(tmp_path / "a.tsv")
    target = tmp_path / "r.png"
    shutil.copy(source, target), shutil.copy(manifest_path(source), manifest_path(target))
    before = target.read_bytes()
    assert main(["report", str(target), flag, str(target)]) == 2
    assert error_line(capsys) == (f"smoothcert report: error: {flag} would overwrite {target}, "
                                  f"which this command reads; choose another {flag}\n")
    assert target.read_bytes() == before
    assert main(["report", str(source), flag, str(manifest_path(source))]) == 2  # its manifest
    assert "would overwrite" in error_line(capsys)


def test_two_outputs_may_not_name_one_file(tmp_path, capsys):
    path, image = records(tmp_path / "a.tsv"), tmp_path / "x.png"
    assert main(["report", str(path), "--plot", str(image), "--ecdf", str(image)]) == 2
    assert "--plot and --ecdf name the same file" in error_line(capsys)
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- report:b -->\n<!-- /report:b -->\n")
    assert main(["report", str(path), "--plot", str(doc), "--into", str(doc), "--block", "b"]) == 2
    assert "--plot and --into name the same file" in error_line(capsys)
    assert not image.exists() and doc.read_text() == "<!-- report:b -->\n<!-- /report:b -->\n"


# --------------------------------------------------------------------------- item 4
def test_each_written_file_is_named_on_stderr_and_stdout_keeps_the_table(tmp_path, capsys):
    path, plot, ecdf = records(tmp_path / "a.tsv"), tmp_path / "p.png", tmp_path / "e.png"
    assert main(["report", str(path), "--format", "csv", "--plot", str(plot),
                 "--ecdf", str(ecdf)]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"plot: {plot}", f"p̂_A ECDF: {ecdf}"]
    assert out.startswith("name,n,") and "png" not in out
    assert plot.stat().st_size > 0 and ecdf.stat().st_size > 0


def test_a_training_run_folder_is_one_line_that_points_to_train(tmp_path, capsys):
    # The probe: report runs/fmnist-g025 printed a raw "[Errno 21] Is a directory".
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("method: gaussian\n")
    records(run / "certify.tsv")
    assert main(["report", str(run)]) == 2
    assert error_line(capsys) == (
        f"smoothcert report: error: {run} is a training run folder, not a record file; compare "
        f"training runs with report --train {run}, or give a record file (record files there: "
        "certify.tsv)\n")
    other = tmp_path / "empty"
    other.mkdir()
    assert main(["report", str(other)]) == 2
    assert f"{other} is a folder, not a record file" in error_line(capsys)


def test_agreement_of_different_examples_names_common(tmp_path, capsys):
    first, second = records(tmp_path / "a.tsv", range(6)), records(tmp_path / "b.tsv", range(4))
    assert main(["report", "--agreement", str(first), str(second)]) == 2
    assert error_line(capsys) == (
        f"smoothcert report: error: {first} and {second} hold different examples (6 and 4, 4 in "
        "both); add --common to compare them on the examples both hold\n")
    assert main(["report", "--agreement", "--common", str(first), str(second)]) == 0
    assert "| a | b | 4 |" in capsys.readouterr().out


def test_the_demo_says_draws_per_image_where_the_table_counts_images(tmp_path, monkeypatch,
                                                                     capsys):
    # The demo's heading said n=10000 above a table whose n column was 359 (images).
    made = records(tmp_path / "made.tsv")
    # where run_demo imports them from when it runs (importing the demo imports no torch)
    monkeypatch.setattr("smoothcert.training.train", lambda *a, **k: tmp_path / "checkpoint.pt")
    monkeypatch.setattr("smoothcert.io.file_sha256", lambda path: "0" * 64)
    monkeypatch.setattr("smoothcert.runs.run_dataset", lambda *a, **k: made)
    demo.run_demo(tmp_path / "out")
    out = capsys.readouterr().out
    assert "n=10000" not in out and "(n=" not in out
    assert "(10,000 noise draws per image) into" in out
    assert "(10,000 noise draws per image, α=0.001; the table's n counts test images)" in out
    assert "| made | 6 |" in out


# ------------------------------------------------------------------- Step 15, item 2 (newcomer)
def test_make_demos_digits_beside_fashion_mnist_runs(tmp_path, capsys, caplog):
    """``report runs/*/certify.tsv`` after ``make demo`` takes the demo's digits file too: the
    table written --into a document says which row is which dataset (and stderr notes it in one
    line), and --envelope refuses the mixture in one line naming both."""
    import json

    (tmp_path / "demo").mkdir()
    (tmp_path / "g025").mkdir()
    digits = records(tmp_path / "demo" / "certify.tsv")
    fmnist = records(tmp_path / "g025" / "certify.tsv")
    for path, dataset in ((digits, "digits"), (fmnist, "fashion-mnist")):
        manifest = json.loads(manifest_path(path).read_text())
        manifest["identity"].update(dataset=dataset, split="test")
        manifest_path(path).write_text(json.dumps(manifest))
    doc = tmp_path / "paper.md"
    doc.write_text("# Results\n\n<!-- report:main -->\n<!-- /report:main -->\n")
    assert main(["report", str(fmnist), str(digits), "--into", str(doc), "--block", "main"]) == 0
    (note,) = [r.getMessage() for r in caplog.records]  # one line on stderr outside pytest
    assert note.startswith("note: the table mixes 2 dataset splits (fashion-mnist test: ")
    assert capsys.readouterr().err == f"table: {doc} (block main)\n"
    lines = doc.read_text().splitlines()
    assert lines[3].startswith("| name | dataset | n |")
    assert lines[5].startswith("| g025/certify | fashion-mnist test | 6 |")
    assert lines[6].startswith("| demo/certify | digits test | 6 |")
    assert main(["report", str(fmnist), str(digits), "--envelope"]) == 2
    assert error_line(capsys) == (
        f"smoothcert report: error: --envelope combines files of one dataset split, but {fmnist} "
        f"is fashion-mnist test and {digits} is digits test; report them without --envelope or "
        "in separate reports\n")
