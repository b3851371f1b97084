"""How a dataset run shows that it is alive: a progress bar on a terminal, plain lines elsewhere.

Off a terminal (a log file, SLURM's output, ``make demo > log``) a bar is a stream of carriage
returns, so the CLI draws none there; but a run that prints nothing for minutes cannot be told
from a hang. :class:`ProgressLines` prints one plain line every ``interval`` seconds instead,
as training prints one line per epoch: images done of the total, seconds per image and the
time left at that pace.
"""

from __future__ import annotations

import datetime
import sys
import time

from tqdm.auto import tqdm

from ..errors import SmoothcertError

INTERVAL = 30.0
"""Seconds between two progress lines: often enough to tell a run from a hang, rarely enough
that a day-long ImageNet run writes ~3,000 lines."""
MODES = (False, True, "bar", "lines")
"""``progress``: nothing, a bar (True is "bar"), or plain lines."""


class ProgressLines:
    """One line on ``stream`` (stderr) every ``interval`` seconds of ``clock``, when an image
    is done: ``certify r.tsv: 12/100 images, 3.41 s/image, 0:05:00 left``; a line when the
    run starts and one when it ends. The pace counts only the images of this run (a resumed
    run's earlier images took no time here)."""

    def __init__(self, total: int, initial: int, desc: str, interval: float = INTERVAL,
                 clock=time.monotonic, stream=None):
        self.total, self.done, self.desc = total, initial, desc
        self.interval, self.clock = interval, clock
        self.stream = stream if stream is not None else sys.stderr
        self.started = self.last = clock()
        self.initial = initial
        resumed = f" ({initial} done before)" if initial else ""
        self._say(f"{total - initial} images to go{resumed}; a line every {interval:g} s")

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.interval and self.done < self.total:
            self.last = now
            left = self._pace(now) * (self.total - self.done)
            self._say(f"{self.done}/{self.total} images, {self._pace(now):.3g} s/image, "
                      f"{_clock(left)} left")

    def close(self) -> None:
        now = self.clock()
        ran = self.done - self.initial
        if ran:
            self._say(f"{self.done}/{self.total} images, {ran} in {_clock(now - self.started)} "
                      f"({self._pace(now):.3g} s/image)")

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()

    def _pace(self, now: float) -> float:
        return (now - self.started) / max(1, self.done - self.initial)

    def _say(self, line: str) -> None:
        print(f"{self.desc}: {line}", file=self.stream, flush=True)


def _clock(seconds: float) -> str:
    """H:MM:SS, whole seconds."""
    return str(datetime.timedelta(seconds=round(seconds)))


def check_progress(progress):
    """``progress`` if it is one of :data:`MODES` (checked before a run opens its file)."""
    if not isinstance(progress, (bool, str)) or progress not in MODES:
        raise SmoothcertError(f"progress must be True, False, 'bar' or 'lines', got {progress!r}")
    return progress


def progress_meter(progress, total: int, initial: int, desc: str):
    """The run's meter: a tqdm bar (``True``, ``"bar"``), :class:`ProgressLines` (``"lines"``)
    or a disabled bar (``False``); each has ``update()`` and is a context manager."""
    if check_progress(progress) == "lines":
        return ProgressLines(total, initial, desc, INTERVAL)
    return tqdm(total=total, initial=initial, disable=not progress, desc=desc, unit="img",
                dynamic_ncols=True)


__all__ = ["INTERVAL", "MODES", "ProgressLines", "check_progress", "progress_meter"]
