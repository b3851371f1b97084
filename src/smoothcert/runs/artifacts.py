"""Per-example images beside a record file: a segmentation certifier's per-pixel certified map.

A certifier's row may carry ``"artifacts": {name: uint8 array (H, W)}``. Each is written as a PNG
to ``<records file>.<name>/<idx>.png`` (:func:`artifact_path`) atomically *before* the row is
appended, and the row gets ``<name>_sha256``, the PNG's SHA-256: a row in the file therefore
means its image is complete, a resumed run rewrites the image of an example whose row never
landed, and a reader refuses an image that is missing or is not the one its row names
(:func:`read_artifact`). ``merge`` copies the shards' images beside the merged file
(:func:`merge_artifacts`). A run without a record file keeps the arrays in its returned rows.
"""

from __future__ import annotations

import hashlib
import io
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from ..errors import SmoothcertError
from ..io import atomic_write

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


def merge_artifacts(parts: Iterable, out, columns: Sequence[str]) -> None:
    """Copy each shard file's images (``parts``: ``Records``) beside the merged file ``out``."""
    for name in artifact_names(columns):
        for part in parts:
            for idx in np.asarray(part["idx"], dtype=np.int64):
                target = artifact_path(out, name, int(idx))
                target.parent.mkdir(parents=True, exist_ok=True)
                source = artifact_path(part.path, name, int(idx))
                try:
                    shutil.copyfile(source, target)
                except OSError as err:
                    raise SmoothcertError(f"{source}: cannot copy the {name} of example {idx} "
                                          f"({err.strerror or err})") from None
