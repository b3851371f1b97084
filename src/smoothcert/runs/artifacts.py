"""Per-example images beside a record file: a segmentation certifier's per-pixel certified map.

A certifier's row may carry ``"artifacts": {name: uint8 array (H, W)}``. Each is written as a PNG
to ``<records file>.<name>/<idx>.png`` (:func:`artifact_path`) atomically *before* the row is
appended, and the row gets ``<name>_sha256``, the PNG's SHA-256: a row in the file therefore
means its image is complete, a resumed run rewrites the image of an example whose row never
landed, and a reader refuses an image that is missing or is not the one its row names
(:func:`read_artifact`). A resumed run redoes an example whose image is missing or not its row's
(:func:`stale_artifacts`). ``merge`` copies the shards' images beside the merged file, each
checked against its row, all or none (:func:`stage_artifacts`). A run without a record file
keeps the arrays in its returned rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..errors import SmoothcertError
from ..io import atomic_write, disk_full_error, fsync_dir, remove_path

ARTIFACTS = "artifacts"  # the key of a row's images, popped before the row is written
SUFFIX = "_sha256"


def artifact_dir(records_path, name: str) -> Path:
    """The folder of the images ``name`` of a record file: ``<file>.<name>``."""
    return Path(f"{records_path}.{name}")


def artifact_path(records_path, name: str, idx: int) -> Path:
    return artifact_dir(records_path, name) / f"{int(idx)}.png"


def encode_png(array: np.ndarray) -> bytes:
    """A uint8 (H, W) array as PNG bytes (lossless, greyscale)."""
    from PIL import Image

    array = np.asarray(array)
    if array.dtype != np.uint8 or array.ndim != 2:
        raise SmoothcertError(f"an artifact is a uint8 (H, W) array, got {array.dtype} "
                              f"{array.shape}")
    out = io.BytesIO()
    Image.fromarray(array, mode="L").save(out, format="PNG")
    return out.getvalue()


def save_artifacts(records_path, idx: int, artifacts: Mapping[str, np.ndarray]) -> dict:
    """Write each image of one row (``records_path`` None: none written) and return the row's
    ``<name>_sha256`` columns."""
    columns = {}
    for name, array in artifacts.items():
        data = encode_png(array)
        if records_path is not None:
            path = artifact_path(records_path, name, idx)
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(path, binary=True) as f:
                f.write(data)
        columns[name + SUFFIX] = hashlib.sha256(data).hexdigest()
    return columns


def read_artifact(records_path, name: str, idx: int, sha256: str | None = None) -> np.ndarray:
    """The image ``name`` of row ``idx`` as a uint8 (H, W) array, checked against the row's
    ``sha256`` when given: one SmoothcertError line for a missing or different file."""
    from PIL import Image

    path = artifact_path(records_path, name, idx)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise SmoothcertError(f"{path}: cannot read the {name} of example {idx} "
                              f"({err.strerror or err}); it is written beside its record file"
                              ) from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise SmoothcertError(f"{path} is not the {name} its record row names (SHA-256 "
                              f"differs): the file was changed or belongs to another run")
    return np.asarray(Image.open(io.BytesIO(data)))


def artifact_names(columns: Sequence[str]) -> list[str]:
    """The images a record file's rows name: its ``<name>_sha256`` columns."""
    return [c[:-len(SUFFIX)] for c in columns if c.endswith(SUFFIX)]


def stale_artifacts(records) -> dict[int, Path]:
    """The rows of ``records`` (a ``Records``) whose image is missing, unreadable or not the
    one the row names (SHA-256): idx → that image's path. A resumed run redoes these examples."""
    stale = {}
    for name in artifact_names(records.columns_order):
        for idx, sha in zip(np.asarray(records["idx"], dtype=np.int64), records[name + SUFFIX]):
            path = artifact_path(records.path, name, int(idx))
            try:
                same = hashlib.sha256(path.read_bytes()).hexdigest() == sha
            except OSError:
                same = False
            if not same:
                stale.setdefault(int(idx), path)
    return stale


def stage_artifacts(parts: Sequence, out, columns: Sequence[str]) -> dict[Path, Path]:
    """Copy the images of the shard files ``parts`` (``Records``) for the merged file ``out``
    into new hidden folders beside it; return {the folder they belong in: its staged folder}
    (``merge`` renames each into place with the merged file, :func:`~smoothcert.io.
    replacing_together`). Each image is checked against its row's SHA-256 and written with
    fsync. Any failure removes the staged folders and is one SmoothcertError line naming the
    culprit: the shard's image when it is missing, unreadable or not its row's, the merged
    file's image when it cannot be written (a full disk)."""
    staged: dict[Path, Path] = {}
    try:
        for name in artifact_names(columns):
            target = artifact_dir(out, name)
            staged[target] = folder = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
            with _writing(target):
                folder.mkdir()
            for part in parts:
                for idx, sha in zip(np.asarray(part["idx"], dtype=np.int64),
                                    part[name + SUFFIX]):
                    data = _checked_source(part.path, name, int(idx), sha)
                    with _writing(artifact_path(out, name, int(idx))):
                        _write_new(folder / f"{int(idx)}.png", data)
            fsync_dir(folder)
    except BaseException:
        for folder in staged.values():
            remove_path(folder)
        raise
    return staged


def _checked_source(records_path, name: str, idx: int, sha256: str) -> bytes:
    """The bytes of a shard's image, which must be the one its row names."""
    path = artifact_path(records_path, name, idx)
    fix = f"rerun the command of shard {records_path} (it redoes such an example), then merge"
    try:
        data = path.read_bytes()
    except OSError as err:
        raise SmoothcertError(f"{path}: cannot read the {name} of example {idx} of "
                              f"{records_path} ({err.strerror or err}); {fix}") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SmoothcertError(f"{path} is not the {name} of example {idx} that its row in "
                              f"{records_path} names (SHA-256 differs); {fix}")
    return data


def _write_new(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def _writing(target: Path):
    """An OSError in the block is one line naming ``target``, the merged file's image or
    folder being written (not the staged copy: the user never named it, and it is removed),
    and for a full disk, that it is full."""
    try:
        yield
    except OSError as err:
        full = disk_full_error(err) is not None
        advice = "; the disk is full: free some space, then merge again" if full else ""
        raise SmoothcertError(f"cannot write {target}: {err.strerror or err}{advice}") from None
