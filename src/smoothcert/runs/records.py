"""Per-example record files: append, resume, shard, merge, and read (ours and Cohen et al.'s).

A record file is a TSV with a header line and one row per example, written and fsynced as each
example finishes. Cohen et al.'s columns come first (``idx label predict radius correct time``;
``predict`` is -1 on abstention, as in their files), then ours. Floats are written with ``repr``
(shortest round-trip form, i.e. full precision). A manifest ``FILE.manifest.json`` beside the file
holds the configuration that produced it (with its ``format_version``; older manifests are read
through :mod:`smoothcert.upgrade`); a rerun with the same configuration resumes after the
last complete row (a torn last line, from a killed process, is dropped and redone), and a rerun
with another configuration is refused.

Every reader — ``report``, ``merge`` and a resumed run — goes through :func:`read_records`,
which validates each row against the schema of :mod:`smoothcert.runs.schema` and the manifest;
the torn last line is the one defect it tolerates (and logs).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import SmoothcertError
from ..io import (
    FileLock,
    append_rows,
    format_row,
    remove_path,
    replacing_together,
    trim_tsv,
    write_json_atomic,
    write_text_atomic,
)
from ..upgrade import MANIFEST_VERSION, VERSION_KEY, upgrade_header, upgrade_manifest
from .artifacts import stage_artifacts, stale_artifacts
from .schema import check_header, check_rows, parse_columns, parse_unknown, row_rules
from .table_blocks import first_line, line_blocks, open_table, split_block

log = logging.getLogger(__name__)

MANIFEST_SUFFIX = ".manifest.json"
COHEN_COLUMNS = ("idx", "label", "predict", "radius", "correct", "time")


# --------------------------------------------------------------------------- the index contract
def global_indices(dataset_size: int, skip: int = 1, max_count: int | None = None) -> list[int]:
    """Every ``skip``-th index of the dataset, at most ``max_count`` of them.

    Note: ``max_count`` counts examples; Cohen et al.'s ``--max`` bounded the index instead.
    """
    indices = list(range(0, dataset_size, skip))
    return indices if max_count is None else indices[:max_count]


def shard_indices(indices: Sequence[int], shard_index: int, num_shards: int) -> list[int]:
    """Shard k of K takes every K-th index starting at k (balanced, disjoint, covering)."""
    return list(indices[shard_index::num_shards])


def shard_path(path: str | os.PathLike, shard_index: int, num_shards: int) -> Path:
    """``out.tsv`` → ``out.shard03-of-16.tsv`` when there is more than one shard."""
    path = Path(path)
    if num_shards == 1:
        return path
    width = len(str(num_shards - 1))
    return path.with_name(f"{path.stem}.shard{shard_index:0{width}d}-of-{num_shards}{path.suffix}")


def manifest_path(path: str | os.PathLike) -> Path:
    return Path(str(path) + MANIFEST_SUFFIX)


# --------------------------------------------------------------------------- writing and resuming
class RecordWriter:
    """Appends rows to a record file, each flushed and fsynced before :meth:`write` returns.

    Open it with :func:`open_records`, which validates and repairs an existing file first.
    """

    def __init__(self, path: Path, columns: Sequence[str], lock: FileLock | None = None):
        self.path = Path(path)
        self.columns = tuple(columns)
        self._lock = lock
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (held across writes)

    def write(self, row: dict) -> None:
        if set(row) != set(self.columns):
            raise ValueError(f"row keys {sorted(row)} differ from columns {list(self.columns)}")
        append_rows(self._file, [[row[c] for c in self.columns]])

    def close(self) -> None:
        self._file.close()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_records(path, columns: Sequence[str], manifest: dict) -> tuple[RecordWriter, set[int]]:
    """Create or resume the record file at ``path``; return the writer and the indices done.

    ``manifest`` must hold ``"identity"``: everything that determines the rows; it is written
    with ``columns`` and the current ``format_version`` (``smoothcert.upgrade``), and compared
    with an existing file's manifest as read (upgraded). An existing file
    with another identity, another header, or no manifest is refused with a SmoothcertError, and
    so is one that :func:`read_records` would refuse: a resumed run never keeps or appends to
    such a file, and leaves it untouched. A resumed file's row whose image (:mod:`.artifacts`)
    is missing or not the one it names is dropped (the file rewritten atomically, a warning
    logged) and its example left to redo: a row is a function of (seed, idx), so the redone
    row is the one dropped, now at the end of the file, and its image is whole again.
    """
    path = Path(path)
    _make_parent(path)
    _check_writable(path)
    manifest = {**manifest, "columns": list(columns), VERSION_KEY: MANIFEST_VERSION}
    # One writer per record file: a second run on the same --out (a double launch, two shards
    # given one index) is refused instead of interleaving rows or cutting the other's torn line.
    lock = FileLock(path.with_name(path.name + ".lock"), f"{path} is being written by another "
                    "process; wait for it or choose another --out")
    try:
        if path.exists():
            done = _resume(path, columns, manifest)
        else:
            write_json_atomic(manifest_path(path), manifest)
            write_text_atomic(path, format_row(columns))
            done = set()
        return RecordWriter(path, columns, lock), done
    except BaseException:
        lock.release()
        raise


def _resume(path: Path, columns: Sequence[str], manifest: dict) -> set[int]:
    old = read_manifest(path)
    if old is None:
        raise SmoothcertError(f"{path} exists but has no manifest; choose another --out")
    _check_same_run(path, old, manifest, "use another --out or the original settings")
    try:  # what read_records accepts, checked before anything is changed
        records = _load(path)
    except SmoothcertError as e:
        raise SmoothcertError(f"{e}; so it cannot be resumed: correct that line, or move "
                              f"{path.name} and {manifest_path(path).name} away to start "
                              "again (or choose another --out)") from None
    if records.columns_order != tuple(columns):
        raise SmoothcertError(f"{path} has columns {list(records.columns_order)}; cannot resume")
    stale = stale_artifacts(records)  # a row stands for its images: without them, redo it
    if stale:
        log.warning("%s: the images of %d examples are missing or not their rows' (first: "
                    "%s); redoing those examples", path, len(stale), next(iter(stale.values())))
    # a torn last line (its process died while writing it) and the rows to redo are dropped
    trim_tsv(path, (lambda header, row: int(row[header.index("idx")]) not in stale)
             if stale else None)
    return set(int(i) for i in records["idx"]) - set(stale)


def _check_same_run(path, old: dict, new: dict, fix: str) -> None:
    """Refuse ``path`` when manifests ``old`` and ``new`` are of different runs: one line naming
    the identity fields that differ (then ``columns``, if they do), and ``fix``."""
    a, b = old.get("identity") or {}, new.get("identity") or {}
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    keys += ["columns"] if old.get("columns") != new.get("columns") else []
    if keys:
        raise SmoothcertError(f"{path} was made with a different configuration (differs in: "
                              f"{', '.join(keys)}); {fix}")


def _make_parent(path: Path) -> None:
    """A record file's folder is created as ``train`` creates its run folder; a path through
    an existing file is one clear error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as err:
        raise SmoothcertError(f"cannot create the folder of {path}: a file is in the way") from err


def _check_writable(path: Path) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if path.exists() and path.is_dir():
        raise SmoothcertError(f"output {path} is a directory; give a file name")
    if not parent.is_dir():
        raise SmoothcertError(f"output directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SmoothcertError(f"output {path} is not writable; choose another --out")


def read_manifest(path) -> dict | None:
    """The manifest beside the record file ``path`` in the current format (a manifest of an
    older version is upgraded in memory, :func:`smoothcert.upgrade.upgrade_manifest`; the file
    is not changed), or None when there is none."""
    mpath = manifest_path(path)
    if not mpath.exists():
        return None
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SmoothcertError(f"manifest {mpath} is unreadable: {e}") from e
    if not isinstance(manifest, dict):
        raise SmoothcertError(f"manifest {mpath} is not a JSON object; the file is damaged")
    return upgrade_manifest(manifest, str(mpath))


# --------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class Records:
    """The rows of one record file as columns (numpy arrays), plus its manifest if any.

    Works for smoothcert's files and for Cohen et al.'s original ``certify.py``/``predict.py``
    output. Only complete lines are read (a torn last line is ignored; ``torn_line`` says so).
    """

    path: str
    columns_order: tuple
    data: dict = field(repr=False)
    manifest: dict | None = field(default=None, repr=False)
    label: str | None = None  # a display name; defaults to the file's stem
    torn_line: bool = False  # a torn last line (from a killed run) was left out

    def __len__(self) -> int:
        return len(self.data["idx"]) if "idx" in self.data else 0

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.data:
            raise SmoothcertError(f"{self.path} has no column {name!r}")
        return self.data[name]

    def __contains__(self, name: str) -> bool:
        return name in self.data

    @property
    def name(self) -> str:
        return self.label if self.label is not None else Path(self.path).stem

    def rows(self) -> list[dict]:
        return [{c: self.data[c][i] for c in self.columns_order} for i in range(len(self))]


def read_records(path) -> Records:
    """Read and validate a record file (ours or Cohen et al.'s).

    Every known field is checked against the schema (:mod:`smoothcert.runs.schema`): its type
    and range, the rules between the fields of a row, idx unique; with a manifest, the header is
    its columns, every idx lies inside the dataset and in this shard's index list, every label
    and prediction is a class of the run's model, and ``seed``, ``alpha`` and (unless the
    certifier varies it) ``sigma`` are the identity's. The file is streamed: the first line
    that breaks a rule is one SmoothcertError naming the file, the line and the field, raised
    before much of the rest is read. A torn last line (no newline: a killed run was
    writing it) is the one defect tolerated: it is left out, ``torn_line`` says so, and a
    warning is logged (one line on stderr when logging is not configured, as in the CLI).
    """
    records = _load(Path(path))
    if records.torn_line:
        log.warning("%s: ignored its torn last line (no newline at the end: a run was killed "
                    "while writing it); resume that run to redo the example", path)
    return records


def _load(path: Path) -> Records:
    """:func:`read_records` without the warning. The file is streamed in blocks of whole lines
    (:mod:`.table_blocks`), each checked before the next is read: a file that is not a record
    file fails on its first line, one that turns bad fails in the block of its first bad line."""
    with open_table(path) as f:
        header = upgrade_header(first_line(path, f))  # old names, as the manifest was upgraded
        manifest = read_manifest(path)
        check_header(path, header, manifest)
        rules = row_rules(header, manifest, _index_contract(path, manifest))
        parts, line, torn = [], 2, False
        for block, torn_at_end in line_blocks(path, f):
            torn = torn_at_end
            if block:
                cells, count = split_block(path, header, block, line)
                data = parse_columns(path, header, cells, line, _joined(header, parts),
                                     ((manifest or {}).get("identity") or {}).get("certifier"))
                check_rows(path, data, rules, line)
                parts.append((data, [cells[j] for j in rules.unknown]))
                line += count
    return Records(str(path), header, _columns(header, parts, rules.unknown), manifest,
                   torn_line=torn)


def _joined(header: tuple, parts: list) -> dict:
    """The parsed known columns of the chunks read so far, as one array each."""
    if not parts:
        return {}
    return {name: np.concatenate([data[name] for data, _ in parts]) for name in header}


def _columns(header: tuple, parts: list, unknown: tuple) -> dict:
    """The file's columns: the known ones joined, those the schema does not know parsed once
    from all their text (so a column of numbers and text is text throughout)."""
    if not parts:  # a header and no row: empty columns of the schema's types
        return parse_columns("", header, [()] * len(header))
    data = _joined(header, parts)
    for k, j in enumerate(unknown):
        data[header[j]] = parse_unknown([cell for _, text in parts for cell in text[k]])
    return data
def _index_contract(path: Path, manifest: dict | None) -> tuple[int, np.ndarray, str] | None:
    """From the manifest: the dataset size, this shard's indices and the shard's name (None
    without a manifest or an index list in it)."""
    if manifest is None or "indices" not in manifest:
        return None
    try:
        spec, shard = manifest["indices"], manifest.get("shard") or {"index": 0, "count": 1}
        size, k, count = int(spec["dataset_size"]), int(shard["index"]), int(shard["count"])
        if spec.get("explicit"):
            indices = np.asarray(spec["explicit"], dtype=np.int64)
        else:
            indices = np.asarray(global_indices(size, spec["skip"], spec["max_count"]))
    except (KeyError, TypeError, ValueError) as e:
        raise SmoothcertError(f"manifest {manifest_path(path)} has no valid index list "
                              f"(indices, shard): {e!r}") from e
    name = f"shard {k} of {count}" if count > 1 else "the index list"
    return size, indices[k::count], name


def distinct_labels(paths: Sequence, strip_suffix: bool = True) -> list[str]:
    """Short display names: each file's stem, with as many parent folders as needed to tell
    files apart (``a/certify.tsv``, ``b/certify.tsv`` → ``a/certify``, ``b/certify``). A path
    given twice gets the same name twice."""
    unique = list(dict.fromkeys(str(p) for p in paths))
    parts = [(Path(p).with_suffix("") if strip_suffix else Path(p)).parts for p in unique]
    names = unique
    for depth in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            names = labels
            break
    return [dict(zip(unique, names))[str(p)] for p in paths]


# --------------------------------------------------------------------------- merging shards
def merge_records(paths: Iterable, out) -> Path:
    """Validate the shard files of one run and write their union, sorted by idx, to ``out``.

    Refuses (SmoothcertError) unless every file has a manifest with the same identity and
    columns, the shards are exactly 0..K−1 of the same K, no index appears twice, the union
    is exactly the run's global index list (no gaps, e.g. from an unfinished shard), and each
    row's images (:mod:`.artifacts`) are the ones it names. Each row is copied as its shard
    wrote it (every cell's text, an integer column's integers included), so the merged file is
    row for row the file of one unsharded run. The merged file, its manifest and its image
    folders are written all or none (:func:`~smoothcert.io.replacing_together`): a refusal or
    a failed write (a full disk) leaves what ``out`` held before, or nothing.
    """
    parts = [read_records(p) for p in paths]
    if not parts:
        raise SmoothcertError("merge needs at least one record file")
    manifests = [_merge_manifest(p) for p in parts]
    _check_shards(parts, manifests)
    _check_coverage(parts, manifests[0], np.concatenate([p["idx"] for p in parts]).tolist())
    out = Path(out)
    _check_writable(out)
    columns = parts[0].columns_order
    text = format_row(columns) + _merged_lines(parts)
    merged = {
        **manifests[0],
        "shard": {"index": 0, "count": 1},
        "merged_from": [str(p.path) for p in parts],
    }
    staged = stage_artifacts(parts, out, columns)  # images first: a merged row names its image
    try:
        with replacing_together([*staged, out, manifest_path(out)]):
            for target, folder in staged.items():
                os.replace(folder, target)
            write_text_atomic(out, text)
            write_json_atomic(manifest_path(out), merged)
    finally:
        for folder in staged.values():
            remove_path(folder)  # those not yet in place
    return out


def _merged_lines(parts: list[Records]) -> str:
    """The shards' row lines as their runs wrote them, sorted by idx (the text, not the values
    as read: a cell read as a float is written back as one, ``0`` as ``0.0``)."""
    lines, idx = [], []
    for part in parts:
        text = Path(part.path).read_text(encoding="utf-8")
        rows = text.split("\n")[1:-1]  # not the header, nor what follows the last newline
        if len(rows) != len(part):
            raise SmoothcertError(f"{part.path} changed while it was merged; merge again")
        lines += rows
        idx.append(part["idx"])
    order = np.argsort(np.concatenate(idx), kind="stable")
    return "".join(lines[i] + "\n" for i in order)


def _merge_manifest(part: Records) -> dict:
    if part.manifest is None or "identity" not in part.manifest:
        raise SmoothcertError(f"{part.path} has no smoothcert manifest; cannot validate the merge")
    return part.manifest


def _check_shards(parts: list[Records], manifests: list[dict]) -> None:
    first = manifests[0]
    for part, m in zip(parts, manifests, strict=False):
        _check_same_run(part.path, first, m, f"merge the shards of one run (not of "
                                              f"{parts[0].path}'s)")
    counts = {m["shard"]["count"] for m in manifests}
    shard_ids = sorted(m["shard"]["index"] for m in manifests)
    if len(counts) != 1 or shard_ids != list(range(counts.pop())):
        raise SmoothcertError(f"the files are shards {shard_ids}; expected each of 0..K-1 once")
    for part, m in zip(parts, manifests, strict=False):
        if m.get("indices") != first.get("indices"):  # one shard grown with a larger --max
            raise SmoothcertError(
                f"{part.path} covers other indices ({_describe(m)}) than {parts[0].path} "
                f"({_describe(first)}); run every shard with the same --skip and --max")


def _describe(manifest: dict) -> str:
    spec = manifest.get("indices") or {}
    if "explicit" in spec:
        return f"{len(spec['explicit'])} listed indices"
    return f"--skip {spec.get('skip')} --max {spec.get('max_count') or 'all'}"


def _check_coverage(parts: list[Records], manifest: dict, idx: list[int]) -> None:
    values, counts = np.unique(np.asarray(idx, dtype=np.int64), return_counts=True)
    if (counts > 1).any():
        dup = values[counts > 1][:5].tolist()
        raise SmoothcertError(f"duplicate indices across the files: {dup}")
    spec = manifest["indices"]
    expected = spec.get("explicit") or global_indices(
        spec["dataset_size"], spec["skip"], spec["max_count"])
    missing, extra = sorted(set(expected) - set(idx)), sorted(set(idx) - set(expected))
    if extra:
        raise SmoothcertError(f"{len(extra)} indices are not in the run (first: {extra[:5]})")
    if missing:
        raise SmoothcertError(
            f"the shards are incomplete: {len(missing)} indices missing (first: {missing[:5]}); "
            "rerun the unfinished shards to resume them"
        )
