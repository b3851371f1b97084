"""Record columns as plug-ins declare them: a column's type and range, and rules between columns.

Every certifier (and the runner's other programs, e.g. the attack) declares the rules of the
columns it adds (``Certifier.column_rules``) and the rules that tie them together
(``Certifier.relations``); :mod:`smoothcert.runs.schema` collects them from the registries and
checks every record file against them. :data:`CERTIFY_RULES` are the columns of Cohen et al.'s
files and of CERTIFY, which every file that certifies a radius starts with. A column name means
one thing in every file that has it (two plug-ins that declare one name must declare the same
rule): ``nA`` and ``nB`` are vote counts (of the selected class and of the runner-up), and
``runner_up`` is a class (:data:`RUNNER_UP`), in every file that has them. PREDICT files named
their counts ``count`` and ``runner_up`` until manifest version 5; they read through
:mod:`smoothcert.upgrade`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Column:
    """A known column: its ``kind`` ("int", "float", "time" — seconds or ``H:MM:SS.s`` —,
    "text", "sha256" (64 lowercase hex digits: an artifact's hash, ``runs/artifacts.py``) or
    "vector": numbers joined by "," and rows of them by ";", :func:`format_vector`),
    its allowed values (numbers are finite, in ``low``..``high``, ``low`` excluded when
    ``low_open``; ±inf too in a vector with ``infinite``; text is one of ``choices``), and
    ``rule``, that range as a message says it."""

    kind: str
    rule: str
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    choices: tuple = ()
    infinite: bool = False

    def outside(self, values: np.ndarray) -> np.ndarray:
        """Boolean mask of the parsed ``values`` that break the rule (NaN and ±inf always do,
        but ±inf in a vector column that allows them)."""
        if self.kind == "text":
            return ~np.isin(values, self.choices)
        if self.kind == "vector":
            return np.array([self._bad_vector(cell) for cell in values], dtype=bool)
        if self.kind == "sha256":
            return np.array([not (isinstance(v, str) and re.fullmatch("[0-9a-f]{64}", v))
                             for v in values], dtype=bool)
        v = values.astype(np.float64)
        above_low = v > self.low if self.low_open else v >= self.low
        with np.errstate(invalid="ignore"):
            return ~(np.isfinite(v) & above_low & (v <= self.high))


    def _bad_vector(self, cell: str) -> bool:
        try:
            v = parse_vector(cell).ravel()
        except ValueError:
            return True
        v = v[~np.isinf(v)] if self.infinite else v
        return bool(Column("float", self.rule, self.low, self.high, self.low_open)
                    .outside(v).any())


def format_vector(values) -> str:
    """A vector (D,) as "v1,v2,..." or a matrix (E, D) as "a1,a2;b1,b2" (floats by ``repr``,
    full precision; integers as integers): one record cell."""
    array = np.asarray(values)
    rows = array.reshape(1, -1) if array.ndim <= 1 else array
    text = (lambda v: str(int(v))) if array.dtype.kind in "iub" else (lambda v: repr(float(v)))
    return ";".join(",".join(text(v) for v in row) for row in rows)


def parse_vector(cell) -> np.ndarray:
    """The numbers of a vector cell (:func:`format_vector`): 1-D for one row, else 2-D
    (float64). Raises ValueError for text that is not rows of equal length of numbers. The
    lists :func:`vector_value` makes of a cell (the rows ``certify_dataset`` returns) read as
    the cell itself."""
    values = cell if isinstance(cell, (list, tuple)) else vector_value(cell)
    return np.array(values, dtype=np.float64)


def vector_value(cell: str) -> list:
    """A vector cell (:func:`format_vector`) as Python lists: ``[v1, v2, ...]`` for one row,
    ``[[a1, a2], [b1, b2]]`` for several; ints where the cell writes integers (counts: a
    segmentation's per-class ``tp``, ``fp``, ``fn``), floats otherwise (``inf``, ``-inf``
    included). Raises ValueError for text that is not rows of equal length of numbers."""
    rows = [[_number(v) for v in row.split(",")] for row in str(cell).split(";")]
    if len({len(r) for r in rows}) != 1:
        raise ValueError(f"the rows of {cell!r} differ in length")
    return rows[0] if len(rows) == 1 else rows


def _number(text: str) -> int | float:
    """An integer's text as an int (as :func:`format_vector` writes integers), else a float."""
    return int(text) if re.fullmatch(r"\s*-?\d+\s*", text) else float(text)


@dataclass(frozen=True)
class Relation:
    """A rule between the ``columns`` of one row: ``broken`` maps their arrays to the mask of
    rows that break it, ``says`` one row's values to the message's text."""

    columns: tuple
    broken: Callable[..., np.ndarray]
    says: Callable[..., str]


def sha256(name: str) -> Column:
    """The SHA-256 of a file beside the records (``<artifact>_sha256``)."""
    return Column("sha256", f"{name} is a SHA-256 digest, 64 lowercase hex digits")


def count(name: str) -> Column:
    return Column("int", f"{name} is a count, an integer >= 0", low=0)


def prediction(name: str) -> Column:
    return Column("int", f"{name} is a class (an integer >= 0) or -1 (abstention)", low=-1)


def a_class(name: str) -> Column:
    """A class index; the schema checks it against the run's classes, as it does a label."""
    return Column("int", f"{name} is a class, an integer >= 0", low=0)


def flag(name: str) -> Column:
    return Column("int", f"{name} is 0 or 1", low=0, high=1)


def probability(name: str) -> Column:
    return Column("float", f"{name} is a probability in [0, 1]", low=0.0, high=1.0)


def distance(name: str, article: str = "a") -> Column:
    return Column("float", f"{article} {name} is a finite number >= 0", low=0.0)


def abstention_has_radius_zero(radius: str, predict: str) -> Relation:
    """``radius`` is 0 where ``predict`` is −1."""
    return Relation((radius, predict), lambda r, p: (p == -1) & (r != 0),
                    lambda r, p: f"{radius} is {r} with {predict} -1; an abstention has radius 0")


RADIUS_NORMS = ("l1", "l2", "linf")
"""The norms of the ``radius_*`` columns (those of ``noise.base.NORMS``), in the order of the
header: p ascending."""


def radius_column(norm: str) -> str:
    """The record column of the radius in ``norm`` (one of :data:`RADIUS_NORMS`)."""
    return f"radius_{norm}"


RADIUS_COLUMNS = tuple(radius_column(norm) for norm in RADIUS_NORMS)
"""The certified radius in every norm (Yang et al. 2020): ``radius_l1``, ``radius_l2``,
``radius_linf``, beside ``radius`` (the noise's own norm) in the files of certifiers whose
certificate is a ball of the noise (since Step 16; older files have ``radius`` alone)."""


def primary_radius(norm: str) -> Relation:
    """``radius`` is the radius in the noise's norm ``norm``: the column ``radius_<norm>``
    equals it (bit for bit: the certifiers write the same float). The schema adds this rule
    for the noise its manifest names."""
    column = radius_column(norm)
    return Relation(("radius", column), lambda r, c: r != c,
                    lambda r, c: f"{column} is {c} but radius is {r}; radius is the radius in "
                                 f"the noise's norm ({norm}), so the two are equal")


RUNNER_UP = a_class("runner_up")
"""The runner-up's class (the runner-up and L-bound certifiers); its votes are ``nB``."""

CERTIFY_RULES: dict[str, Column] = {
    # Cohen et al.'s columns, first in every file that certifies a radius
    "predict": prediction("predict"),
    "radius": distance("radius"),
    "correct": flag("correct"),
    # CERTIFY's, and the run's own
    "p_lower": probability("p_lower"),
    "nA": count("nA"),
    "n0": count("n0"),
    "n": count("n"),
    "alpha": Column("float", "alpha is a level in (0, 1)", low=0.0, high=1.0, low_open=True),
    "sigma": Column("float", "sigma is a finite number > 0", low=0.0, low_open=True),
    # the radius in every norm (certifiers whose certificate is a ball of the noise)
    **{column: distance(column) for column in RADIUS_COLUMNS},
}
"""The rules of the CERTIFY columns (``certifier.CERTIFY_COLUMNS`` less the runner's idx, label,
time and seed)."""

CERTIFY_RELATIONS: tuple[Relation, ...] = (
    Relation(("correct", "predict", "label"), lambda c, p, y: c != (p == y),
             lambda c, p, y: f"correct is {c} with predict {p} and label {y}; correct is 1 "
                             "exactly when predict equals label"),
    abstention_has_radius_zero("radius", "predict"),
    *(abstention_has_radius_zero(column, "predict") for column in RADIUS_COLUMNS),
    Relation(("nA", "n"), lambda a, n: a > n,
             lambda a, n: f"nA is {a}, more than n ({n}); nA counts among the n draws"),
)
