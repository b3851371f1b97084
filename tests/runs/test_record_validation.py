"""Record files are validated on read — by ``report``, ``merge`` and a resumed run alike.

Each test corrupts a well-formed file the way a hand edit, a copy-paste or a foreign tool would,
and checks for the one line that names the file, the line and the field (and, where a file would
be written, that nothing is). The torn last line of a killed run is the one tolerated defect.
"""

import logging
import subprocess
import sys

import pytest

from smoothcert import SmoothcertError
from smoothcert.certifiers import CERTIFIERS
from smoothcert.cli.app import main
from smoothcert.runs.records import (
    global_indices,
    manifest_path,
    merge_records,
    open_records,
    read_records,
    shard_indices,
    shard_path,
)

CERTIFY = ("idx", "label", "predict", "radius", "correct", "time",
           "p_lower", "nA", "n0", "n", "alpha", "sigma", "seed")
SIZE = 10  # examples in the (pretend) dataset of the manifests below


def manifest(shard=(0, 1), skip=1):
    return {"identity": {"sigma": 0.25, "alpha": 0.001, "seed": 0},
            "shard": {"index": shard[0], "count": shard[1]},
            "indices": {"dataset_size": SIZE, "skip": skip, "max_count": None}}


def row(i):
    """A CERTIFY row: idx 2 abstains, every other one is correct."""
    predict = -1 if i == 2 else i % 3
    return {"idx": i, "label": i % 3, "predict": predict, "radius": 0.0 if i == 2 else 0.1 * i,
            "correct": int(predict == i % 3), "time": 0.5, "p_lower": 0.4 if i == 2 else 0.9,
            "nA": 90, "n0": 100, "n": 100, "alpha": 0.001, "sigma": 0.25, "seed": 0}


def write(path, indices=range(5), m=None):
    writer, done = open_records(path, CERTIFY, m or manifest())
    with writer:
        for i in indices:
            if i not in done:
                writer.write(row(i))
    return path


def corrupt(path, line, column, text):
    """Replace one cell (``line`` counts from 1, the header)."""
    lines = path.read_text().split("\n")
    header = lines[0].split("\t")
    cells = lines[line - 1].split("\t")
    cells[header.index(column)] = text
    lines[line - 1] = "\t".join(cells)
    path.write_text("\n".join(lines))


def refused(path, says):
    """The one-line error of reading ``path``, which contains ``says``."""
    with pytest.raises(SmoothcertError) as info:
        read_records(path)
    message = str(info.value)
    assert says in message and message.startswith(f"{path} line ") and "\n" not in message
    return message


# --------------------------------------------------------------------------- fields
@pytest.mark.parametrize("value", ["nan", "-0.2", "inf"])
def test_a_radius_is_a_finite_number_at_least_zero(tmp_path, value):
    path = write(tmp_path / "r.tsv")
    corrupt(path, 4, "radius", value)
    assert refused(path, "radius") == (f"{path} line 4: radius is {value}; "
                                       "a radius is a finite number >= 0")


def test_correct_is_0_or_1_and_agrees_with_predict_and_label(tmp_path):
    path = write(tmp_path / "r.tsv")
    corrupt(path, 2, "correct", "7")
    refused(path, "line 2: correct is 7; correct is 0 or 1")
    path = write(tmp_path / "s.tsv")
    corrupt(path, 5, "correct", "0")  # idx 3: predict 0 == label 0
    refused(path, "line 5: correct is 0 with predict 0 and label 0; correct is 1 exactly when")


TEXT_IN_NUMERIC_FIELDS = [  # on line 3
    (3, "radius", "abc", "radius is 'abc'; a radius is"),
    (3, "idx", "x", "idx is 'x'; an idx is an integer >= 0"),
    (3, "label", "2.5", "label is 2.5; a label is a class"),
    (3, "n", "", "n is empty; n is a count"),
    (3, "time", "soon", "time is 'soon'; time is a finite number of seconds"),
]
OUT_OF_RANGE = [  # on line 6
    (6, "predict", "-2", "predict is -2; predict is a class (an integer >= 0) or -1 (abstention)"),
    (6, "p_lower", "1.5", "p_lower is 1.5; p_lower is a probability in [0, 1]"),
    (6, "nA", "-1", "nA is -1; nA is a count"),
    (6, "n", "-5", "n is -5; n is a count"),
    (6, "nA", "101", "nA is 101, more than n (100)"),
    (6, "alpha", "0.0", "alpha is 0.0; alpha is a level in (0, 1)"),
    (6, "sigma", "-0.25", "sigma is -0.25; sigma is a finite number > 0"),
    (6, "seed", "-1", "seed is -1; a seed is an integer >= 0"),
    (6, "time", "-3", "time is -3; time is"),
    (6, "idx", "99999999999999999999999", "idx is 99999999999999999999999; an idx is"),
]


@pytest.mark.parametrize("line,column,text,says", TEXT_IN_NUMERIC_FIELDS + OUT_OF_RANGE)
def test_text_in_a_numeric_field_or_a_value_out_of_range(tmp_path, line, column, text, says):
    path = write(tmp_path / "r.tsv")
    corrupt(path, line, column, text)
    refused(path, f"line {line}: {says}")


def test_an_abstention_has_radius_zero(tmp_path):
    path = write(tmp_path / "r.tsv")
    corrupt(path, 4, "radius", "0.7")  # idx 2 abstains
    refused(path, "line 4: radius is 0.7 with predict -1; an abstention has radius 0")


def test_the_first_bad_line_is_named(tmp_path):
    path = write(tmp_path / "r.tsv")
    corrupt(path, 6, "radius", "-1")
    corrupt(path, 3, "p_lower", "2")
    refused(path, "line 3: p_lower")


def test_unknown_columns_are_read_unchecked(tmp_path):
    path = tmp_path / "x.tsv"
    path.write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\tnote\tscore\n"
                    "0\t1\t1\t0.5\t1\t2.0\tanything\t-inf\n")
    rec = read_records(path)
    assert rec["note"][0] == "anything" and rec["score"][0] == float("-inf")


def test_every_column_a_certifier_writes_has_a_rule():
    from smoothcert.runs.schema import known_columns

    assert "attack" in CERTIFIERS  # the attack's columns too
    for name, certifier in CERTIFIERS.items():
        missing = set(certifier.columns) - set(known_columns())
        assert not missing, f"{name} writes columns the schema does not know: {missing}"


# --------------------------------------------------------------------------- idx
def test_a_duplicated_idx_is_refused(tmp_path):
    path = write(tmp_path / "r.tsv")
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines + [lines[2]]))  # idx 1 again, the same row
    refused(path, "line 7: idx 1 repeats line 3 (the same row twice)")


def test_a_conflicting_duplicate_is_refused(tmp_path):
    # idx 2 abstained; a second row certifying it with a large radius would inflate the ACR
    path = write(tmp_path / "r.tsv")
    with open(path, "a") as f:
        f.write("\t".join(str(v) for v in {**row(2), "predict": 2, "correct": 1,
                                           "radius": 9.0}.values()) + "\n")
    refused(path, "line 7: idx 2 repeats line 4 (rows that differ in predict, radius, "
                  "correct)")


def test_an_idx_outside_the_dataset_is_refused(tmp_path):
    path = write(tmp_path / "r.tsv")
    corrupt(path, 5, "idx", str(SIZE + 2))
    refused(path, f"line 5: idx {SIZE + 2} lies outside the dataset ({SIZE} examples")


def test_an_idx_outside_the_shard_is_refused(tmp_path):
    path = shard_path(tmp_path / "s.tsv", 1, 2)
    write(path, shard_indices(global_indices(SIZE), 1, 2), manifest((1, 2)))  # 1, 3, 5, ...
    corrupt(path, 3, "idx", "4")  # shard 0's
    refused(path, "line 3: idx 4 is not one of the 5 indices of shard 1 of 2")


def test_rows_of_another_run_are_refused(tmp_path):
    path = write(tmp_path / "r.tsv")
    corrupt(path, 2, "seed", "3")
    refused(path, "line 2: seed is 3; the manifest's run has seed 0")


def test_a_header_that_differs_from_the_manifest_is_refused(tmp_path):
    path = write(tmp_path / "r.tsv")
    text = path.read_text()
    path.write_text(text.replace("p_lower\tnA", "nA\tp_lower", 1))
    with pytest.raises(SmoothcertError, match="line 1: the header differs from the columns"):
        read_records(path)


# --------------------------------------------------------------------------- who validates
def test_resume_refuses_a_corrupted_file_and_leaves_it_untouched(tmp_path):
    path = write(tmp_path / "r.tsv", range(3))
    corrupt(path, 3, "radius", "-0.5")
    with open(path, "a") as f:
        f.write("3\t0\t0")  # and a torn line: even that is not trimmed
    before, manifest_before = path.read_bytes(), manifest_path(path).read_bytes()
    with pytest.raises(SmoothcertError, match="line 3: radius is -0.5"):
        write(path, range(5))
    assert path.read_bytes() == before and manifest_path(path).read_bytes() == manifest_before
    assert not path.with_name("r.tsv.lock").exists()


def test_resume_refuses_an_idx_outside_its_own_shard(tmp_path):
    path = write(tmp_path / "r.tsv", [0, 2, 4], manifest(skip=2))
    corrupt(path, 3, "idx", "3")  # not in 0, 2, 4, ...
    before = path.read_bytes()
    with pytest.raises(SmoothcertError, match="idx 3 is not one of the 5 indices"):
        write(path, [0, 2, 4, 6], manifest(skip=2))
    assert path.read_bytes() == before


def test_merge_refuses_a_corrupted_shard_and_writes_nothing(tmp_path):
    paths = []
    for k in range(2):
        path = shard_path(tmp_path / "s.tsv", k, 2)
        write(path, shard_indices(global_indices(SIZE), k, 2), manifest((k, 2)))
        paths.append(path)
    corrupt(paths[1], 4, "p_lower", "nan")
    with pytest.raises(SmoothcertError, match=rf"{paths[1]} line 4: p_lower is nan"):
        merge_records(paths, tmp_path / "m.tsv")
    assert not (tmp_path / "m.tsv").exists()


def test_report_exits_2_with_the_file_line_and_field(tmp_path, capsys):
    path = write(tmp_path / "r.tsv")
    corrupt(path, 6, "radius", "inf")
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"smoothcert report: error: {path} line 6: radius is inf; "
                   "a radius is a finite number >= 0\n")
    assert main(["merge", str(path), "--out", str(tmp_path / "m.tsv")]) == 2
    assert f"{path} line 6: radius is inf" in capsys.readouterr().err


# --------------------------------------------------------------------------- the torn line
def test_a_torn_last_line_is_ignored_and_reported(tmp_path, caplog):
    path = write(tmp_path / "r.tsv")
    with open(path, "a") as f:
        f.write("5\t2\t-")  # a run killed mid-row
    with caplog.at_level(logging.WARNING, logger="smoothcert.runs.records"):
        rec = read_records(path)
    assert list(rec["idx"]) == [0, 1, 2, 3, 4] and rec.torn_line
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: ignored its torn last line (no newline at the end: a run was killed while "
        "writing it); resume that run to redo the example"]
    assert not read_records(write(tmp_path / "whole.tsv")).torn_line


def test_report_says_once_on_stderr_that_it_ignored_a_torn_line(tmp_path):
    path = write(tmp_path / "r.tsv")
    with open(path, "a") as f:
        f.write("5\t2\t2\t0.")
    done = subprocess.run([sys.executable, "-m", "smoothcert.cli", "report", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"{path}: ignored its torn last line (no newline at the "
                                        "end: a run was killed while writing it); resume that "
                                        "run to redo the example"]
    assert done.stdout.splitlines()[2].startswith("| r | 5 |")  # the 5 complete rows
