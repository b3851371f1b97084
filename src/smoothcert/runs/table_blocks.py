"""A record file read in blocks of whole lines, each split into its cells and checked before
the next is read (:func:`~smoothcert.runs.records.read_records` streams every file so): a file
that is not a record file fails on its first line, one that turns bad in the block of its first
bad line, and a file of 10^5 rows is split with numpy, not line by line."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import SmoothcertError

FIRST_BLOCK, LAST_BLOCK = 1 << 16, 1 << 23  # bytes read at once: from 64 KiB, doubling to 8 MiB
MAX_LINE = 1 << 20  # bytes: a record line holds a few hundred; a longer one is not a record


def open_table(path: Path):
    """The record file open for reading bytes; a folder or a missing file is one line."""
    if path.is_dir():
        raise SmoothcertError(f"cannot read record file {path}: it is a folder, not a file")
    try:
        return open(path, "rb")  # noqa: SIM115 (the caller's with block closes it)
    except OSError as e:
        why = "it does not exist" if isinstance(e, FileNotFoundError) else e.strerror
        raise SmoothcertError(f"cannot read record file {path}: {why}") from e


def first_line(path: Path, f) -> tuple:
    """The first line's column names; a file whose first line has no ``idx`` column is refused
    having read that line alone (at most :data:`MAX_LINE` bytes)."""
    first = f.readline(MAX_LINE + 1)
    text = first[:-1].decode("utf-8", errors="replace") if first.endswith(b"\n") else ""
    header = tuple(text.split("\t"))
    if "idx" not in header:
        raise SmoothcertError(f"{path} is not a record file (no header line with an 'idx' column)")
    return header


def line_blocks(path: Path, f):
    """``(block, torn)``: the rest of the file as blocks of whole lines, then ``(b"", torn)``,
    torn saying whether a torn last line (no newline: a killed run was writing it) was left."""
    size, rest, lines = FIRST_BLOCK, b"", 2
    while data := f.read(size):
        data = rest + data
        end = data.rfind(b"\n") + 1
        rest, size = data[end:], min(2 * size, LAST_BLOCK)
        lines += data.count(b"\n", 0, end)
        if len(rest) > MAX_LINE:
            raise SmoothcertError(f"{path} line {lines}: longer than {MAX_LINE} bytes; not a "
                                  "record file")
        yield data[:end], False
    yield b"", bool(rest)


def _decoded(path: Path, data: bytes, line: int) -> str:
    """``data`` (lines from ``line`` on) as UTF-8 text; else the line that is not, in one line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = line + data.count(b"\n", 0, e.start)
        raise SmoothcertError(f"cannot read record file {path}: line {bad} is not UTF-8 "
                              "text") from None


def split_block(path: Path, header: tuple, block: bytes, first: int) -> tuple[list, int]:
    """The fields of the lines of ``block`` (the first on line ``first``) column by column, and
    the number of lines; a line with another number of fields than the header is refused.
    Vectorised for files of 10^5 rows: fields are counted per line with numpy on the bytes (no
    UTF-8 character holds a tab or newline byte) and split in one call."""
    text = _decoded(path, block, first)
    codes = np.frombuffer(block, dtype=np.uint8)
    tabs = np.searchsorted(np.flatnonzero(codes == 9), np.flatnonzero(codes == 10))
    fields = np.diff(tabs, prepend=0) + 1
    wrong = np.flatnonzero(fields != len(header))
    if wrong.size:
        i = int(wrong[0])
        raise SmoothcertError(f"{path} line {first + i}: {fields[i]} fields, the header has "
                              f"{len(header)}")
    flat = text.replace("\n", "\t").split("\t")[:-1]
    return [flat[j::len(header)] for j in range(len(header))], len(fields)
