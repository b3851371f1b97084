"""How fast the engine runs a model at a few batch sizes, measured where the model is: what a
run uses to pick its batch when none is given, and to say what another precision would cost.

The batch changes no draw. The engine draws each input's noise from the input's own generator
in canonical chunks of ``chunk`` draws whatever the batch (``engine._Scheduler._fill``: every
chunk comes from ``_Stream.next_chunk``, and one larger than the room left in a batch is drawn
whole into the carry buffer, then copied over the next batches), so every draw's noise is the
same at every batch; only the forward pass's float rounding may depend on the batch (a kernel
chosen per shape), as it does on channels-last, and that moves a vote only where an input's
two top logits tie to that rounding. The batch is not part of a run's identity for this
reason. Measuring changes no certificate either: it draws from a generator of its own
(:data:`PROBE_SEED`), never an example's, and runs the model in the caller's mode (the runner
puts it in eval mode first: a BatchNorm in training mode would update its statistics).

A measurement forwards ``batch`` noisy copies of one input through the engine's preparation of
the model (channels-last, autocast; never compiled: one compilation per batch shape would cost
more than the run saves) and ends by reading one number back, which on any device waits for
the work queued before it. A batch the device cannot hold (``torch.OutOfMemoryError``) is
recorded as such, and no larger one is tried.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..errors import SmoothcertError, check_count
from ..model_calls import engine_call
from .engine import BatchedVotes

BATCHES = (512, 1024, 2048, 4096)
"""The batches a run measures when none is given. The GPU suite's fastest batches were 1000 and
2000 of 256 to 4000 for ResNet-110 and ResNet-50 on an H100 (docs/BENCHMARKS.md, "GPU suite");
the powers of two from 1024 hold whole canonical chunks (``engine.CHUNK`` = 1024 draws), so
no chunk is carried over from one batch to the next."""
TIES = 0.03
"""Draws/s within this fraction of the fastest count as the fastest: of those, the smallest
batch is taken (the same speed for less memory; a compiled run's CUDA graphs need their own)."""
REPEATS = 3  # timed forwards per batch (their median), after one untimed warm-up
PROBE_SEED = 0  # the probe's own generator: its draws are no example's


@dataclass(frozen=True)
class Tuning:
    """What a run measures on its model once it is checked, before its first row.

    ``batches``: candidate batch sizes, the fastest taken (:func:`fastest_batch`); empty: the
    run's own batch, measured only where ``compare`` asks. ``compare``: precisions (e.g.
    ``("bf16",)`` beside a float32 run) whose time for the run is noted next to its own.
    ``share``: the most the measurement may cost, as a fraction of the run's draws; a run too
    short for it is not measured (its batch is its own)."""

    batches: tuple[int, ...] = ()
    compare: tuple[str, ...] = ()
    share: float = 0.02

    def __post_init__(self):
        for batch in self.batches:
            check_count("batch", batch)
        if not 0 < self.share <= 1:
            raise SmoothcertError(f"share must lie in (0, 1], got {self.share}")

    def cost(self, batch: int) -> int:
        """The most draws the measurement forwards, the run's batch being ``batch``."""
        largest = max(self.batches, default=batch)
        own = sum(self.batches) or batch
        return (REPEATS + 1) * (own + len(self.compare) * largest)


@dataclass(frozen=True)
class Timing:
    """Seconds per draw at ``batch`` (the median of :data:`REPEATS` forwards, over the batch);
    None where the batch did not fit in the device's memory."""

    batch: int
    seconds_per_draw: float | None


def fastest_batch(timings: Sequence[Timing], ties: float = TIES) -> int | None:
    """The smallest batch whose seconds per draw are within ``ties`` of the fastest's (None:
    no batch fit in memory)."""
    fit = [t for t in timings if t.seconds_per_draw is not None]
    if not fit:
        return None
    best = min(t.seconds_per_draw for t in fit)
    return min(t.batch for t in fit if t.seconds_per_draw <= best * (1 + ties))


def time_batches(engine: BatchedVotes, model, x: torch.Tensor, noise, batches: Sequence[int],
                 clock: Callable[[], float] = time.perf_counter) -> list[Timing]:
    """:func:`time_batch` at each of ``batches`` in increasing order, up to the first that does
    not fit in memory (recorded with None: a larger one would not fit either)."""
    timings = []
    for batch in sorted(batches):
        seconds = time_batch(engine, model, x, noise, batch, clock)
        timings.append(Timing(batch, seconds))
        if seconds is None:
            break
    return timings


def time_batch(engine: BatchedVotes, model, x: torch.Tensor, noise, batch: int,
               clock: Callable[[], float] = time.perf_counter) -> float | None:
    """Seconds per draw of ``model`` (an ``nn.Module``) prepared by ``engine`` on ``batch``
    noisy copies of ``x`` (C, H, W), noise drawn included: the median of :data:`REPEATS`
    timings by ``clock`` after a warm-up; None when the device runs out of memory."""
    generator = torch.Generator(device=x.device).manual_seed(PROBE_SEED)
    prepared, rows = engine.prepare(model), None
    times = []
    try:
        rows = engine._buffer(batch, x)
        for _ in range(REPEATS + 1):
            started = clock()
            _forward(engine, prepared, rows, x, noise, generator)
            times.append(clock() - started)
    except torch.OutOfMemoryError:
        return None
    finally:
        del rows
    return statistics.median(times[1:]) / batch


@torch.inference_mode()
def _forward(engine: BatchedVotes, model, rows: torch.Tensor, x: torch.Tensor, noise,
             generator: torch.Generator) -> None:
    """One engine forward of noisy copies of x in ``rows``, ended by reading a number back."""
    noise.perturb_(rows, x, generator)
    with engine_call(argmax_only=True):
        out = engine.model_outputs(model, rows)
    out.reshape(-1)[:1].float().cpu()  # waits for the queued work on any device


def free_cached(device: torch.device) -> None:
    """Hand back to an accelerator ``device`` the memory the measurement's batches left in
    torch's cache (a compiled run's CUDA graphs allocate from a pool of their own), where
    torch can (``torch.accelerator``, torch 2.8 and later); nothing to do on the CPU."""
    accelerator = getattr(torch, "accelerator", None)
    if device.type != "cpu" and hasattr(accelerator, "empty_cache"):
        accelerator.empty_cache()


__all__ = ["BATCHES", "TIES", "Timing", "Tuning", "fastest_batch", "free_cached", "time_batch",
           "time_batches"]
