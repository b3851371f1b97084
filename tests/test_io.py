"""smoothcert.io: atomic writes, hashing, and the TSV layout of the records and the training log."""

import errno
import hashlib
import json
import math
import os

import numpy as np
import pytest

import smoothcert.io as io_mod
from smoothcert.errors import SmoothcertError
from smoothcert.io import (
    append_rows,
    atomic_write,
    file_sha256,
    format_row,
    format_value,
    read_tsv,
    replacing_together,
    trim_tsv,
    write_json_atomic,
    write_text_atomic,
)
from smoothcert.runs.records import open_records
from smoothcert.training.loop import _EpochLog


# --------------------------------------------------------------------------- atomic writes
def test_atomic_write_replaces_the_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "f.txt"
    write_text_atomic(path, "old\n")
    write_text_atomic(path, "néw\n")
    assert path.read_bytes() == "néw\n".encode()
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    with pytest.raises(OSError, match="disk full"), atomic_write(path, binary=True) as f:
        f.write(b"half")
        raise OSError("disk full")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_atomic_write_gives_a_new_file_the_umask_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "f.txt", "x")
    finally:
        os.umask(umask)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o644



@pytest.mark.parametrize("mode", [0o664, 0o600])
def test_atomic_write_keeps_the_permissions_of_the_file_it_replaces(tmp_path, mode):
    path = tmp_path / "doc.md"
    path.write_text("old\n")
    path.chmod(mode)
    umask = os.umask(0o077)  # stricter than the file: the replacement must not take it
    try:
        write_text_atomic(path, "new\n")
    finally:
        os.umask(umask)
    assert path.read_text() == "new\n"
    assert path.stat().st_mode & 0o777 == mode

def test_a_failed_atomic_write_names_the_target_never_its_temp_file(tmp_path, monkeypatch):
    """Before: the error named ``.f.txt.<hex>.tmp``, a file the user never asked for."""
    missing = tmp_path / "no" / "f.txt"
    with pytest.raises(FileNotFoundError) as caught:
        write_text_atomic(missing, "x")  # the temporary file cannot be created
    assert (caught.value.filename, caught.value.filename2) == (str(missing), None)
    path = tmp_path / "f.txt"

    def refuse(src, dst):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), os.fspath(src), os.fspath(dst))

    monkeypatch.setattr(io_mod.os, "replace", refuse)
    with pytest.raises(OSError) as caught:
        write_text_atomic(path, "x")
    assert (caught.value.filename, caught.value.filename2) == (str(path), None)
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone


def test_replacing_together_is_all_or_nothing(tmp_path):
    a, folder = tmp_path / "a.tsv", tmp_path / "a.tsv.map"
    a.write_text("old")
    folder.mkdir()
    (folder / "0.png").write_text("old map")
    with pytest.raises(RuntimeError), replacing_together([a, folder]):
        assert not a.exists() and not folder.exists()  # each path free for the block
        a.write_text("new")
        folder.mkdir()
        raise RuntimeError("the disk filled up")
    assert a.read_text() == "old" and (folder / "0.png").read_text() == "old map"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tsv", "a.tsv.map"]
    with replacing_together([a, folder, tmp_path / "b.json"]):
        a.write_text("new")
        folder.mkdir()
        (tmp_path / "b.json").write_text("{}")
    assert a.read_text() == "new" and list(folder.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tsv", "a.tsv.map", "b.json"]


def test_json_is_indented_with_sorted_keys_and_a_final_newline(tmp_path):
    write_json_atomic(tmp_path / "m.json", {"b": 1, "a": [1.5, None]})
    text = (tmp_path / "m.json").read_text()
    assert text == '{\n  "a": [\n    1.5,\n    null\n  ],\n  "b": 1\n}\n'
    assert json.loads(text) == {"a": [1.5, None], "b": 1}


# --------------------------------------------------------------------------- hashing
def test_file_sha256_over_several_blocks(tmp_path):
    data = bytes(range(256)) * 9000  # 2.2 MiB: three 1 MiB blocks
    (tmp_path / "c.pt").write_bytes(data)
    assert file_sha256(tmp_path / "c.pt") == hashlib.sha256(data).hexdigest()


def test_file_sha256_of_a_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(SmoothcertError, match="cannot read checkpoint"):
        file_sha256(tmp_path / "nope.pt")


def test_the_old_import_paths_of_file_sha256_still_work():
    from smoothcert.models import importers
    from smoothcert.runs import inputs

    assert importers.file_sha256 is inputs.file_sha256 is file_sha256


# --------------------------------------------------------------------------- TSV cells and rows
@pytest.mark.parametrize("value, text", [
    (0, "0"), (-3, "-3"), (10**20, "100000000000000000000"), (True, "1"), (False, "0"),
    (np.bool_(True), "1"), (np.int64(7), "7"), (np.uint8(255), "255"),
    (0.1, "0.1"), (1 / 3, "0.3333333333333333"), (-0.0, "-0.0"), (1e-300, "1e-300"),
    (2.5, "2.5"), (np.float64(0.1), "0.1"), (np.float32(0.1), "0.10000000149011612"),
    (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), ("pgd", "pgd"),
])
def test_format_value(value, text):
    assert format_value(value) == text


def test_floats_read_back_exactly():
    rng = np.random.default_rng(0)
    values = rng.standard_normal(1000) * 10.0 ** rng.integers(-300, 300, 1000)
    assert all(float(format_value(v)) == v for v in values)


def test_append_and_read_round_trip_and_a_torn_line_is_not_read(tmp_path):
    path = tmp_path / "t.tsv"
    with open(path, "a", encoding="utf-8") as f:
        append_rows(f, [("idx", "radius"), (0, 0.1), (1, 1 / 3)])
    assert path.read_text() == "idx\tradius\n0\t0.1\n1\t0.3333333333333333\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write("2\t0.")  # a writer killed mid-line
    assert read_tsv(path) == [["idx", "radius"], ["0", "0.1"], ["1", "0.3333333333333333"]]
    assert format_row(["a", 1, 2.0]) == "a\t1\t2.0\n"


def test_trim_drops_a_torn_line_and_refused_rows(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_text("epoch\tloss\n1\t0.5\n2\t0.25\n3\t0.125\n4\t0.0")
    trim_tsv(path, lambda header, row: len(row) == len(header) and int(row[0]) <= 2)
    assert path.read_text() == "epoch\tloss\n1\t0.5\n2\t0.25\n"
    trim_tsv(path)  # nothing to drop
    assert path.read_text() == "epoch\tloss\n1\t0.5\n2\t0.25\n"


def test_trim_leaves_a_complete_file_untouched(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_text("idx\n0\n1\n")
    inode = path.stat().st_ino
    trim_tsv(path)
    assert path.stat().st_ino == inode  # not rewritten
    path.write_text("idx\n0\n1")
    trim_tsv(path)
    assert path.read_text() == "idx\n0\n"


# --------------------------------------------------------------------------- both users
def test_records_and_the_training_log_write_the_same_bytes(tmp_path):
    row = {"idx": 3, "radius": 0.1 + 0.2, "correct": True, "time": 1e-7}
    writer, _ = open_records(tmp_path / "r.tsv", list(row), {"identity": {}})
    with writer:
        writer.write(row)
    log = _EpochLog(tmp_path / "log.tsv", 0)
    log.append(row)
    expected = "idx\tradius\tcorrect\ttime\n3\t0.30000000000000004\t1\t1e-07\n"
    assert (tmp_path / "r.tsv").read_text() == (tmp_path / "log.tsv").read_text() == expected


def test_the_training_log_resumes_after_the_checkpoint_epoch(tmp_path):
    path = tmp_path / "log.tsv"
    log = _EpochLog(path, 0)
    for epoch in (1, 2, 3):
        log.append({"epoch": epoch, "loss": 1.0 / epoch})
    with open(path, "a") as f:
        f.write("4\t0.2")  # killed while writing epoch 4
    log = _EpochLog(path, 2)  # the checkpoint holds epoch 2
    log.append({"loss": 0.75, "epoch": 3})  # columns in another order: the header's order wins
    assert path.read_text() == "epoch\tloss\n1\t1.0\n2\t0.5\n3\t0.75\n"
    with pytest.raises(RuntimeError, match="log columns changed"):
        log.append({"epoch": 4, "loss": 0.1, "extra": 0.0})


# --------------------------------------------------------------------------- locks
def test_a_file_lock_refuses_a_second_holder_until_released(tmp_path):
    from smoothcert.io import FileLock

    path = tmp_path / "x.lock"
    with FileLock(path, "first"):
        assert path.exists()
        with pytest.raises(SmoothcertError, match="^busy: x$"):
            FileLock(path, "busy: x")
    assert not path.exists()  # removed on release
    FileLock(path, "free again").release()


def test_a_file_lock_whose_file_was_replaced_locks_the_new_file(tmp_path, monkeypatch):
    """The holder removes the lock file just after our open: we must not lock the removed one."""
    import fcntl

    from smoothcert.io import FileLock

    path, calls = tmp_path / "x.lock", {"n": 0}
    real_flock = fcntl.flock

    def flock(fd, op):
        calls["n"] += 1
        if calls["n"] == 1:  # the first file vanishes between our open and our flock
            path.unlink()
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    lock = FileLock(path, "busy")
    monkeypatch.undo()
    assert calls["n"] == 2 and path.exists()
    with pytest.raises(SmoothcertError):  # the file at the path is the one held
        FileLock(path, "busy")
    lock.release()
