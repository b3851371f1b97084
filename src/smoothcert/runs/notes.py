"""A run's notes are said once it is checked: a refused run is its one line of error, alone.

A note is a logging record of a ``smoothcert`` logger (another σ than the training one, too
few draws for any certificate, the engine settings the CLI chose on CUDA). While a run's
arguments and inputs are being checked, :func:`holding_notes` holds every record logged under
the ``smoothcert`` logger; :func:`release_notes`, called by the runner once every check has
passed, its record file accepted the run and its certifier started (``runner.execute``), says
them in the order they were logged and lets later ones through. A run that raises before the
release drops them: its error is the only line it prints (the CLI turns it into one line and
exit code 2).

Holds nest: the CLI holds from before it picks the engine settings, ``certify_dataset`` holds
again, and the inner hold joins the outer one, so that the one release says both. The hold
swaps the ``smoothcert`` logger's handlers for one that keeps the records and stops their
propagation (the root logger's handlers, the last-resort stderr handler) until the release,
which restores both and hands each record to the ``smoothcert`` logger again. It is process
state: notes logged by another thread during a hold are held with the run's.
"""

from __future__ import annotations

import contextlib
import logging

LOGGER = "smoothcert"


class _Keep(logging.Handler):
    """Keeps the records it is handed, to be said later."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class _Hold:
    """The ``smoothcert`` logger's handlers and propagation, swapped for a :class:`_Keep`."""

    def __init__(self):
        self.logger, self.keep = logging.getLogger(LOGGER), _Keep()
        self.saved = (self.logger.handlers, self.logger.propagate)
        self.logger.handlers, self.logger.propagate = [self.keep], False

    def end(self, say: bool) -> None:
        """Restore the logger; with ``say``, hand it every record kept, in order."""
        self.logger.handlers, self.logger.propagate = self.saved
        records, self.keep.records = self.keep.records, []
        for record in records if say else ():
            self.logger.handle(record)


_hold: _Hold | None = None


@contextlib.contextmanager
def holding_notes():
    """Hold the ``smoothcert`` loggers' records until :func:`release_notes`; a block that
    raises drops those still held, one that ends without a release says them at its end.
    Inside another hold: joins it (the outer block decides)."""
    global _hold
    if _hold is not None:
        yield
        return
    hold = _hold = _Hold()
    failed = True
    try:
        yield
        failed = False
    finally:
        if _hold is hold:  # not released
            _hold = None
            hold.end(say=not failed)


def release_notes() -> None:
    """Say the notes held so far and let later ones through (no hold: nothing to do)."""
    global _hold
    hold, _hold = _hold, None
    if hold is not None:
        hold.end(say=True)


__all__ = ["holding_notes", "release_notes"]
