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
it (``runner_up``: an integer >= 0, the runner-up's vote count in PREDICT files, its class in
L-bound files).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence

import numpy as np

from ..certifiers.certifier import CERTIFIERS
from ..certifiers.columns import CERTIFY_RELATIONS, CERTIFY_RULES, Column, Relation, distance
from ..errors import SmoothcertError

RUN_COLUMNS: dict[str, Column] = {
    # the runner's own, in every record file
    "idx": Column("int", "an idx is an integer >= 0", low=0),
    "label": Column("int", "a label is a class, an integer >= 0", low=0),
    "time": Column("time", "time is a finite number of seconds >= 0, or H:MM:SS", low=0.0),
    "seed": Column("int", "a seed is an integer >= 0", low=0),
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


def known_relations() -> list[Relation]:
    """CERTIFY's rules between the columns of a row, then every program's own (``relations``)."""
    relations = list(CERTIFY_RELATIONS)
    for program in CERTIFIERS.values():
        relations += [rel for rel in program.relations if rel not in relations]
    return relations


# --------------------------------------------------------------------------- parsing and checks
def parse_columns(path, header: Sequence[str], cells: Sequence[Sequence[str]],
                  first_line: int = 2) -> dict:
    """The columns of a record file's rows, each parsed to its type, after every check.

    ``cells`` holds one sequence of str per column of ``header`` (the rows' fields, the first
    row on line ``first_line``). Raises one SmoothcertError for the first line that breaks the
    schema: a field's type or range, a rule between fields, or an idx seen before.
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
    problems += _relation_problems(data, ~bad_rows)
    problems += _duplicate_problems(data, cells, header, ~bad_rows, first_line)
    if problems:
        i, text = min(problems, key=lambda p: p[0])
        raise SmoothcertError(f"{path} line {first_line + i}: {text}")
    return data


def _parse(column: Column | None, text: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """A column's values and the mask of those that break its rule (none for unknown columns:
    ``column`` None)."""
    if column is None:
        return _parse_unknown(text), np.zeros(len(text), dtype=bool)
    if column.kind == "text":
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


def _parse_unknown(text: Sequence[str]) -> np.ndarray:
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


def _relation_problems(data: dict, ok: np.ndarray) -> list:
    """(row, text) of the first row that breaks each relation, among rows whose fields are ok."""
    problems = []
    for rel in known_relations():
        if all(c in data for c in rel.columns):
            arrays = [data[c] for c in rel.columns]
            broken = rel.broken(*arrays) & ok
            if broken.any():
                i = int(np.argmax(broken))
                problems.append((i, rel.says(*(a[i].item() for a in arrays))))
    return problems


def _duplicate_problems(data: dict, cells: Sequence[Sequence[str]], header: Sequence[str],
                        ok: np.ndarray, first_line: int) -> list:
    """(row, text) for the first row whose idx an earlier row already has (rows whose fields
    are ok)."""
    idx = data.get("idx")
    if idx is None or idx.dtype.kind != "i":
        return []
    rows = np.flatnonzero(ok)
    order = rows[np.argsort(idx[rows], kind="stable")]  # equal idx keep their file order
    repeats = order[1:][idx[order[1:]] == idx[order[:-1]]]
    if len(repeats) == 0:
        return []
    i = int(repeats.min())
    first = int(rows[np.flatnonzero(idx[rows] == idx[i])[0]])
    differ = [name for name, text in zip(header, cells) if text[first] != text[i]]
    how = f"rows that differ in {', '.join(differ)}" if differ else "the same row twice"
    return [(i, f"idx {idx[i]} repeats line {first_line + first} ({how}); an example has "
                "one row")]
