"""File helpers shared by the records, the training log, checkpoints, plots and reports.

* **Atomic writes** (:func:`atomic_write`): a file is written to a temporary file beside it,
  fsynced and renamed over the old one, so a reader or a crash sees the old file or the new one,
  never a mix; several files and folders replaced all or none (:func:`replacing_together`).
* **Hashing** (:func:`file_sha256`): the fingerprint of a checkpoint in a run's identity and in an
  imported checkpoint's provenance.
* **TSV** files (record files and ``log.tsv``): a header line, then one row per line, cells
  separated by tabs. Rows are appended and fsynced as they are produced (:func:`append_rows`);
  a process killed while appending leaves a *torn* last line without its newline, which
  :func:`read_tsv` never returns and :func:`trim_tsv` drops before a resumed run appends. Cells
  are written by :func:`format_value`: floats with ``repr`` (the shortest string that reads back
  to the same float), booleans as 0/1.
* **A failed write names its file**: an ``OSError`` raised while writing (a full disk) carries
  the path written, and :func:`disk_full_error` recognises a full disk or quota even where a
  library (``torch.save``, safetensors) wrapped the ``OSError`` in its own error.
* **One writer per file or folder** (:class:`FileLock`): an exclusive, non-blocking ``flock``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

import numpy as np

from .errors import SmoothcertError


# --------------------------------------------------------------------------- atomic writes
@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, binary: bool = False) -> Iterator[IO]:
    """A new file object whose content replaces ``path`` when the block ends without error.

    It writes ``.NAME.<random>.tmp`` in ``path``'s folder (text as UTF-8, or bytes); at the end
    of the block the file is flushed, fsynced and renamed over ``path`` (``os.replace``), and the
    folder is fsynced so that the rename survives a crash. If the block raises, the temporary
    file is removed and ``path`` is left as it was; an ``OSError`` names ``path`` (its
    ``filename``, no ``filename2``), never the temporary file, which the user never asked for
    and which is gone: a write into a full disk names no file, and creating or renaming the
    temporary file names that file. A new file gets the permissions of
    a plain ``open`` (0o666 less the umask); a file replaced keeps its own permission bits (a
    shared document at 0o664 stays 0o664, a private one at 0o600 stays private). The folder
    must exist.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb" if binary else "x", encoding=None if binary else "utf-8") as f:
            _keep_mode(path, f.fileno())
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        _name_file(e, path, tmp)
        raise
    fsync_dir(path.parent)


def _name_file(e: BaseException, path, tmp=None) -> None:
    """Give an ``OSError`` of a write that names no file (``write``, ``flush`` and ``fsync``
    errors do not), or names only the temporary file ``tmp`` written for ``path`` (``open``,
    ``os.replace``), the path being written, so that its one-line message says which file."""
    if not isinstance(e, OSError) or e.errno is None:
        return
    temporary = {None, os.fspath(tmp)} if tmp is not None else {None}
    if e.filename in temporary and getattr(e, "filename2", None) in (None, os.fspath(path)):
        e.filename, e.filename2 = os.fspath(path), None


def _keep_mode(path: Path, fd: int) -> None:
    """Give the open temporary file ``fd`` the permission bits of the file it will replace."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return  # a new file: open() applied the umask
    if hasattr(os, "fchmod"):  # not on Windows, whose files have no such bits
        os.fchmod(fd, stat.S_IMODE(mode))


@contextlib.contextmanager
def replacing_together(paths: Iterable) -> Iterator[None]:
    """Replace the files and folders at ``paths`` all together or not at all: the block writes
    them (each path is free when it starts); if it raises, what it wrote there is removed and
    each path holds what it held before (or nothing, as before); else what was there before is
    removed.

    What is there before the block is renamed aside, beside itself (``.NAME.<random>.old``: a
    rename needs no disk space, so a full disk cannot stop the way back), and removed once the
    block has ended; a crash in the block leaves it under that name.
    """
    free, aside = [], {}
    try:
        for path in map(Path, paths):
            if os.path.lexists(path):
                old = path.with_name(f".{path.name}.{uuid.uuid4().hex}.old")
                os.replace(path, old)
                aside[path] = old
            free.append(path)
        yield
    except BaseException:
        for path in free:
            remove_path(path)
        for path, old in aside.items():
            os.replace(old, path)
        raise
    for old in aside.values():
        remove_path(old)


def remove_path(path: str | os.PathLike) -> None:
    """Remove the file, link or folder (with what it holds) at ``path``, if any."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace ``path`` by ``text`` (UTF-8) with :func:`atomic_write`."""
    with atomic_write(path) as f:
        f.write(text)


def write_json_atomic(path: str | os.PathLike, obj: dict) -> None:
    """Replace ``path`` by ``obj`` as indented JSON with sorted keys, atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename in ``folder`` durable; a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether paths ``a`` and ``b`` name one file: equal once resolved (links, ``..``), or,
    where both exist, the same file (``os.path.samefile``: hard links, case-insensitive
    file systems)."""
    a, b = Path(a).expanduser(), Path(b).expanduser()
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def check_not_input(out: str | os.PathLike, inputs: Iterable, flag: str = "--out",
                    what: str = "which this command reads") -> None:
    """Refuse to write ``out`` when it is one of ``inputs`` (see :func:`same_file`): an output
    must never overwrite what the command reads. ``flag`` names the output in the message."""
    for path in inputs:
        if same_file(out, path):
            raise SmoothcertError(f"{flag} would overwrite {path}, {what}; choose another {flag}")


# --------------------------------------------------------------------------- full disks, locks
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# What a full disk reads as once a library has turned its OSError into its own error: the
# OS's words, and Rust's (safetensors: "... Os { code: 28, kind: StorageFull ... }").
_DISK_FULL_WORDS = ("no space left on device", "disk quota exceeded", "storagefull",
                    "os error 28")


def disk_full_error(e: BaseException) -> OSError | None:
    """The ``OSError`` of a full disk or quota behind ``e``, or None when ``e`` is something
    else. ``e`` itself, or an error it was raised from or during (``torch.save`` into a full
    disk raises ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos`` while
    handling the file's ``OSError``), or an error whose text says so (one without an
    ``OSError`` behind it comes back as a new ``OSError(ENOSPC)``)."""
    seen = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in DISK_FULL:
            return cause
        cause = cause.__cause__ or cause.__context__
    if any(words in str(e).lower() for words in _DISK_FULL_WORDS):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return None


class FileLock:
    """An exclusive, non-blocking ``flock`` on the file ``path`` (created if missing), held until
    :meth:`release` (or the end of a ``with`` block), which removes the file.

    Taken while a record file or a run folder is written, it makes a second writer (a double
    launch, two shards given one index, two ``train`` runs into one ``--out``) fail at once with
    the one-line ``SmoothcertError(busy)`` instead of interleaving its writes with the first's.
    The kernel drops the lock when its process dies, so a killed run never blocks the rerun.
    Where ``fcntl`` is missing (Windows) nothing is locked.
    """

    def __init__(self, path: str | os.PathLike, busy: str):
        self.path = Path(path)
        self._fd = None
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return
        # A lock file removed by its releasing owner between our open and our flock would
        # leave us locking a file no one else sees: retry on the file now at the path.
        for _ in range(10):
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise SmoothcertError(busy) from None
            if _same_inode(fd, self.path):
                self._fd = fd
                return
            os.close(fd)
        raise SmoothcertError(busy)

    def release(self) -> None:
        """Remove the lock file and drop the lock (in this order: see ``__init__``)."""
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _same_inode(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


# --------------------------------------------------------------------------- hashing
def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a checkpoint file's bytes, as 64 hex digits, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise SmoothcertError(f"cannot read checkpoint {path}: {e.strerror}") from e
    return digest.hexdigest()


# --------------------------------------------------------------------------- TSV files
def format_value(value) -> str:
    """One TSV cell: integers and booleans (as 0/1) in decimal, floats with ``repr`` (full
    precision, ``nan``/``inf`` as Python writes them), anything else with ``str``."""
    if isinstance(value, (bool, np.bool_)):
        return str(int(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    return str(value)


def format_row(values: Iterable) -> str:
    """One TSV line, newline included."""
    return "\t".join(format_value(v) for v in values) + "\n"


def append_rows(file: IO[str], rows: Iterable[Iterable]) -> None:
    """Append ``rows`` (each a sequence of cell values) to the open text ``file``, then flush and
    fsync it: when this returns, the rows are on disk. An ``OSError`` (a full disk) is given
    the file's name."""
    try:
        for row in rows:
            file.write(format_row(row))
        file.flush()
        os.fsync(file.fileno())
    except OSError as e:
        _name_file(e, getattr(file, "name", "?"))
        raise


def append_lines(path: str | os.PathLike, lines: Iterable[Iterable]) -> None:
    """Append the TSV ``lines`` (each a sequence of cell values) to the file ``path`` (created if
    missing) and fsync it, all or nothing: a write that fails (a full disk) cuts the file back
    to its size before, which needs no space, and raises the ``OSError`` naming ``path``. The
    bytes go straight to the file (no buffer that a later close could flush half of)."""
    data = "".join(format_row(line) for line in lines).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            _name_file(e, path)
            raise
    finally:
        os.close(fd)


def read_tsv(path: str | os.PathLike) -> list[list[str]]:
    """The complete lines of a TSV file (the header first), each split into its cells.

    What follows the last newline (nothing, or a torn line) is left out. Raises ``OSError`` or
    ``UnicodeDecodeError`` as reading the file does.
    """
    text = Path(path).read_text(encoding="utf-8")
    return [line.split("\t") for line in text.split("\n")[:-1]]


def trim_tsv(
    path: str | os.PathLike, keep: Callable[[list[str], list[str]], bool] | None = None
) -> None:
    """Drop a torn last line, and every row for which ``keep(header, row)`` (cells) is false.

    The file is rewritten atomically, and only when something is dropped.
    """
    path = Path(path)
    data = path.read_bytes()
    lines = data.split(b"\n")[:-1]
    header = lines[0].decode("utf-8").split("\t") if lines else []
    kept = lines[:1] + [line for line in lines[1:]
                        if keep is None or keep(header, line.decode("utf-8").split("\t"))]
    if data.endswith(b"\n") and len(kept) == len(lines) or not data:
        return
    with atomic_write(path, binary=True) as f:
        f.write(b"".join(line + b"\n" for line in kept))
