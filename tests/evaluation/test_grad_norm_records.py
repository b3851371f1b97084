"""Grad-norm files (``analyze grad-norms --out``) and Sun et al.'s Table 1 over them
(``analyze easy-hard``): the rows behind the printed means, rerunning, refusals, and the
comparison table against closed forms on hand-written files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_evaluation import COHEN_HEADER, write_digits_checkpoint

from conftest import COHEN_ROWS
from smoothcert.cli.app import main
from smoothcert.evaluation import analysis
from smoothcert.evaluation.analysis import GRAD_NORM_COLUMNS, read_grad_norms
from smoothcert.evaluation.metrics import average_certified_radius
from smoothcert.io import read_tsv
from smoothcert.runs.records import manifest_path, read_records

pytestmark = pytest.mark.usefixtures("one_thread")

ARGS = ["--n", "10", "--max", "6", "--format", "json", "--no-progress", "--device", "cpu"]


def grad_norms(capsys, ckpt, out, *extra) -> tuple[int, str]:
    code = main(["analyze", "grad-norms", str(ckpt), *ARGS, "--out", str(out), *extra])
    captured = capsys.readouterr()
    return code, captured.out if code == 0 else captured.err


@pytest.fixture
def written(tmp_path, capsys):
    """A digits checkpoint, its grad-norm file and the table printed while writing it."""
    ckpt = write_digits_checkpoint(tmp_path / "ckpt.pt")
    out = tmp_path / "grad" / "gaussian.tsv"  # the folder does not exist yet
    code, printed = grad_norms(capsys, ckpt, out)
    assert code == 0, printed
    return ckpt, out, printed


def test_out_holds_the_rows_behind_the_printed_means(written, capsys):
    ckpt, out, printed = written
    header, *rows = read_tsv(out)
    assert tuple(header) == GRAD_NORM_COLUMNS and len(rows) == 6
    idx = [int(r[0]) for r in rows]
    p_hat, norm = (np.array([float(r[k]) for r in rows]) for k in (2, 3))
    assert idx == list(range(6)) and all(p * 10 == round(p * 10) for p in p_hat)
    table = json.loads(printed)
    for group, mask in (("easy", p_hat > 0.5), ("hard", p_hat < 0.5)):
        (row,) = [r for r in table if r["group"] == group]
        assert row["count"] == mask.sum()
        assert row["mean_grad_norm"] == (norm[mask].mean() if mask.any() else None)  # exactly
    manifest = json.loads(manifest_path(out).read_text())
    assert manifest["kind"] == "grad-norms" and manifest["examples"] == 6
    assert manifest["columns"] == list(GRAD_NORM_COLUMNS)
    identity = manifest["identity"]
    assert identity["method"] == "gaussian" and identity["hparams"] == {"num_noise": 1}
    assert (identity["n"], identity["sigma"], identity["split"], identity["skip"],
            identity["max_count"], identity["seed"]) == (10, 0.25, "train", 1, 6, 0)
    assert main(["analyze", "grad-norms", str(ckpt), *ARGS]) == 0  # without --out: same table
    assert capsys.readouterr().out == printed


def test_a_rerun_reads_the_file_instead_of_computing(written, capsys, monkeypatch):
    ckpt, out, printed = written
    before = (out.stat().st_mtime_ns, manifest_path(out).stat().st_mtime_ns)

    def no_compute(*args, **kwargs):
        raise AssertionError("recomputed")

    monkeypatch.setattr(analysis, "checkpoint_grad_norms", no_compute)
    assert grad_norms(capsys, ckpt, out, "--batch", "7", "--method", "gaussian") == (0, printed)
    assert (out.stat().st_mtime_ns, manifest_path(out).stat().st_mtime_ns) == before


@pytest.mark.parametrize("extra,match", [
    (["--n", "20"], "differs in: n)"),
    (["--method", "macer"], "differs in: hparams, method)"),
    (["--sigma", "0.5"], "differs in: sigma)"),
    (["--skip", "2"], "differs in: skip)"),
])
def test_a_rerun_with_other_settings_is_refused(written, capsys, extra, match):
    ckpt, out, _ = written
    text = out.read_text()
    code, err = grad_norms(capsys, ckpt, out, *extra)
    assert code == 2 and err.count("\n") == 1 and match in err, err
    assert out.read_text() == text


def test_an_existing_file_without_manifest_or_with_missing_rows_is_refused(written, capsys):
    ckpt, out, _ = written
    out.write_text("".join(line + "\n" for line in out.read_text().splitlines()[:-1]))
    code, err = grad_norms(capsys, ckpt, out)
    assert code == 2 and "has 5 rows, its manifest 6" in err, err
    manifest_path(out).unlink()
    code, err = grad_norms(capsys, ckpt, out)
    assert code == 2 and "exists but has no manifest" in err, err


# --------------------------------------------------------------------------- easy-hard
def write_tsv(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(map(str, r)) + "\n" for r in [header, *rows]))
    return path


# Method a: easy norms 1, 3 (mean 2), hard norm 8 (mean 8), p̂_A = ½ (norm 100) in neither:
# easy/hard = 1/4. Method b: easy 2, 2, 5 (mean 3), hard 1, 2 (mean 1.5): easy/hard = 2.
A_ROWS = [(0, 1, 0.9, 1.0), (1, 2, 0.51, 3.0), (2, 0, 0.2, 8.0), (3, 4, 0.5, 100.0)]
B_ROWS = [(0, 1, 1.0, 2.0), (5, 3, 0.7, 2.0), (7, 3, 0.6, 5.0), (9, 2, 0.0, 1.0),
          (11, 1, 0.49, 2.0)]


@pytest.fixture
def two_files(tmp_path):
    return [write_tsv(tmp_path / m / "grad.tsv", GRAD_NORM_COLUMNS, rows)
            for m, rows in (("a", A_ROWS), ("b", B_ROWS))]


def easy_hard_json(capsys, files, *extra) -> list[dict]:
    assert main(["analyze", "easy-hard", *map(str, files), "--format", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_easy_hard_table_of_two_files_by_hand(two_files, capsys):
    rows = easy_hard_json(capsys, two_files)
    assert rows == [
        {"name": "a/grad", "examples": 4, "easy": 2, "easy_grad_norm": 2.0, "hard": 1,
         "hard_grad_norm": 8.0, "easy_over_hard": 0.25},
        {"name": "b/grad", "examples": 5, "easy": 3, "easy_grad_norm": 3.0, "hard": 2,
         "hard_grad_norm": 1.5, "easy_over_hard": 2.0},
    ]
    assert read_grad_norms(two_files[0]).n is None  # hand-written: no manifest
    assert main(["analyze", "easy-hard", *map(str, two_files)]) == 0
    md = capsys.readouterr().out
    assert "| name | examples | easy | easy ‖∇θL‖ | hard | hard ‖∇θL‖ | easy/hard |" in md
    assert "| a/grad | 4 | 2 | 2.000 | 1 | 8.000 | 0.250 |" in md


def test_easy_hard_acr_column_is_the_acr_of_the_record_files(two_files, tmp_path, capsys):
    cohen = write_tsv(tmp_path / "a" / "certify.tsv", COHEN_HEADER, COHEN_ROWS)
    # correct radii 0.25 + 0.5 + 1.2 + 0.1 + 0.75 = 2.8 over 8 examples (idx 3 is wrong)
    other = write_tsv(tmp_path / "b" / "certify.tsv", COHEN_HEADER,
                      [(0, 1, 1, 1.0, 1, 1.0), (1, 2, 2, 0.5, 1, 1.0)])
    rows = easy_hard_json(capsys, two_files, "--acr", str(cohen), str(other))
    assert [r["acr"] for r in rows] == [average_certified_radius(read_records(cohen)), 0.75]
    assert rows[0]["acr"] == pytest.approx(2.8 / 8, abs=1e-15)


def test_grad_norm_files_from_the_cli_feed_easy_hard(written, capsys):
    _, out, printed = written
    easy, hard, ratio = json.loads(printed)
    (row,) = easy_hard_json(capsys, [out])
    assert (row["easy"], row["easy_grad_norm"]) == (easy["count"], easy["mean_grad_norm"])
    assert (row["hard"], row["hard_grad_norm"]) == (hard["count"], hard["mean_grad_norm"])
    assert row["easy_over_hard"] == ratio["mean_grad_norm"] and row["examples"] == 6
    assert read_grad_norms(out).n == 10


@pytest.mark.parametrize("case,match", [
    ("missing", "does not exist"),
    ("no-columns", "is not a grad-norm file: no column p_hat, grad_norm"),
    ("bad-p", "line 3: p_hat is 1.5; p_hat is a probability in [0, 1]"),
    ("acr-count", "--acr takes one certify record file per grad-norm file, in the same "
                  "order: got 1 for 2"),
    ("acr-predict", "has no radius column; ACR needs a certify record file"),
])
def test_easy_hard_bad_input_is_one_line(two_files, tmp_path, capsys, case, match):
    files, extra = list(two_files), []
    if case == "missing":
        files.append(tmp_path / "nope.tsv")
    elif case == "no-columns":
        files.append(write_tsv(tmp_path / "c.tsv", ("idx", "label"), [(0, 1)]))
    elif case == "bad-p":
        files.append(write_tsv(tmp_path / "d.tsv", GRAD_NORM_COLUMNS,
                               [(0, 1, 0.5, 1.0), (1, 1, 1.5, 1.0)]))
    elif case == "acr-count":
        extra = ["--acr", str(write_tsv(tmp_path / "r.tsv", COHEN_HEADER, COHEN_ROWS))]
    else:
        predict = write_tsv(tmp_path / "p.tsv", ("idx", "label", "predict", "correct"),
                            [(0, 1, 1, 1)])
        extra = ["--acr", str(predict), str(predict)]
    assert main(["analyze", "easy-hard", *map(str, files), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err, err
