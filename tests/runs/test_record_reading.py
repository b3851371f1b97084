"""Reading record files: streamed, checked against what their manifest fixes, refused in one line.

Each test builds a small file in the real format (``open_records`` + rows), breaks it the way a
probe did (rows of another σ under a shard's manifest, a label the model has no class for, junk
behind a header, a run folder given as a file), and checks the one line that names the file and
the line, or, for junk, that the reader stopped early: it is fed through a pipe whose writer
counts what was taken from it, so the test does not depend on how the reader reads.
"""

import os
import threading

import numpy as np
import pytest

from smoothcert import SmoothcertError
from smoothcert.cli.app import main
from smoothcert.io import format_row
from smoothcert.runs.records import (
    global_indices,
    manifest_path,
    open_records,
    read_records,
    shard_indices,
    shard_path,
)

CERTIFY = ("idx", "label", "predict", "radius", "correct", "time",
           "p_lower", "nA", "n0", "n", "alpha", "sigma", "seed")


def manifest(shard=(0, 1), size=10, certifier="certify", **extra):
    return {"identity": {"certifier": certifier, "sigma": 0.25, "alpha": 0.001, "seed": 0,
                         "dataset": "pretend"},
            "shard": {"index": shard[0], "count": shard[1]},
            "indices": {"dataset_size": size, "skip": 1, "max_count": None}, **extra}


def row(i, **change):
    label = i % 3
    return {"idx": i, "label": label, "predict": label, "radius": 0.1, "correct": 1,
            "time": 0.5, "p_lower": 0.9, "nA": 90, "n0": 100, "n": 100, "alpha": 0.001,
            "sigma": 0.25, "seed": 0, **change}


def write(path, indices, m=None, columns=CERTIFY, make=row):
    """A record file as a run makes it: its manifest and header by ``open_records``, then the
    rows, formatted as the writer formats them (appended at once: one fsync per row would make
    files of thousands of rows slow to build)."""
    open_records(path, columns, m or manifest())[0].close()
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(format_row(make(i)[c] for c in columns) for i in indices))
    return path


def edit(path, line, column, text):
    """Replace one cell by hand (``line`` counts from 1, the header)."""
    lines = path.read_text().split("\n")
    cells = lines[line - 1].split("\t")
    cells[lines[0].split("\t").index(column)] = text
    lines[line - 1] = "\t".join(cells)
    path.write_text("\n".join(lines))


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- item 5.5: σ per row
def shards(tmp_path, count=2):
    paths = []
    for k in range(count):
        path = shard_path(tmp_path / "s.tsv", k, count)
        write(path, shard_indices(global_indices(10), k, count), manifest((k, count)))
        paths.append(path)
    return paths


def test_merge_refuses_rows_of_another_sigma_under_a_shards_manifest(tmp_path, capsys):
    # The probe: σ = 0.5 rows under a σ = 0.25 shard's name and manifest merged with exit 0
    # into a file whose sigma column mixed 0.25 and 0.5.
    paths = shards(tmp_path)
    edit(paths[1], 3, "sigma", "0.5")
    out = tmp_path / "m.tsv"
    assert main(["merge", *map(str, paths), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"smoothcert merge: error: {paths[1]} line 3: sigma is "
                                       "0.5; the manifest's run has sigma 0.25\n")
    assert not out.exists() and not manifest_path(out).exists()


def test_a_certifier_that_varies_sigma_keeps_its_sigma_x_per_row(tmp_path):
    path = write(tmp_path / "dd.tsv", range(3), manifest(certifier="data-dependent"),
                 columns=(*CERTIFY[:-1], "predict_mc", "radius_mc", "adjusted", "seed"),
                 make=lambda i: row(i, sigma=0.25 + 0.01 * i, predict_mc=i % 3,
                                    radius_mc=0.1, adjusted=0))
    assert list(read_records(path)["sigma"]) == [0.25, 0.26, 0.27]


@pytest.mark.parametrize("column, text", [("seed", "1"), ("alpha", "0.01"), ("sigma", "0.5")])
def test_every_field_the_identity_fixes_is_checked_on_each_row(tmp_path, column, text):
    path = write(tmp_path / "r.tsv", range(4))
    edit(path, 4, column, text)
    with pytest.raises(SmoothcertError) as info:
        read_records(path)
    assert one_line(info).startswith(f"{path} line 4: {column} is {text}; the manifest's run")


# --------------------------------------------------------------------------- item 5.4: labels
@pytest.mark.parametrize("column, value", [("label", 42), ("predict", 10)])
def test_a_class_the_model_does_not_have_is_refused(tmp_path, column, value):
    # label 42 with num_classes 10 was accepted and reported as 0% accuracy
    path = write(tmp_path / "r.tsv", range(4), manifest(num_classes=10))
    edit(path, 3, column, str(value))
    edit(path, 3, "correct", "0")
    with pytest.raises(SmoothcertError) as info:
        read_records(path)
    assert one_line(info) == (f"{path} line 3: {column} is {value}; the run's model has 10 "
                              "classes (0 to 9)")


def test_a_registered_datasets_classes_bound_the_labels_of_older_manifests(tmp_path):
    m = manifest()
    m["identity"]["dataset"] = "digits"  # 10 classes; no num_classes in this manifest
    path = write(tmp_path / "r.tsv", range(3), m)
    edit(path, 2, "label", "12")
    edit(path, 2, "correct", "0")
    with pytest.raises(SmoothcertError, match="line 2: label is 12; the run's model has 10"):
        read_records(path)


def test_a_rerun_on_a_file_with_a_bad_label_says_what_to_do(tmp_path):
    path = write(tmp_path / "r.tsv", range(3))
    edit(path, 2, "label", "-1")
    edit(path, 2, "correct", "0")
    before = path.read_bytes()
    with pytest.raises(SmoothcertError) as info:
        open_records(path, CERTIFY, manifest())
    assert one_line(info) == (
        f"{path} line 2: label is -1; a label is a class, an integer >= 0; so it cannot be "
        "resumed: correct that line, or move r.tsv and r.tsv.manifest.json away to start again "
        "(or choose another --out)")
    assert path.read_bytes() == before


# --------------------------------------------------------------------------- item 5.7: streaming
def feed(tmp_path, parts, limit=64 << 20):
    """A named pipe that a thread fills with ``parts`` (bytes, repeated in turn until ``limit``
    bytes), and the count of bytes the reader took (read it after the reader is done)."""
    pipe = tmp_path / "r.tsv"
    os.mkfifo(pipe)
    taken = [0]

    def fill():
        try:
            with open(pipe, "wb", buffering=0) as f:
                k = 0
                while taken[0] < limit:
                    taken[0] += f.write(parts[min(k, len(parts) - 1)])
                    k += 1
        except BrokenPipeError:  # the reader gave up: what it took is counted
            pass

    thread = threading.Thread(target=fill, daemon=True)
    thread.start()
    return pipe, thread, taken


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
@pytest.mark.parametrize("junk, says", [
    (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 256, "not a record file"),  # not even a header
    (b"lorem ipsum\tdolor\n" * 4096, "line 2: 2 fields, the header has 13"),  # header, junk
    (("1\t" * 12 + "x\n").encode() * 4096, "line 2: seed is 'x'"),  # fields of a record
])
def test_junk_fails_at_its_first_bad_line_having_read_little(tmp_path, junk, says):
    # The probe: report on a 200 MB junk file read all of it (10.5 s, 3.3 GB) before failing.
    header = ("\t".join(CERTIFY) + "\n").encode()
    first = junk if b"PNG" in junk else header + junk
    pipe, thread, taken = feed(tmp_path, [first, junk])
    with pytest.raises(SmoothcertError) as info:
        read_records(pipe)
    thread.join(timeout=30)
    assert says in one_line(info)
    assert taken[0] < 4 << 20  # of 64 MiB offered: the first block and the pipe's buffer


def test_a_file_without_newlines_is_not_read_to_its_end(tmp_path):
    path = tmp_path / "r.tsv"
    path.write_bytes(b"idx" + b"x" * (3 << 20))  # one 3 MiB line: no header line
    with pytest.raises(SmoothcertError, match="not a record file"):
        read_records(path)


def test_a_file_read_in_many_blocks_is_read_whole_and_checked_across_blocks(tmp_path):
    count = 3000  # about 300 KB: several blocks of the stream
    path = write(tmp_path / "r.tsv", range(count), manifest(size=count))
    records = read_records(path)
    assert list(records["idx"]) == list(range(count))
    assert records["radius"].dtype == np.float64 and records["label"].dtype == np.int64
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines + [lines[5]]))  # idx 4 again, blocks after its first row
    with pytest.raises(SmoothcertError) as info:
        read_records(path)
    assert one_line(info) == (f"{path} line {count + 2}: idx 4 repeats line 6 (the same row "
                              "twice); an example has one row")


def test_an_unknown_column_of_numbers_then_text_is_text_throughout(tmp_path):
    count = 3000
    path = write(tmp_path / "r.tsv", range(count), manifest(size=count),
                 columns=(*CERTIFY, "note"),
                 make=lambda i: row(i, note=i if i < count - 1 else "late"))
    note = read_records(path)["note"]
    assert note.dtype == object and list(note[:2]) == ["0", "1"] and note[-1] == "late"


# --------------------------------------------------------------------------- item 4: folders
def test_a_folder_is_refused_in_one_line(tmp_path):
    with pytest.raises(SmoothcertError) as info:
        read_records(tmp_path)
    assert one_line(info) == f"cannot read record file {tmp_path}: it is a folder, not a file"
    with pytest.raises(SmoothcertError, match="it does not exist"):
        read_records(tmp_path / "missing.tsv")
