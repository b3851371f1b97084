"""runs/notes.py: notes held while a run is checked, said in order by the release, dropped when
the run raises; holds nest; the logger is left as it was."""

import logging

import pytest

from smoothcert.errors import SmoothcertError
from smoothcert.runs.notes import holding_notes, release_notes

log = logging.getLogger("smoothcert.runs.test")


def said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_notes_wait_for_the_release_and_come_in_order(caplog):
    logger = logging.getLogger("smoothcert")
    before = (list(logger.handlers), logger.propagate)
    with caplog.at_level(logging.INFO), holding_notes():
        log.warning("note: one")
        with holding_notes():  # the runner's hold, inside the CLI's: joins it
            log.info("note: two")
        assert said(caplog) == []
        release_notes()
        assert said(caplog) == ["note: one", "note: two"]
        assert (logger.handlers, logger.propagate) == before
        log.warning("note: three")  # after the release: at once
        assert said(caplog)[-1] == "note: three"
    assert said(caplog) == ["note: one", "note: two", "note: three"]
    assert (logger.handlers, logger.propagate) == before


def test_a_run_that_raises_drops_its_notes(caplog):
    with caplog.at_level(logging.INFO), pytest.raises(SmoothcertError), holding_notes():
        log.warning("note: about a run that is refused")
        raise SmoothcertError("refused")
    assert said(caplog) == []
    log.warning("note: later")  # the logger works as before
    assert said(caplog) == ["note: later"]


def test_notes_never_released_are_said_when_the_hold_ends(caplog):
    with caplog.at_level(logging.INFO):
        with holding_notes():
            log.warning("note: kept")
        release_notes()  # no hold: nothing to do
    assert said(caplog) == ["note: kept"]


def test_other_loggers_are_not_held(caplog):
    with caplog.at_level(logging.INFO), holding_notes():
        logging.getLogger("elsewhere").warning("not ours")
        assert said(caplog) == ["not ours"]
