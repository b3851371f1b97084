"""A run's rows: the programs of many inputs driven through the one engine, each row written
as it comes, and handed back as plain Python scalars (for ``runner.execute``).

Rows come in index order, or in the order the programs finish for a certifier whose answers
depend on that order (the data-dependent memory); ``time`` is each example's share of the wall
time. An input outside [0, 1] is warned about once per run (:class:`_UnitRange`).
"""

from __future__ import annotations

import collections
import contextlib
import warnings

import numpy as np

from ..certifiers import Certifier, RunContext
from ..certifiers.columns import RADIUS_COLUMNS, vector_value
from ..rng import example_generator
from ..smoothing.smoothed import InputRangeWarning, outside_unit_range, unit_range_message
from .artifacts import ARTIFACTS, save_artifacts
from .records import Records
from .schema import known_columns

LATER_COLUMNS = ("member_passes", *RADIUS_COLUMNS, "levels_drawn")
"""Columns a program's row holds that a file may lack: ``member_passes`` (one model, or a file
from before it), the radius in every norm (a file from before Step 16, resumed: it goes on
in its own header) and a cascade's ``levels_drawn`` (a file of its first version)."""


def written(writer, bar, rows) -> list[dict]:
    """Each row appended to ``writer`` (without those of :data:`LATER_COLUMNS` the file has
    not) as it comes, its images saved before it (:mod:`.artifacts`), the bar advanced; the
    rows (a run without a file keeps their images in them)."""
    produced = []
    for row in rows:
        for column in LATER_COLUMNS:
            if column not in writer.columns:
                row.pop(column, None)
        images = row.pop(ARTIFACTS, None)
        if images:
            row.update(save_artifacts(getattr(writer, "path", None), row["idx"], images))
        writer.write(row)
        if images and isinstance(writer, NoFile):
            row[ARTIFACTS] = images
        produced.append(row)
        bar.update()
    return produced


def python_row(row: dict) -> dict:
    """``row`` with numpy scalars as the Python scalars they hold (np.int64 → int, np.float64
    → float, np.str_ → str) and each vector column's cell (a segmentation's per-class ``tp``,
    ``fp``, ``fn``, median smoothing's ``lower``, ``upper`` …: "1,2;3,4" in the record file)
    as the lists it writes (:func:`~smoothcert.certifiers.columns.vector_value`: ints for
    counts, a list of rows for a matrix): rows read back from a file and rows just computed
    are then the same values, ready for ``json.dumps``."""
    vectors = vector_columns()
    return {key: vector_value(value) if key in vectors and isinstance(value, str)
            else value.item() if isinstance(value, np.generic) else value
            for key, value in row.items()}


def vector_columns() -> frozenset[str]:
    """The columns whose rule (:func:`~.schema.known_columns`, one rule per name across
    every certifier) is a vector of numbers."""
    return frozenset(name for name, column in known_columns().items() if column.kind == "vector")


def no_records(columns) -> Records:
    """The records of a run without a file: none, in ``columns``."""
    return Records("", tuple(columns), {c: np.array([]) for c in columns})


class NoFile(contextlib.nullcontext):
    """The writer of a run without a record file: rows are only returned."""

    def __init__(self, columns: tuple):
        super().__init__()
        self.columns = columns

    def write(self, row: dict) -> None:
        pass


def run_rows(certifier: Certifier, run: RunContext, stream):
    """Rows in index order (in the order the programs finish for a certifier whose answers
    depend on that order, the data-dependent memory), their draws packed into shared forward
    batches by the engine; ``time`` is each example's share of the wall time
    (``sampling.Finished.seconds``), so the column still adds up to the run's cost."""
    cfg, in_order = run.config, certifier.shardable()
    started: collections.deque = collections.deque()  # idx in the order programs start
    unit_range = _UnitRange()

    labelled = "label" in certifier.columns  # a dense task's rows have no one label

    def example(idx, x, label):
        unit_range.check(idx, x)
        generator = example_generator(cfg.seed, idx, run.device)
        row = yield from certifier.program(run, x, label, idx, generator)
        return {"idx": idx, **({"label": label} if labelled else {}), "seed": cfg.seed, **row}

    def programs():
        for idx, x, label in stream:
            if in_order:
                started.append(idx)
            yield idx, example(idx, x, label)

    finished = {}
    for done in run.smoothed.run(programs(), cfg.batch):
        row = {**done.result, "time": done.seconds}
        row["member_passes"] = done.passes or 0  # kept where the file has the column
        if not in_order:  # order-dependent: the file keeps the certification order
            yield row
            continue
        finished[done.key] = row
        while started and started[0] in finished:  # hold rows until those before them finish
            yield finished.pop(started.popleft())


class _UnitRange:
    """Warns (:class:`~smoothcert.smoothing.smoothed.InputRangeWarning`) at the run's first
    example with values outside [0, 1], naming it; silent after: once per run, not per image.
    A min and a max per example: nothing next to its n forward passes."""

    def __init__(self):
        self.said = False

    def check(self, idx: int, x) -> None:
        span = None if self.said else outside_unit_range(x)
        if span is not None:
            self.said = True
            warnings.warn(f"example {idx}: {unit_range_message(*span)} (said once per run)",
                          InputRangeWarning, stacklevel=2)
