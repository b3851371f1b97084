"""How a dataset run shows that it is alive: a progress bar on a terminal, plain lines elsewhere.

Off a terminal (a log file, SLURM's output, ``make demo > log``) a bar is a stream of carriage
returns, so the CLI draws none there; but a run that prints nothing for minutes cannot be told
from a hang. :class:`ProgressLines` prints one plain line every ``interval`` seconds instead:
images done of the total, seconds per image and the time left at that pace. Training uses it
too, within each epoch (batches instead of images, with the running loss), between the
epochs' own lines.
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
    run starts and one when it ends (unless ``ends`` is false: training's epochs have lines
    of their own). The pace counts only the images of this run (a resumed run's earlier
    images took no time here). ``unit`` names what is counted ("image", "batch");
    :meth:`set_postfix` adds values to the lines (``loss=0.512``), as it does to a tqdm bar."""

    def __init__(self, total: int, initial: int, desc: str, interval: float = INTERVAL,
                 clock=time.monotonic, stream=None, unit: str = "image", ends: bool = True):
        self.total, self.done, self.desc, self.unit, self.ends = total, initial, desc, unit, ends
        self.units = unit + ("es" if unit.endswith(("s", "sh", "ch", "x")) else "s")
        self.interval, self.clock = interval, clock
        self.stream = stream if stream is not None else sys.stderr
        self.started = self.last = clock()
        self.initial, self.postfix = initial, ""
        resumed = f" ({initial} done before)" if initial else ""
        if ends:
            left = total - initial
            units = self.unit if left == 1 else self.units
            self._say(f"{left} {units} to go{resumed}; a line every {interval:g} s")

    def set_postfix(self, **values) -> None:
        """Values shown at the end of the next lines, in the order given."""
        self.postfix = "".join(f", {key}={value}" for key, value in values.items())

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.interval and self.done < self.total:
            self.last = now
            left = self._pace(now) * (self.total - self.done)
            self._say(f"{self.done}/{self.total} {self.units}, {self._pace(now):.3g} "
                      f"s/{self.unit}, {_clock(left)} left{self.postfix}")

    def close(self) -> None:
        now = self.clock()
        ran = self.done - self.initial
        if ran and self.ends:
            self._say(f"{self.done}/{self.total} {self.units}, {ran} in "
                      f"{_clock(now - self.started)} ({self._pace(now):.3g} s/{self.unit})")

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


def progress_meter(progress, total: int, initial: int, desc: str, unit: str = "image",
                   ends: bool = True):
    """The run's meter: a tqdm bar (``True``, ``"bar"``), :class:`ProgressLines` (``"lines"``)
    or a disabled bar (``False``); each has ``update()`` and ``set_postfix()`` and is a context
    manager. ``unit`` names what is counted; without ``ends`` the lines say nothing when the
    meter starts and ends, and the bar is cleared when it ends (an epoch's, whose own line
    follows)."""
    if check_progress(progress) == "lines":
        return ProgressLines(total, initial, desc, INTERVAL, unit=unit, ends=ends)
    return tqdm(total=total, initial=initial, disable=not progress, desc=desc,
                unit="img" if unit == "image" else unit, dynamic_ncols=True, leave=ends)


__all__ = ["INTERVAL", "MODES", "ProgressLines", "check_progress", "progress_meter"]
