"""A run's batch measured on its own model, and what another precision would cost it
(``certify_dataset(tune=Tuning(...))``): once every check has passed and the record file is
open, before the first row, in the model's eval mode (``runner.execute``).

The batch is not part of a run's identity: it changes no draw (:mod:`smoothcert.smoothing.probe`
says why), so a measured batch resumes and merges with any other. The measurement is uncompiled
(a compiled run takes the batch its eager twin ran fastest at, as the GPU suite's compiled rows
do), and the times it notes are estimates from it: a compiled run takes less, at either
precision.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from ..smoothing.engine import BatchedVotes
from ..smoothing.probe import Timing, Tuning, fastest_batch, free_cached, time_batch, time_batches

log = logging.getLogger(__name__)


def tuned(cfg, smoothed, x, draws: int, tune: Tuning | None, clock=time.perf_counter):
    """``cfg`` (a ``RunConfig``) with the fastest of ``tune.batches`` measured on
    ``smoothed``'s model at ``x`` (C, H, W; the run's first example left), noted in one line
    (none fit in memory: ``cfg``'s own batch); then one line per precision of
    ``tune.compare``: the run's time at it beside its own. Nothing is measured (``cfg`` as it
    is) without ``tune``, for a run of no ``draws`` (n0 + n per example left), or where the
    measurement would cost more than ``tune.share`` of them."""
    if tune is None or not (tune.batches or tune.compare) or \
            tune.cost(cfg.batch) > tune.share * draws:
        return cfg
    x = smoothed.prepare_input(x)
    model = (smoothed.model, x, smoothed.noise)
    try:
        timings = time_batches(_eager(cfg, {}), *model, tune.batches or (cfg.batch,), clock)
        batch = fastest_batch(timings) or cfg.batch
        if tune.batches:
            _note_batch(timings, batch, draws)
        own = _seconds(timings, batch)
        for precision in tune.compare:
            if precision != cfg.engine.get("precision", "fp32") and own is not None:
                other = time_batch(_eager(cfg, {"precision": precision}), *model, batch, clock)
                _note_precision(precision, cfg, other, own, batch, draws)
    finally:
        free_cached(x.device)
    return dataclasses.replace(cfg, batch=batch)


def _eager(cfg, change: dict) -> BatchedVotes:
    """The engine of ``cfg``'s settings, with ``change``, uncompiled."""
    settings = {**cfg.engine, **change, "compile": False, "compile_mode": "default"}
    return BatchedVotes(**settings, chunk=cfg.chunk)


def _seconds(timings: list[Timing], batch: int) -> float | None:
    return next((t.seconds_per_draw for t in timings if t.batch == batch), None)


def _note_batch(timings: list[Timing], batch: int, draws: int) -> None:
    """One line: the batch taken, of those measured, and the run's time at it."""
    seconds = _seconds(timings, batch)
    if seconds is None:  # none fit: the run's own batch, whose forward will say so
        return
    tried = "/".join(str(t.batch) for t in timings)
    full = [str(t.batch) for t in timings if t.seconds_per_draw is None]
    log.warning("note: batch %d, the fastest of %s on this model (%s draws/s uncompiled: ~%s "
                "for this run's %s draws%s); --batch sets one", batch, tried,
                f"{1 / seconds:,.0f}", duration(seconds * draws), f"{draws:,}",
                f"; out of memory at {full[0]}" if full else "")


def _note_precision(precision: str, cfg, other: float | None, own: float, batch: int,
                    draws: int) -> None:
    """One line: the run's time at ``precision`` beside its own, and why it is no default."""
    if other is None:
        return
    mine = cfg.engine.get("precision", "fp32")
    log.warning("note: --precision %s would take ~%s instead of ~%s for this run's %s draws "
                "(both timed uncompiled at batch %d); it certifies the %s classifier, another "
                "function than this %s one, so it is never a default", precision,
                duration(other * draws), duration(own * draws), f"{draws:,}", batch,
                precision, mine)


def duration(seconds: float) -> str:
    """``seconds`` as a person reads a duration: 45 s, 12 min, 3.4 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


__all__ = ["duration", "tuned"]
