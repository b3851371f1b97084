"""Step 13 item 1: a full disk during ``train`` or ``certify`` ends in one line naming the file
and the cause (exit 2), never a traceback; the previous checkpoint stays whole and ``--resume``
continues; ``log.tsv`` never lists an epoch whose checkpoint is not on disk.

No root needed: the disk fills up in a fake file (a write that raises ENOSPC after some bytes, as
the kernel does), and in the error torch itself raises when its zip writer's file write fails
(``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos ...``, measured with
torch 2.14 on a 200 KiB tmpfs)."""

from __future__ import annotations

import errno
import os

import pytest
import torch

import smoothcert.io as io_mod
import smoothcert.models.checkpoint as checkpoint_mod
from conftest import write_checkpoint
from smoothcert.cli.app import main
from smoothcert.io import append_lines, atomic_write, disk_full_error
from smoothcert.models.checkpoint import load_checkpoint
from smoothcert.runs.records import read_records

TRAIN = ["train", "--dataset", "digits", "--arch", "digits_cnn", "--method", "gaussian",
         "--sigma", "0.25", "--batch", "50", "--train-size", "100", "--epochs", "2",
         "--no-progress", "--device", "cpu"]
ENOSPC = "No space left on device"


def full(*args):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *args)


def one_line(capsys, *words) -> str:
    """The one error line on stderr (after the lines of the epochs that were trained)."""
    err = "".join(line for line in capsys.readouterr().err.splitlines(keepends=True)
                  if not line.startswith(("epoch=", "resuming")))
    assert err.count("\n") == 1 and err.startswith("smoothcert "), err
    for word in words:
        assert word in err, err
    return err


class FillingFile:
    """A binary file on a disk with ``room`` bytes left: a write past it writes what fits and
    raises ENOSPC, as ``write(2)`` does."""

    def __init__(self, f, room: int):
        self._f, self._room = f, room

    def write(self, data) -> int:
        data = bytes(data)
        if len(data) > self._room:
            self._f.write(data[: self._room])
            self._room = 0
            raise full()
        self._room -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def fill_disk_at_checkpoint(monkeypatch, nth: int, room: int = 2000):
    """The ``nth`` checkpoint written finds only ``room`` bytes free."""
    real_open, count = open, {"n": 0}

    def fake_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if "checkpoint.pt" in os.fspath(file) and "b" in mode:
            count["n"] += 1
            if count["n"] == nth:
                return FillingFile(f, room)
        return f

    monkeypatch.setattr(io_mod, "open", fake_open, raising=False)


def torch_save_fails_as_torch_does(monkeypatch, nth: int):
    """The ``nth`` ``torch.save`` raises what torch raises when its file write fails."""
    real_save, count = torch.save, {"n": 0}

    def fake_save(obj, f, *args, **kwargs):
        count["n"] += 1
        if count["n"] != nth:
            return real_save(obj, f, *args, **kwargs)
        try:
            raise full()
        except OSError:  # torch raises its error while handling the file's
            raise RuntimeError(  # noqa: B904
                "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(checkpoint_mod.torch, "save", fake_save)


def assert_resumes_after_epoch_1(run, monkeypatch, capsys):
    """The folder holds the whole checkpoint of epoch 1, a log of epoch 1 and no temporary
    file; once there is room, --resume trains epoch 2."""
    assert load_checkpoint(run / "checkpoint.pt").meta["epoch"] == 1
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.yaml", "log.tsv"]
    assert [r[0] for r in io_mod.read_tsv(run / "log.tsv")] == ["epoch", "1"]
    monkeypatch.undo()
    assert main([*TRAIN, "--out", str(run), "--resume"]) == 0
    assert load_checkpoint(run / "checkpoint.pt").meta["epoch"] == 2
    assert [r[0] for r in io_mod.read_tsv(run / "log.tsv")] == ["epoch", "1", "2"]
    capsys.readouterr()


# --------------------------------------------------------------------------- train
def test_a_checkpoint_into_a_full_disk_is_one_line_and_resumes(tmp_path, capsys, monkeypatch):
    """Before: torch.save wrote into the file and raised its RuntimeError: a traceback."""
    fill_disk_at_checkpoint(monkeypatch, nth=2)
    run = tmp_path / "run"
    assert main([*TRAIN, "--out", str(run)]) == 2
    one_line(capsys, f"disk full while saving epoch 2 to {run / 'checkpoint.pt'}", ENOSPC,
             "still holds epoch 1", "--resume")
    assert_resumes_after_epoch_1(run, monkeypatch, capsys)


def test_torchs_own_error_for_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    torch_save_fails_as_torch_does(monkeypatch, nth=2)
    run = tmp_path / "run"
    assert main([*TRAIN, "--out", str(run)]) == 2
    one_line(capsys, f"disk full while saving epoch 2 to {run / 'checkpoint.pt'}", ENOSPC,
             "still holds epoch 1")
    assert_resumes_after_epoch_1(run, monkeypatch, capsys)


def test_a_full_disk_at_the_log_row_leaves_the_log_whole(tmp_path, capsys, monkeypatch):
    """The row of epoch 2 half-written: the log is cut back to epoch 1 and no checkpoint of
    epoch 2 is written after it."""
    real_write, log = os.write, {"n": 0}

    def write(fd, data):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) == "log.tsv":
            log["n"] += 1
            if log["n"] == 2:  # epoch 1's header and row come in one write
                real_write(fd, bytes(data)[:5])
                raise full()
        return real_write(fd, data)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to tell the log's writes from others")
    monkeypatch.setattr(io_mod.os, "write", write)
    run = tmp_path / "run"
    assert main([*TRAIN, "--out", str(run)]) == 2
    one_line(capsys, f"disk full while saving epoch 2 to {run / 'log.tsv'}", ENOSPC,
             "still holds epoch 1")
    assert_resumes_after_epoch_1(run, monkeypatch, capsys)


def test_the_first_checkpoint_into_a_full_disk_leaves_nothing(tmp_path, capsys, monkeypatch):
    """Before: log.tsv listed epoch 1 though no checkpoint existed."""
    fill_disk_at_checkpoint(monkeypatch, nth=1)
    run = tmp_path / "run"
    assert main([*TRAIN, "--out", str(run)]) == 2
    one_line(capsys, "disk full while saving epoch 1", "no checkpoint was written yet")
    assert not run.exists()  # this run created it: a failed start leaves nothing behind


# --------------------------------------------------------------------------- certify
def test_a_full_disk_while_certifying_names_the_record_file(tmp_path, capsys, monkeypatch):
    """Before: "No space left on device: " with an empty path."""
    checkpoint = write_checkpoint(tmp_path / "c.pt")
    out = tmp_path / "r.tsv"
    real_fsync, rows = os.fsync, {"n": 0}

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}") == str(out):
            rows["n"] += 1
            if rows["n"] == 2:  # the second row
                raise full()
        return real_fsync(fd)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to tell the record file's writes from others")
    monkeypatch.setattr(io_mod.os, "fsync", fsync)
    args = ["certify", str(checkpoint), "--n0", "10", "--n", "50", "--batch", "32",
            "--no-progress", "--device", "cpu", "--max", "3", "--out", str(out)]
    assert main(args) == 2
    one_line(capsys, f"{ENOSPC}: {out}", "free some space")
    monkeypatch.undo()
    assert main(args) == 0
    assert len(read_records(out)) == 3


# --------------------------------------------------------------------------- report
def test_a_page_into_a_full_disk_names_the_page_not_its_temp_file(tmp_path, capsys, monkeypatch):
    """Before: "No space left on device: .../.r.html.<hex>.tmp", a file the user never named."""
    records = tmp_path / "c.tsv"  # Cohen et al.'s layout: no manifest needed
    records.write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\t0.5\t1\t1.5\n")
    real_open = open

    def full_open(file, mode="r", *args, **kwargs):
        if os.fspath(file).endswith(".tmp"):  # no room for the page's new file
            raise full(os.fspath(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(io_mod, "open", full_open, raising=False)
    page = tmp_path / "r.html"
    assert main(["report", str(records), "--format", "html", "--out", str(page)]) == 2
    assert ".tmp" not in one_line(capsys, f"{ENOSPC}: {page}; free some space")
    assert [p.name for p in tmp_path.iterdir()] == ["c.tsv"]


# --------------------------------------------------------------------------- the helpers
def test_a_failed_atomic_write_names_its_file_and_keeps_the_old_one(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    with pytest.raises(OSError) as caught, atomic_write(path, binary=True) as f:
        FillingFile(f, 2).write(b"new bytes")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_append_lines_is_all_or_nothing(tmp_path, monkeypatch):
    path = tmp_path / "log.tsv"
    append_lines(path, [["epoch", "loss"], [1, 0.5]])
    real_write = os.write

    def half(fd, data):
        real_write(fd, bytes(data)[:3])
        raise full()

    monkeypatch.setattr(io_mod.os, "write", half)
    with pytest.raises(OSError) as caught:
        append_lines(path, [[2, 0.25]])
    assert caught.value.filename == str(path)
    assert path.read_text() == "epoch\tloss\n1\t0.5\n"


def test_disk_full_is_recognised_behind_a_librarys_error():
    try:
        try:
            raise full()
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos")  # noqa: B904
    except RuntimeError as e:
        wrapped = e
    assert disk_full_error(wrapped).errno == errno.ENOSPC
    rust = RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")
    assert disk_full_error(rust).errno == errno.ENOSPC
    assert disk_full_error(RuntimeError("unexpected pos")) is None
    assert disk_full_error(OSError(errno.EACCES, "Permission denied")) is None


# --------------------------------------------------------------------------- the log follows
def failing_save(monkeypatch, epoch: int, error: BaseException, after_checkpoint: bool):
    """Epoch ``epoch``'s checkpoint step raises ``error``, before or after the file is written
    (after: as when the method's export beside it fails)."""
    from smoothcert.training import loop

    real = loop._save

    def save(path, trainer):
        if trainer.epoch == epoch and not after_checkpoint:
            raise error
        real(path, trainer)
        if trainer.epoch == epoch:
            raise error

    monkeypatch.setattr(loop, "_save", save)


def test_an_interrupt_before_the_checkpoint_takes_its_log_row_back(tmp_path, monkeypatch):
    """Before: log.tsv listed epoch 2, whose checkpoint was never written."""
    failing_save(monkeypatch, 2, KeyboardInterrupt(), after_checkpoint=False)
    run = tmp_path / "run"
    assert main([*TRAIN, "--out", str(run)]) == 130
    assert [r[0] for r in io_mod.read_tsv(run / "log.tsv")] == ["epoch", "1"]
    assert load_checkpoint(run).meta["epoch"] == 1


def test_a_full_disk_after_the_checkpoint_keeps_its_row(tmp_path, capsys, monkeypatch):
    failing_save(monkeypatch, 2, full(), after_checkpoint=True)
    run = tmp_path / "run"
    assert main([*TRAIN, "--out", str(run)]) == 2
    one_line(capsys, "disk full while saving epoch 2", f"{run / 'checkpoint.pt'} holds epoch 2")
    assert [r[0] for r in io_mod.read_tsv(run / "log.tsv")] == ["epoch", "1", "2"]
    assert load_checkpoint(run).meta["epoch"] == 2
