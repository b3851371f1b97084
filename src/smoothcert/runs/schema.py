"""The schema of record files: every known column's type and range, and the rules between columns.

A record file is read as text cells (:func:`parse_columns`); each known column is parsed to its
type and checked against its range in one numpy pass, then the rules that tie columns of a row
together (``correct`` is ``predict == label``, an abstention has radius 0, ``nA <= n`` ...) and
the uniqueness of ``idx``. The first line that breaks any of them is one :class:`SmoothcertError`
naming the file, the line and the field, e.g. ``r.tsv line 7: radius is -0.2; a radius is a
finite number >= 0``. Columns the schema does not know are read as integers, floats or text,
unchecked.

The columns are the runner's (``idx label time seed``), Cohen et al.'s and CERTIFY's
(:data:`smoothcert.certifiers.columns.CERTIFY_RULES`; ``time`` in seconds or as
``H:MM:SS.s``), those each registered certifier (the attack too) declares for itself
(``column_rules`` and ``relations`` of its class: ``certifiers/*.py``), and
those ``analyze grad-norms --out`` writes. A column name means one thing in every file that has
it (``nA``, ``nB``: vote counts; ``runner_up``: a class, checked against the run's classes as
``label`` is).

A file with a manifest is held to what the manifest fixes about each row (:func:`row_rules`,
:func:`check_rows`): its header is the manifest's columns, every idx lies in the dataset and in
the shard's index list, every label and prediction is a class of the run's model, and the
fields the identity fixes (:data:`IDENTITY_COLUMNS`) hold the identity's values. Files are
checked a block of rows at a time as they are read (``parse_columns``' ``earlier``).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..certifiers.certifier import CERTIFIERS
from ..certifiers.columns import (
    CERTIFY_RELATIONS,
    CERTIFY_RULES,
    Column,
    Relation,
    a_class,
    distance,
    prediction,
    primary_radius,
    radius_column,
)
from ..data.registry import DATASETS
from ..errors import SmoothcertError
from ..noise.base import NOISES

RUN_COLUMNS: dict[str, Column] = {
    # the runner's own, in every record file
    "idx": Column("int", "an idx is an integer >= 0", low=0),
    "label": Column("int", "a label is a class, an integer >= 0", low=0),
    "time": Column("time", "time is a finite number of seconds >= 0, or H:MM:SS", low=0.0),
    "seed": Column("int", "a seed is an integer >= 0", low=0),
    # an ensemble's: its members' forward passes for the example (runner.record_columns)
    "member_passes": Column("int", "member_passes is an integer >= 0", low=0),
}

OTHER_COLUMNS: dict[str, Column] = {
    # grad-norm files (evaluation/analysis.py: ``analyze grad-norms --out``), not a program's
    "p_hat": Column("float", "p_hat is a probability in [0, 1]", low=0.0, high=1.0),
    "grad_norm": distance("grad_norm"),
}


def known_columns() -> dict[str, Column]:
    """Every column with a rule: the runner's, CERTIFY's (Cohen et al.'s files have no manifest
    to name their program), each registered certifier's own
    (``column_rules``), and the grad-norm files'. Collected when asked, so a plug-in registered
    after import counts. Two plug-ins that declare one name must declare the same rule."""
    columns = {**RUN_COLUMNS, **CERTIFY_RULES, **OTHER_COLUMNS}
    for program in CERTIFIERS.values():
        for name, column in program.column_rules.items():
            if columns.setdefault(name, column) != column:
                raise TypeError(f"{program.__name__} declares column {name!r} with another "
                                f"rule than {columns[name].rule!r}")
    return columns


def known_relations(certifier: str | None = None) -> list[Relation]:
    """CERTIFY's rules between the columns of a row, then the program's own (``relations``) for
    a file of registered ``certifier``, else every program's: a program's rules hold in its
    own files (``nA + nB <= n`` holds for argmax votes, not for the ablation certifier's
    threshold votes, where a position may vote for both classes)."""
    relations = list(CERTIFY_RELATIONS)
    programs = [CERTIFIERS[certifier]] if certifier in CERTIFIERS else CERTIFIERS.values()
    for program in programs:
        relations += [rel for rel in program.relations if rel not in relations]
    return relations


# --------------------------------------------------------------------------- parsing and checks
def parse_columns(path, header: Sequence[str], cells: Sequence[Sequence[str]],
                  first_line: int = 2, earlier: dict | None = None,
                  certifier: str | None = None) -> dict:
    """The columns of a record file's rows, each parsed to its type, after every check.

    ``cells`` holds one sequence of str per column of ``header`` (the rows' fields, the first
    row on line ``first_line``). Raises one SmoothcertError for the first line that breaks the
    schema: a field's type or range, a rule between fields, or an idx seen before. A file read
    in chunks passes ``earlier``: the parsed columns of the rows before these (lines 2 to
    ``first_line`` − 1, already checked), so that an idx of theirs repeated here is found too.
    ``certifier``: the manifest's, whose rules between columns apply (:func:`known_relations`).
    """
    data, problems, columns = {}, [], known_columns()
    bad_rows = np.zeros(len(cells[0]) if cells else 0, dtype=bool)
    for name, text in zip(header, cells, strict=True):
        values, bad = _parse(columns.get(name), text)
        data[name] = values
        bad_rows |= bad
        if bad.any():
            i = int(np.argmax(bad))
            problems.append((i, f"{name} is {_shown(text[i])}; {columns[name].rule}"))
    problems += _relation_problems(data, ~bad_rows, certifier)
    problems += _duplicate_problems(data, ~bad_rows, first_line, earlier or {})
    if problems:
        i, text = min(problems, key=lambda p: p[0])
        raise SmoothcertError(f"{path} line {first_line + i}: {text}")
    return data


def _parse(column: Column | None, text: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """A column's values and the mask of those that break its rule (none for unknown columns:
    ``column`` None)."""
    if column is None:
        return parse_unknown(text), np.zeros(len(text), dtype=bool)
    if column.kind in ("text", "vector", "sha256"):  # a vector stays text: parse_vector
        values = np.array(text, dtype=object)
        return values, column.outside(values)
    values, unreadable = (_parse_times(text) if column.kind == "time"
                          else _parse_numbers(text, column.kind))
    return values, unreadable | column.outside(values)


def _parse_numbers(text: Sequence[str], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """``text`` as int64 or float64, and the mask of cells that are not such a number (0 there).

    One numpy conversion; only a column that fails it is read cell by cell, to find the culprits.
    """
    dtype = np.int64 if kind == "int" else np.float64
    try:
        return np.array(text, dtype=dtype), np.zeros(len(text), dtype=bool)
    except (ValueError, OverflowError):
        pass
    values = np.zeros(len(text), dtype=dtype)
    unreadable = np.zeros(len(text), dtype=bool)
    for i, cell in enumerate(text):
        try:
            values[i] = dtype(cell)
        except (ValueError, OverflowError):
            unreadable[i] = True
    return values, unreadable


def _parse_times(text: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Seconds from ``12.5`` or ``H:MM:SS[.ffffff]`` (Cohen et al.'s str(timedelta)), as float64,
    and the mask of unreadable cells."""
    try:
        return np.array(text, dtype=np.float64), np.zeros(len(text), dtype=bool)
    except ValueError:
        text = np.array(text, dtype=str)
    clock = np.char.find(text, ":") >= 0
    values, unreadable = _parse_numbers(np.where(clock, "0", text), "float")
    if not clock.any():
        return values, unreadable
    rest, _, seconds = np.char.rpartition(text[clock], ":").T
    hours, _, minutes = np.char.rpartition(rest, ":").T
    sec, bad_s = _parse_numbers(seconds, "float")
    mins, bad_m = _parse_numbers(minutes, "float")
    days = np.char.find(hours, "day") >= 0  # "1 day, 2:03:04": rare enough to read one by one
    hrs, bad_h = _parse_numbers(np.where(days, "0", hours), "float")
    hrs[days] = [_days_in_hours(h) for h in hours[days].tolist()]
    values[clock] = hrs * 3600.0 + mins * 60.0 + sec
    unreadable[clock] = bad_s | bad_m | bad_h | np.isnan(hrs) | (np.char.str_len(rest) == 0)
    return values, unreadable


def _days_in_hours(text: str) -> float:
    """``"2 days, 3"`` (what precedes a timedelta's minutes) → 51.0 hours; NaN if unreadable."""
    try:
        d, h = text.split(",")
        return datetime.timedelta(days=int(d.split()[0]), hours=int(h)).total_seconds() / 3600
    except ValueError:
        return math.nan


def parse_unknown(text: Sequence[str]) -> np.ndarray:
    """An unchecked column: integers, else floats (an empty cell is NaN), else text."""
    values, unreadable = _parse_numbers(text, "int")
    if not unreadable.any():
        return values
    values, unreadable = _parse_numbers([cell or "nan" for cell in text], "float")
    return values if not unreadable.any() else np.array(text, dtype=object)


def _shown(cell: str) -> str:
    """A cell as a message quotes it: a number as written, anything else in quotes."""
    cell = str(cell)
    if cell == "":
        return "empty"
    try:
        float(cell)
        return cell
    except ValueError:
        return repr(cell)


def _relation_problems(data: dict, ok: np.ndarray, certifier: str | None = None) -> list:
    """(row, text) of the first row that breaks each relation, among rows whose fields are ok."""
    problems = []
    for rel in known_relations(certifier):
        if all(c in data for c in rel.columns):
            arrays = [data[c] for c in rel.columns]
            broken = rel.broken(*arrays) & ok
            if broken.any():
                i = int(np.argmax(broken))
                problems.append((i, rel.says(*(a[i].item() for a in arrays))))
    return problems


def _duplicate_problems(data: dict, ok: np.ndarray, first_line: int, earlier: dict) -> list:
    """(row, text) for the first row whose idx an earlier row already has (rows whose fields
    are ok; ``earlier``: the checked rows before them, from line 2)."""
    idx, before = data.get("idx"), earlier.get("idx", np.empty(0, dtype=np.int64))
    if idx is None or idx.dtype.kind != "i":
        return []
    rows = np.flatnonzero(ok)
    both = np.concatenate([before, idx[rows]])  # in file order: lines 2.. then this chunk's
    order = np.argsort(both, kind="stable")  # equal idx keep their file order
    repeats = order[1:][both[order[1:]] == both[order[:-1]]]
    if len(repeats) == 0:
        return []
    j = int(repeats.min())
    k = int(np.flatnonzero(both == both[j])[0])
    n = len(before)  # position m of ``both`` is line 2 + m before this chunk, else row m - n

    def line(m: int) -> int:
        return 2 + m if m < n else first_line + int(rows[m - n])

    def value(name: str, m: int):
        return earlier[name][m] if m < n else data[name][rows[m - n]]

    differ = [name for name in data if not _same(value(name, k), value(name, j))]
    how = f"rows that differ in {', '.join(differ)}" if differ else "the same row twice"
    return [(line(j) - first_line, f"idx {both[j]} repeats line {line(k)} ({how}); an example "
                                   "has one row")]


def _same(a, b) -> bool:
    """Two parsed fields are equal (two NaNs too: an unknown column may hold them)."""
    return bool(a == b) or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


# --------------------------------------------------------------------------- the manifest's rules
IDENTITY_COLUMNS = ("seed", "alpha", "sigma")
"""Columns that repeat the run identity's field of the same name in every row (``sigma`` unless
the certifier smooths each input at its own σ_x: ``varies_sigma``). ``n`` and ``n0`` are not
among them: the sequential certifier's ``n`` counts the draws it used, the L-bound's ``n0`` is 0
when it selects the class on the clean input."""


@dataclass(frozen=True)
class RowRules:
    """What a manifest fixes about each row of its file (None or empty: nothing)."""

    unknown: tuple  # positions of the columns the schema does not know
    size: int | None = None  # examples in the dataset
    shard: np.ndarray | None = None  # this shard's indices, sorted
    shard_name: str = ""
    fixed: dict = field(default_factory=dict)  # column -> the identity's value
    num_classes: int | None = None
    relations: tuple = ()  # rules between columns that the manifest's run fixes


def row_rules(header: Sequence[str], manifest: dict | None, contract: tuple | None) -> RowRules:
    """What ``manifest`` fixes about the rows of a file with ``header``; ``contract`` is its
    (dataset size, this shard's indices, the shard's name), or None."""
    unknown = tuple(j for j, name in enumerate(header) if name not in known_columns())
    if manifest is None:
        return RowRules(unknown)
    identity = manifest.get("identity") or {}
    size, shard, name = contract or (None, None, None)
    fixed = {c: identity[c] for c in _identity_columns(identity) if c in identity}
    return RowRules(unknown, size, None if shard is None else np.sort(shard), name or "",
                     {c: v for c, v in fixed.items() if c in header}, _num_classes(manifest),
                     _noise_relations(header, identity))


def _noise_relations(header: Sequence[str], identity: dict) -> tuple:
    """The rule that ``radius`` is the radius in the norm of the identity's noise
    (:func:`~smoothcert.certifiers.columns.primary_radius`), for a file with both columns and
    a registered noise; none otherwise."""
    noise = NOISES.get(identity.get("noise"))
    if noise is None or "radius" not in header or radius_column(noise.norm) not in header:
        return ()
    return (primary_radius(noise.norm),)


def _identity_columns(identity: dict) -> tuple:
    """:data:`IDENTITY_COLUMNS` for the identity's certifier (σ unchecked for one that varies
    it, or one no longer registered, whose capability is unknown)."""
    name = identity.get("certifier")
    if name is not None and getattr(CERTIFIERS.get(name), "varies_sigma", True):
        return tuple(c for c in IDENTITY_COLUMNS if c != "sigma")
    return IDENTITY_COLUMNS


def _num_classes(manifest: dict) -> int | None:
    """The classes of the run's model: the manifest's ``num_classes``, else its registered
    dataset's (None where neither says, e.g. an image folder)."""
    count = manifest.get("num_classes")
    if count is None:
        spec = DATASETS.get((manifest.get("identity") or {}).get("dataset"))
        count = getattr(spec, "num_classes", None) or None
    return int(count) if isinstance(count, (int, float)) and count >= 2 else None


def check_rows(path, data: dict, rules: RowRules, first_line: int) -> None:
    """The rows (the first on ``first_line``) against their manifest: every idx in its dataset
    and shard, every label and prediction a class of the model, the identity's fixed fields."""
    idx, problems = data["idx"], []
    if rules.size is not None:
        problems += _first(idx >= rules.size, lambda i: f"idx {idx[i]} lies outside the "
                           f"dataset ({rules.size} examples, per the manifest)")
        problems += _first(~np.isin(idx, rules.shard), lambda i: f"idx {idx[i]} is not one of "
                           f"the {len(rules.shard)} indices of {rules.shard_name} of this run "
                           "(per the manifest)")
    for name in _class_columns(data) if rules.num_classes else ():
        problems += _first(data[name] >= rules.num_classes, lambda i, name=name:
                           f"{name} is {data[name][i]}; the run's model has "
                           f"{rules.num_classes} classes (0 to {rules.num_classes - 1})")
    for name, value in rules.fixed.items():
        problems += _first(data[name] != value, lambda i, name=name, value=value:
                           f"{name} is {data[name][i]}; the manifest's run has {name} {value}")
    for rel in rules.relations:
        arrays = [data[c] for c in rel.columns]
        problems += _first(rel.broken(*arrays), lambda i, rel=rel, arrays=arrays:
                           rel.says(*(a[i].item() for a in arrays)))
    if problems:
        i, text = min(problems, key=lambda p: p[0])
        raise SmoothcertError(f"{path} line {first_line + i}: {text}")


def _class_columns(data: dict) -> list[str]:
    """``label`` and the columns the schema reads as classes or predictions (a class or -1)."""
    columns = known_columns()
    return [name for name in data if name == "label"
            or columns.get(name) in (prediction(name), a_class(name))]


def _first(mask: np.ndarray, says) -> list:
    """[(row, text)] for the first row of ``mask``, or []."""
    if not mask.any():
        return []
    i = int(np.argmax(mask))
    return [(i, says(i))]


def check_header(path, header: Sequence[str], manifest: dict | None) -> None:
    """No column twice; the manifest's columns, where it has them."""
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise SmoothcertError(f"{path} line 1: column {repeated[0]} appears twice in the header")
    columns = (manifest or {}).get("columns")
    if columns is not None and list(columns) != list(header):
        raise SmoothcertError(
            f"{path} line 1: the header differs from the columns of its manifest "
            f"({', '.join(map(str, columns))}); the file was edited or its manifest replaced")
