"""Which data a record file's rows were made from, and a resumed run's check that it still is.

A row's ``idx`` names an example by its position in the dataset, so a resumed run must read the
same examples at the same positions, or it appends rows whose ``idx`` names other examples than
the rows before. A run's manifest records the data in ``provenance.data_files``
(:func:`run_data_files`): for the in-memory datasets each file read (``{path, bytes, mtime[,
sha256]}``, :func:`smoothcert.data.datasets.describe_files`); for a streamed image or
segmentation folder its folder, class count, image count and ``listing_sha256``, the SHA-256 of
its file list in index order (each image's path relative to the split's folder, with its label,
or its mask's path).

:func:`check_same_data` refuses a resume, in one line naming what changed and the fix, when

* a folder has another class count, image count (images gone or added) or file list (an image
  or a mask renamed, or replaced by another name);
* the in-memory data come from another number of files, or a file differs: its SHA-256 where
  both manifests have one (files up to ``HASHED_FILE_BYTES``), else its size.

What may differ: where the data lie (a moved ``--data-root``, another copy of the same bytes)
and the files' times (a copy, ``touch``). Not seen, since it would cost reading the whole
dataset at every resume: a folder's image rewritten in place under its own name, and a file
over ``HASHED_FILE_BYTES`` changed at the same size. A manifest written before a field was
recorded is checked on the fields it has (a folder's counts, before ``listing_sha256``); one
without ``data_files`` (a user's own dataset) is not checked.
"""

from __future__ import annotations

import hashlib
import os

from ..data.datasets import data_files
from ..errors import SmoothcertError


def run_data_files(dataset) -> dict | None:
    """The ``data_files`` of a run's manifest for ``dataset``: :func:`~smoothcert.data.
    datasets.data_files`, with ``listing_sha256`` for a streamed folder (whose ``samples`` are
    its file list in index order)."""
    files = data_files(dataset)
    samples = getattr(dataset, "samples", None)
    if not isinstance(files, dict) or "image_files" not in files or samples is None:
        return files
    return {**files, "listing_sha256": listing_sha256(dataset.folder, samples)}


def listing_sha256(folder, samples) -> str:
    """The SHA-256 of a folder's file list in index order: each sample's paths relative to
    ``folder`` (so a moved folder keeps its listing) and its other fields, tab-separated, one
    line each."""
    prefix = os.path.join(str(folder), "")
    digest = hashlib.sha256()
    for sample in samples:
        cells = [c.removeprefix(prefix) if isinstance(c, str) else str(c) for c in sample]
        digest.update(("\t".join(cells) + "\n").encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def check_same_data(path, old_manifest: dict | None, files: dict | None) -> None:
    """Refuse to resume the record file ``path`` (its manifest ``old_manifest``) on data that
    differ from those its rows were made from (see the module doc); ``files`` is the new run's
    ``data_files``. One SmoothcertError line naming the change and the fix."""
    before = ((old_manifest or {}).get("provenance") or {}).get("data_files")
    if not isinstance(before, dict) or not isinstance(files, dict):
        return
    change = _folder_change(before, files) if "image_files" in files else \
        _files_change(before, files)
    if change:
        raise SmoothcertError(
            f"{path} was made from other data ({change}): resumed, its rows' idx would name "
            "other examples; restore the data (or pass the --data-root it was read from), or "
            "choose another --out to start a new record file")


def _folder_change(before: dict, now: dict) -> str | None:
    """What changed in a streamed folder, in words, or None."""
    folder = now.get("folder")
    if before.get("classes") not in (None, now.get("classes")):
        return f"{folder}: {before['classes']} classes then, {now.get('classes')} now"
    then, count = before.get("image_files"), now["image_files"]
    if isinstance(then, int) and then != count:
        many = abs(then - count)
        how = f"{many} image{'s' if many > 1 else ''} {'gone' if then > count else 'added'}"
        return f"{folder}: {how}, {then} then and {count} now"
    if before.get("listing_sha256") not in (None, now.get("listing_sha256")):
        return f"{folder}: images renamed or replaced, the same {count} but another file list"
    return None


def _files_change(before: dict, now: dict) -> str | None:
    """What changed in the files of an in-memory dataset, in words, or None."""
    old, new = before.get("files"), now.get("files")
    if not isinstance(old, list) or not isinstance(new, list):
        return None
    if len(old) != len(new):
        return f"read from {len(old)} files then, {len(new)} now"
    for a, b in zip(old, new):
        if not isinstance(a, dict) or not isinstance(b, dict):
            continue
        key = "sha256" if a.get("sha256") and b.get("sha256") else "bytes"
        if a.get(key) != b.get(key):
            what = "SHA-256" if key == "sha256" else "size"
            return f"{b.get('path')} differs from {a.get('path')} as it was read ({what})"
    return None
