"""The schema of record files: every known column's type and range, and the rules between columns.

A record file is read as text cells (:func:`parse_columns`); each known column is parsed to its
type and checked against its range in one numpy pass, then the rules that tie columns of a row
together (``correct`` is ``predict == label``, an abstention has radius 0, ``nA <= n`` ...) and
the uniqueness of ``idx``. The first line that breaks any of them is one :class:`SmoothcertError`
naming the file, the line and the field, e.g. ``r.tsv line 7: radius is -0.2; a radius is a
finite number >= 0``. Columns the schema does not know are read as integers, floats or text,
unchecked.

The columns are those the certifiers, the attack and ``analyze grad-norms --out`` write
(``certifiers/*.py``, ``runs/attack.py``, ``analysis.py``) and Cohen et al.'s (``idx label
predict radius correct time``; ``time`` in seconds or as ``H:MM:SS.s``). A column name means
one thing in every file that has it, except ``runner_up``: the runner-up's vote count in PREDICT
files, its class in L-bound files; both are integers >= 0.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..certifiers.lbound import CONFIDENCE, HEURISTIC
from ..errors import SmoothcertError
from ..stats.margins import BOUNDS

# why the sequential certifier stopped sampling (stats/sequential_levels.py, ``_stop_reason``)
STOP_REASONS = ("all", "n_max", "unreachable", "futile")


@dataclass(frozen=True)
class Column:
    """A known column: its ``kind`` ("int", "float", "time" — seconds or ``H:MM:SS.s`` — or
    "text"), its allowed values (numbers are finite, in ``low``..``high``, ``low`` excluded when
    ``low_open``; text is one of ``choices``), and ``rule``, that range as a message says it."""

    kind: str
    rule: str
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    choices: tuple = ()

    def outside(self, values: np.ndarray) -> np.ndarray:
        """Boolean mask of the parsed ``values`` that break the rule (NaN and ±inf always do)."""
        if self.kind == "text":
            return ~np.isin(values, self.choices)
        v = values.astype(np.float64)
        above_low = v > self.low if self.low_open else v >= self.low
        with np.errstate(invalid="ignore"):
            return ~(np.isfinite(v) & above_low & (v <= self.high))


def _count(name: str) -> Column:
    return Column("int", f"{name} is a count, an integer >= 0", low=0)


def _prediction(name: str) -> Column:
    return Column("int", f"{name} is a class (an integer >= 0) or -1 (abstention)", low=-1)


def _flag(name: str) -> Column:
    return Column("int", f"{name} is 0 or 1", low=0, high=1)


def _probability(name: str) -> Column:
    return Column("float", f"{name} is a probability in [0, 1]", low=0.0, high=1.0)


def _distance(name: str, article: str = "a") -> Column:
    return Column("float", f"{article} {name} is a finite number >= 0", low=0.0)


COLUMNS: dict[str, Column] = {
    # Cohen et al.'s columns, first in every file that certifies a radius
    "idx": Column("int", "an idx is an integer >= 0", low=0),
    "label": Column("int", "a label is a class, an integer >= 0", low=0),
    "predict": _prediction("predict"),
    "radius": _distance("radius"),
    "correct": _flag("correct"),
    "time": Column("time", "time is a finite number of seconds >= 0, or H:MM:SS", low=0.0),
    # CERTIFY (certifiers/certifier.py), and the run's own
    "p_lower": _probability("p_lower"),
    "nA": _count("nA"),
    "n0": _count("n0"),
    "n": _count("n"),
    "alpha": Column("float", "alpha is a level in (0, 1)", low=0.0, high=1.0, low_open=True),
    "sigma": Column("float", "sigma is a finite number > 0", low=0.0, low_open=True),
    "seed": Column("int", "a seed is an integer >= 0", low=0),
    # PREDICT (certifiers/predict.py); runner_up is the L-bound's runner-up class too
    "count": _count("count"),
    "runner_up": Column("int", "runner_up is an integer >= 0 (a count, or a class)", low=0),
    "pvalue": _probability("pvalue"),
    # sequential (certifiers/sequential.py)
    "n_max": _count("n_max"),
    "p_upper": _probability("p_upper"),
    "stopped": Column("text", f"stopped is one of {', '.join(STOP_REASONS)}",
                      choices=STOP_REASONS),
    # data-dependent σ (certifiers/data_dependent.py)
    "predict_mc": _prediction("predict_mc"),
    "radius_mc": _distance("radius_mc"),
    "adjusted": _flag("adjusted"),
    # the L-bound certifiers (certifiers/lbound.py)
    "p_top": _probability("p_top"),
    "p_runner_up": _probability("p_runner_up"),
    "gap_lower": Column("float", "gap_lower is a finite number <= 1", high=1.0),
    "bound": Column("text", f"bound is one of {', '.join((*BOUNDS, 'model'))}",
                    choices=(*BOUNDS, "model")),
    "guarantee": Column("text", f"guarantee is {CONFIDENCE} or {HEURISTIC}",
                        choices=(CONFIDENCE, HEURISTIC)),
    # the attack (runs/attack.py)
    "predict_clean": _prediction("predict_clean"),
    "predict_adv": _prediction("predict_adv"),
    "success": _flag("success"),
    "distance": _distance("distance"),
    "epsilon": _distance("epsilon", "an"),
    "attempts": _count("attempts"),
    "count_adv": _count("count_adv"),
    "runner_up_adv": _count("runner_up_adv"),
    "pvalue_adv": _probability("pvalue_adv"),
    # grad-norm files (analysis.py: ``analyze grad-norms --out``)
    "p_hat": _probability("p_hat"),
    "grad_norm": _distance("grad_norm"),
}


@dataclass(frozen=True)
class Relation:
    """A rule between the ``columns`` of one row: ``broken`` maps their arrays to the mask of
    rows that break it, ``says`` one row's values to the message's text."""

    columns: tuple
    broken: Callable[..., np.ndarray]
    says: Callable[..., str]


RELATIONS = (
    Relation(("correct", "predict", "label"), lambda c, p, y: c != (p == y),
             lambda c, p, y: f"correct is {c} with predict {p} and label {y}; correct is 1 "
                             "exactly when predict equals label"),
    Relation(("radius", "predict"), lambda r, p: (p == -1) & (r != 0),
             lambda r, p: f"radius is {r} with predict -1; an abstention has radius 0"),
    Relation(("radius_mc", "predict_mc"), lambda r, p: (p == -1) & (r != 0),
             lambda r, p: f"radius_mc is {r} with predict_mc -1; an abstention has radius 0"),
    Relation(("nA", "n"), lambda a, n: a > n,
             lambda a, n: f"nA is {a}, more than n ({n}); nA counts among the n draws"),
    Relation(("count", "runner_up", "n"), lambda a, b, n: a + b > n,
             lambda a, b, n: f"count + runner_up is {a + b}, more than n ({n})"),
    Relation(("count_adv", "runner_up_adv", "n"), lambda a, b, n: a + b > n,
             lambda a, b, n: f"count_adv + runner_up_adv is {a + b}, more than n ({n})"),
    Relation(("n", "n_max"), lambda n, m: n > m,
             lambda n, m: f"n is {n}, more than n_max ({m})"),
    Relation(("p_lower", "p_upper"), lambda lo, hi: lo > hi,
             lambda lo, hi: f"p_lower is {lo}, above p_upper ({hi})"),
    Relation(("success", "predict_adv", "label"), lambda s, p, y: s != (p != y),
             lambda s, p, y: f"success is {s} with predict_adv {p} and label {y}; success is 1 "
                             "exactly when predict_adv is not label"),
)


# --------------------------------------------------------------------------- parsing and checks
def parse_columns(path, header: Sequence[str], cells: Sequence[Sequence[str]],
                  first_line: int = 2) -> dict:
    """The columns of a record file's rows, each parsed to its type, after every check.

    ``cells`` holds one sequence of str per column of ``header`` (the rows' fields, the first
    row on line ``first_line``). Raises one SmoothcertError for the first line that breaks the
    schema: a field's type or range, a rule between fields, or an idx seen before.
    """
    data, problems = {}, []
    bad_rows = np.zeros(len(cells[0]) if cells else 0, dtype=bool)
    for name, text in zip(header, cells, strict=True):
        values, bad = _parse(name, text)
        data[name] = values
        bad_rows |= bad
        if bad.any():
            i = int(np.argmax(bad))
            problems.append((i, f"{name} is {_shown(text[i])}; {COLUMNS[name].rule}"))
    problems += _relation_problems(data, ~bad_rows)
    problems += _duplicate_problems(data, cells, header, ~bad_rows, first_line)
    if problems:
        i, text = min(problems, key=lambda p: p[0])
        raise SmoothcertError(f"{path} line {first_line + i}: {text}")
    return data


def _parse(name: str, text: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """A column's values and the mask of those that break its rule (none for unknown columns)."""
    column = COLUMNS.get(name)
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
    for rel in RELATIONS:
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
