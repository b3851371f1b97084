"""The one Monte Carlo engine: class votes of a base classifier under noise, counted on device.

PREDICT, CERTIFY (``smoothing.py``), the sequential certifier and every dataset runner get
their counts from :class:`BatchedVotes`. Work reaches it as *programs*: Python generators that
yield :class:`Draws` requests (an input, its noise, its generator and how many draws) and
receive the vote counts. The engine keeps many programs in flight and packs their draws into
forward batches that are always full (a request that does not fill a batch shares it with the
next inputs' requests), so one decision costs one host synchronisation and no batch runs
half-empty.

Results depend neither on the packing nor on the batch size: each input's noise is drawn from
its own generator in *canonical chunks* — every request segment split into pieces of ``chunk``
draws (:data:`CHUNK` by default), the last one shorter — whatever ``batch_size`` is. Chunks
smaller than the room left in a batch are packed with others; a chunk larger than that room is
drawn whole into a carry buffer and finished in the next batches. Counts are therefore equal,
draw for draw, whether an input is certified alone or among thousands, and for every batch
size (tested). The draws must be cut the same way because a generator's values depend on how
its calls are sized: on the CPU ``normal_`` fills 16 values at a time and treats a call's tail
apart, on CUDA each call advances the Philox offset by an amount rounded to its launch grid.

Optional accelerations, off by default: ``precision`` ("bf16"/"fp16": the model runs under
autocast; noise is always drawn and added in the input's float32), ``channels_last`` and
``compile`` (``torch.compile``, in ``compile_mode``: "reduce-overhead" and "max-autotune"
record CUDA graphs). With reduced precision the certificate is a certificate of the
reduced-precision classifier — the function that actually ran — not of its float32 twin. A
compiled model sees one batch shape: every batch is forwarded whole, its unused rows padding
(:meth:`BatchedVotes.forward` returns the logits of the rows that were drawn), so a CUDA graph
is recorded once, not once per size of a last, partial batch.

The model sees the noisy batch in its own dtype (a half or bf16 model: cast after the noise
is added in float32), and a row whose logits do not vote (NaN, +inf: :func:`voting`) is counted
apart on device, so that an input with any such row is refused when its counts are read, with
no host synchronisation of its own: argmax of NaN would otherwise vote for class 0.

A request may ask for threshold votes instead of argmaxes (``Draws.threshold``: every class
whose softmax score passes θ, Levine & Feizi 2020; ``votes.py``); a batch holds the draws of
one voting rule only, so the model is told truthfully whether only argmaxes are read.

A model may say what each noisy input cost it (:mod:`smoothcert.model_calls`: an ensemble, the
members that ran on it); those base-model forward passes are added up per program, for votes in
the counts table with no synchronisation of their own (``Finished.passes``).

The engine also gives soft scores, the mean softmax over the draws, for certificates of the soft
smoothed classifier (the L-bound, ``lipschitz.py``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from ..errors import SmoothcertError, check_count
from ..model_calls import engine_call, meter, metered
from ..tensors import model_input
from .requests import OUTPUTS, Draws, Finished, Program
from .votes import (
    answer,
    check_outputs,
    count_argmax,
    count_pixels,
    count_threshold,
    gather_values,
    voting,
)

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
"""torch.compile's modes; the last two record CUDA graphs (replayed: one launch per batch)."""
GRAPH_MODES = ("reduce-overhead", "max-autotune")
CHUNK = 1024
"""Draws per canonical chunk. Large enough that drawing costs one call per ~1000 draws (as the
batch of 1000 did before chunks were fixed: no measurable change in throughput), small enough
that the carry buffer (``CHUNK`` noisy inputs: 616 MB of float32 for 3×224×224 ImageNet inputs,
3 MB for 28×28) is small next to a forward batch's activations; ``chunk`` sets it per engine,
but another chunk draws other noise (it is part of a run's identity)."""


class BatchedVotes:
    """Draw noise in place into one preallocated buffer, forward, and count argmaxes on device.

    :meth:`run` drives many programs with batches filled across inputs; :meth:`votes` and
    :meth:`soft_scores` serve one input. Runs under ``inference_mode``; the caller puts the
    model in eval mode (:func:`eval_mode`).
    """

    def __init__(self, *, precision: str = "fp32", channels_last: bool = False,
                 compile: bool = False, compile_mode: str = "default", chunk: int = CHUNK):
        if precision not in PRECISIONS:
            raise SmoothcertError(f"precision must be one of {', '.join(PRECISIONS)}, "
                                  f"got {precision!r}")
        if compile_mode not in COMPILE_MODES:
            raise SmoothcertError(f"compile_mode must be one of {', '.join(COMPILE_MODES)}, "
                                  f"got {compile_mode!r}")
        if compile_mode != "default" and not compile:
            raise SmoothcertError(f"compile_mode {compile_mode} compiles: it needs compile on "
                                  "(--compile)")
        self.precision, self.channels_last, self.compile = precision, channels_last, compile
        self.compile_mode = compile_mode
        self.chunk = check_count("chunk", chunk)  # draws per canonical chunk (module doc)
        self._prepared: dict[int, tuple[nn.Module, nn.Module]] = {}

    def settings(self) -> dict:
        """The settings that may change the computed function (bf16) or its float rounding
        (channels-last, compile): they belong in a run's identity.
        ``chunk``, which changes the draws, is not among them: the runner records it apart."""
        return {"precision": self.precision, "channels_last": self.channels_last,
                "compile": self.compile, "compile_mode": self.compile_mode}

    def run(self, model: nn.Module, programs: Iterable[tuple[object, Program]],
            num_classes: int, batch_size: int) -> Iterator[Finished]:
        """Drive ``(key, program)`` pairs to completion; yields each :class:`Finished` as it ends
        (in completion order, which for equal programs is their input order)."""
        check_count("batch_size", batch_size)
        scheduler = _Scheduler(self, self.prepare(model), num_classes, batch_size)
        yield from scheduler.run(programs)  # programs run in the caller's grad mode

    def votes(self, model, x, noise, num, num_classes, batch_size, generator=None):
        """Counts (num_classes,) int64, on x's device, of argmax f(x + δ_i) over ``num`` draws."""
        def program():
            counts = yield Draws(x, noise, (num,), generator)
            return counts[0]

        (done,) = self.run(model, [(None, program())], num_classes, batch_size)
        return torch.from_numpy(done.result).to(x.device)

    def soft_scores(self, model, x, noise, num, num_classes, batch_size, generator=None):
        """The Monte Carlo estimate (1/num)·Σ_i softmax f(x + δ_i) of the soft smoothed classifier
        G(x) = E[softmax f(x + δ)] (Salman et al. 2019), shape (num_classes,), float64, on device.

        Same noise stream as :meth:`votes`: with equal generator states, the draws are the same,
        cut in the same canonical chunks, for every ``batch_size`` (which changes the estimate
        only through the forward pass's float32 rounding, e.g. ~1e-11 for LeNet on the CPU).
        Each softmax is taken in the logits' dtype and summed in float64, so the estimate does
        not lose precision over 10⁵ draws (float32 softmax: error ~1e-7 per entry, far below the
        Monte Carlo error ≥ ½/√n); entries lie in [0, 1] and sum to 1 up to that rounding.
        """
        check_count("batch_size", batch_size)
        model = self.prepare(model)
        sums = torch.zeros(num_classes, dtype=torch.float64, device=x.device)
        broken = torch.zeros((), dtype=torch.long, device=x.device)  # rows of non-finite logits
        passes, costed = torch.zeros_like(broken), False  # what the model reports (module doc)
        with torch.inference_mode():
            for batch, size in self._noisy_batches(x, noise, num, batch_size, generator):
                with engine_call(argmax_only=False) as call:
                    logits = self.forward(model, batch, size, num_classes)
                if call.row_passes is not None:
                    passes, costed = passes + call.row_passes.sum(), True
                broken += (~voting(logits)).sum()
                wide = torch.promote_types(logits.dtype, torch.float32)  # bf16/fp16 logits
                sums += logits.to(wide).softmax(dim=1).sum(dim=0, dtype=torch.float64)
        self.check_finite(int(broken), num, None)  # one host synchronisation, at the end
        meter(int(passes) if costed else None)
        return sums / num

    def check_finite(self, broken: int, rows: int, key) -> None:
        """Refuse the votes of an input when the model returned logits that do not vote
        (:func:`voting`) for ``broken`` of its ``rows`` noisy inputs: argmax of NaN logits is
        class 0, so a checkpoint with NaN weights would otherwise certify every input as
        class 0."""
        if broken:
            where = "the input" if key is None else f"input {key}"
            advice = ("; with precision fp16 the logits may overflow: try bf16 or fp32"
                      if self.precision == "fp16" else
                      " (NaN weights in the checkpoint, or an overflow in the model)")
            raise SmoothcertError(f"the model returned NaN/inf logits for {broken} of {rows} "
                                  f"noisy copies of {where}{advice}")

    def _noisy_batches(self, x, noise, num, batch_size, generator
                       ) -> Iterator[tuple[torch.Tensor, int]]:
        """(batch, rows drawn) of ≤ ``batch_size`` rows x + δ, the num draws δ in canonical
        chunks cut as :meth:`run` cuts them (a chunk larger than the room left is split over
        batches); a compiled model's last batch is the whole buffer, padded."""
        buffer, spill, filled = self._buffer(min(batch_size, num), x), None, 0
        rows = buffer.shape[0]
        for size in _batch_sizes(num, self.chunk):
            if size <= rows - filled:
                noise.perturb_(buffer[filled:filled + size], x, generator)
                filled += size
            else:
                spill = spill if spill is not None else self._buffer(self.chunk, x)
                drawn = noise.perturb_(spill[:size], x, generator)
                while drawn.shape[0]:
                    take = min(drawn.shape[0], rows - filled)
                    buffer[filled:filled + take].copy_(drawn[:take])
                    drawn, filled = drawn[take:], filled + take
                    if filled == rows and drawn.shape[0]:
                        yield buffer, rows
                        filled = 0
            if filled == rows:
                yield buffer, rows
                filled = 0
        if filled:
            yield (buffer if self.compile else buffer[:filled]), filled

    def prepare(self, model: nn.Module) -> nn.Module:
        """The model as the engine runs it: channels-last and compiled when asked (cached).

        ``channels_last`` converts the model's parameters in place.
        """
        known = self._prepared.get(id(model))
        if known is not None and known[0] is model:
            return known[1]
        runnable = model
        if self.channels_last:
            runnable = model.to(memory_format=torch.channels_last)
        if self.compile:
            mode = {} if self.compile_mode == "default" else {"mode": self.compile_mode}
            runnable = torch.compile(runnable, dynamic=False, **mode)
        self._prepared[id(model)] = (model, runnable)
        return runnable

    def forward(self, model, batch: torch.Tensor, size: int, num_classes: int,
                outputs: str = "votes") -> torch.Tensor:
        """Logits of the first ``size`` rows of ``batch`` (the model sees the whole batch).

        The noisy batch is cast to the model's parameter dtype where they differ (a half or
        bf16 model, float64 inputs): the cast is a fixed function of the noisy input, so it is
        part of the classifier that is smoothed, and the noise itself stays in the input's
        dtype (float32 at least: see ``Smoothed.prepare_input``)."""
        logits = self.model_outputs(model, batch)
        check_outputs(logits, batch.shape[0], num_classes, outputs, batch.shape)
        return logits[:size]

    def model_outputs(self, model, batch: torch.Tensor) -> torch.Tensor:
        """The model's outputs on the whole ``batch``, under the precision's autocast. Under
        CUDA graphs a replay overwrites the last one's outputs: each call starts a new graph
        step and returns a copy, which the counts may read after the next batch."""
        dtype = PRECISIONS[self.precision]
        autocast = (torch.autocast(batch.device.type, dtype=dtype) if dtype is not None
                    else contextlib.nullcontext())
        graphs = self.compile and self.compile_mode in GRAPH_MODES
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with autocast:
            logits = model(model_input(model, batch))
        return logits.clone() if graphs else logits

    def _buffer(self, rows: int, x: torch.Tensor) -> torch.Tensor:
        nhwc = self.channels_last and x.dim() == 3
        fmt = torch.channels_last if nhwc else torch.contiguous_format
        return torch.empty((rows,) + tuple(x.shape), dtype=x.dtype, device=x.device,
                           memory_format=fmt)


class _Stream:
    """One program in flight: its current request and how far its draws have got."""

    def __init__(self, key, program: Program):
        self.key, self.program = key, program
        self.request: Draws | None = None
        self.cells: list[int] = []  # one row of the counts table per request segment
        self.segment = 0  # the segment being drawn
        self.left_in_segment = 0  # draws of that segment not yet drawn
        self.undrawn = 0  # draws of the request not yet drawn (all segments)
        self.span_rows = 0  # rows forwarded since the last synchronisation
        self.dense: list = []  # per segment: pixel counts or gathered values (Draws.outputs)
        self.seconds = 0.0
        self.passes = 0  # base-model forward passes its rows took (where the model says)

    def next_chunk(self, chunk: int) -> tuple[int, int]:
        """(cell, size) of the next canonical chunk, advancing past empty segments."""
        while self.left_in_segment == 0:
            self.segment += 1
            self.left_in_segment = self.request.sizes[self.segment]
        size = min(self.left_in_segment, chunk)
        self.left_in_segment -= size
        self.undrawn -= size
        return self.cells[self.segment], size


class _Scheduler:
    """Packs the draws of many programs' requests into full forward batches."""

    def __init__(self, engine: BatchedVotes, model, num_classes: int, batch_size: int):
        self.engine, self.model = engine, model
        self.num_classes, self.batch_size = num_classes, batch_size
        self.active: list[_Stream] = []
        self.free_cells: list[int] = []
        # (cells + 1, C + 2) counts; the last row is padding, column C counts the rows whose
        # logits were not finite (a vote for no class: refused when the request ends), column
        # C + 1 sums the rows' forward passes where the model reports them (``costed``)
        self.table: torch.Tensor | None = None
        self.costed = False
        self.buffer = self.carry_buffer = None
        # drawn, not yet forwarded: the rest of a chunk larger than the room left in a batch
        self.carry: tuple[_Stream, int, torch.Tensor] | None = None
        self.rule: tuple = ("votes", None)  # outputs and threshold of the batch being filled
        self.clock = time.perf_counter()

    def run(self, programs: Iterable[tuple[object, Program]]) -> Iterator[Finished]:
        programs = iter(programs)
        while True:
            while self._undrawn() < 2 * self.batch_size:  # keep the next batch full
                pair = next(programs, None)
                if pair is None:
                    break
                stream = _Stream(*pair)
                self.active.append(stream)
                yield from self._advance([(stream, None)])
            if not self.active:
                return
            self._forward_batch()
            yield from self._complete()

    def _undrawn(self) -> int:
        return sum(s.undrawn for s in self.active)

    def _advance(self, answers) -> Iterator[Finished]:
        """Send each stream its counts (None to start it); start its next request or finish it."""
        for stream, counts in answers:
            started, stop = time.perf_counter(), None
            with metered() as own:  # soft scores, nested runs: the step's own passes
                try:
                    request = stream.program.send(counts)
                except StopIteration as end:
                    stop = end
            self._own_time(stream, started)
            stream.passes += own[0]
            self.costed = self.costed or own[1]
            if stop is None:
                self._start(stream, request)
                continue
            self.active.remove(stream)
            passes = stream.passes if self.costed else None
            meter(passes)  # a nested run's cost is its enclosing program step's
            yield Finished(stream.key, stop.value, stream.seconds, passes)
        if any(s.undrawn == 0 and s.request is not None for s in self.active):
            yield from self._complete()  # requests of zero draws

    def _start(self, stream: _Stream, request) -> None:
        if not isinstance(request, Draws):
            raise TypeError(f"a program must yield Draws, got {type(request).__name__}")
        sizes = tuple(int(s) for s in request.sizes)
        if not sizes or min(sizes) < 0:
            raise SmoothcertError(f"draw counts must be non-negative, got {sizes}")
        if request.threshold is not None and not 0.0 <= request.threshold <= 1.0:
            raise SmoothcertError(f"a vote threshold is a softmax score in [0, 1], got "
                                  f"{request.threshold!r}")
        if request.outputs not in OUTPUTS or (request.outputs != "votes"
                                              and request.threshold is not None):
            raise SmoothcertError(f"a request reads outputs {request.outputs!r} (one of "
                                  f"{', '.join(OUTPUTS)}; a threshold only with votes)")
        classes = request.num_classes
        if classes is not None and not 2 <= classes <= self.num_classes:
            raise SmoothcertError(f"a request's model has {classes} classes; the run's counts "
                                  f"hold 2 to {self.num_classes}")
        if self.buffer is None:
            self._allocate(request.x)
        stream.request = request
        stream.cells = [self._cell() for _ in sizes]
        stream.dense = [[] for _ in sizes] if request.outputs == "values" else [
            torch.zeros((request.x[0].numel(), classes or self.num_classes), dtype=torch.long,
                        device=request.x.device) for _ in sizes
        ] if request.outputs == "pixel-votes" else []
        stream.segment, stream.left_in_segment = 0, sizes[0]
        stream.undrawn = sum(sizes)

    def _allocate(self, x: torch.Tensor) -> None:
        self.buffer = self.engine._buffer(self.batch_size, x)
        self.carry_buffer = self.engine._buffer(self.engine.chunk, x)
        self.table = torch.zeros((65, self.num_classes + 2), dtype=torch.long, device=x.device)
        self.free_cells = list(range(64))

    def _cell(self) -> int:
        if not self.free_cells:  # grow the counts table, keeping the padding row last
            rows = self.table.shape[0] - 1
            grown = torch.zeros((2 * rows + 1, self.num_classes + 2), dtype=torch.long,
                                device=self.table.device)
            grown[:rows] = self.table[:rows]
            self.table, self.free_cells = grown, list(range(rows, 2 * rows))
        return self.free_cells.pop()

    @torch.inference_mode()
    def _forward_batch(self) -> None:
        pieces = self._fill()  # [(stream, cell, rows)], all of one key (self.key)
        size = sum(rows for _, _, rows in pieces)
        padded = self.engine.compile  # a compiled model keeps one batch shape
        batch = self.buffer if padded else self.buffer[:size]
        request = pieces[0][0].request
        model = self.model if request.model is None else self.engine.prepare(request.model)
        outputs, threshold = self.rule
        # a model may skip what changes no argmax; a threshold vote reads every score
        with engine_call(argmax_only=outputs == "votes" and threshold is None) as call:
            logits = self.engine.forward(model, batch, size,
                                         request.num_classes or self.num_classes, outputs)
        passes = call.row_passes[:size] if call.row_passes is not None else None
        self.costed = self.costed or passes is not None
        cells = [(cell, rows) for _, cell, rows in pieces]
        if outputs != "votes":
            self._count_dense(pieces, logits, passes)
        elif threshold is None:
            count_argmax(self.table, cells, logits, passes)
        else:
            count_threshold(self.table, cells, logits, passes, threshold)
        for stream, _, rows in pieces:
            stream.span_rows += rows

    def _count_dense(self, pieces: list, logits: torch.Tensor, passes) -> None:
        """Each piece's rows into its segment's pixel counts or values (``votes.py``); the table
        keeps their rows that do not vote and their passes, as for votes."""
        start = 0
        for stream, cell, rows in pieces:
            mine = logits[start:start + rows]
            segment = stream.dense[stream.cells.index(cell)]
            bad = (gather_values(segment, mine) if stream.request.outputs == "values"
                   else count_pixels(segment, mine))
            self.table[cell, -2] += bad.sum()
            if passes is not None:
                self.table[cell, -1] += passes[start:start + rows].sum()
            start += rows

    def _fill(self) -> list:
        """Draw noise into the batch buffer until it is full or no request of the batch's voting
        rule (the carried chunk's, else the first request's with draws left) has any left."""
        pieces: list = []
        first = self.carry[0] if self.carry is not None else \
            next((s for s in self.active if s.undrawn > 0), None)
        key = first.request.batch_key() if first is not None else (("votes", None), None)
        self.rule = key[0]
        filled = self._take_carry(pieces, 0) if self.carry is not None else 0
        for stream in self.active:
            if stream.request is None or stream.request.batch_key() != key:
                continue
            while filled < self.batch_size and stream.undrawn > 0:
                cell, size = stream.next_chunk(self.engine.chunk)
                if size <= self.batch_size - filled:
                    self._draw(stream, self.buffer[filled:filled + size])
                    pieces.append((stream, cell, size))
                    filled += size
                else:  # drawn whole, forwarded over this batch and the next ones
                    self.carry = (stream, cell, self._draw(stream, self.carry_buffer[:size]))
                    filled = self._take_carry(pieces, filled)
        return pieces

    @staticmethod
    def _draw(stream: _Stream, rows: torch.Tensor) -> torch.Tensor:
        """x + δ into ``rows``, δ one canonical chunk of the stream's generator."""
        request = stream.request
        return request.noise.perturb_(rows, request.x, request.generator)

    def _take_carry(self, pieces: list, filled: int) -> int:
        """Move as much of the carried chunk as fits into the batch; returns the rows filled."""
        stream, cell, rows = self.carry
        take = min(rows.shape[0], self.batch_size - filled)
        self.buffer[filled:filled + take].copy_(rows[:take])
        pieces.append((stream, cell, take))
        self.carry = (stream, cell, rows[take:]) if take < rows.shape[0] else None
        return filled + take

    def _complete(self) -> Iterator[Finished]:
        """One host synchronisation for every request whose draws have all been forwarded."""
        carrying = self.carry[0] if self.carry is not None else None
        done = [s for s in self.active
                if s.request is not None and s.undrawn == 0 and s is not carrying]
        if not done:
            return
        cells = [c for s in done for c in s.cells]
        counts = self.table[cells].cpu().numpy()  # the host sync for these decisions
        self.table[cells] = 0
        self._account_time()
        answers, start = [], 0
        for stream in done:
            k = len(stream.cells)
            mine = counts[start:start + k]
            self.engine.check_finite(int(mine[:, -2].sum()), sum(stream.request.sizes),
                                     stream.key)
            stream.passes += int(mine[:, -1].sum())
            dense, stream.dense = stream.dense, []
            answers.append((stream, answer(stream.request.outputs, mine[:, :-2], dense)))
            self.free_cells.extend(stream.cells)
            stream.request, stream.cells, start = None, [], start + k
        yield from self._advance(answers)

    def _own_time(self, stream: _Stream, started: float) -> None:
        """The time a program spent in its own code (e.g. OptimizeSigma, an attack's gradient
        steps) is its own: it is added to its seconds and left out of the shared forward time."""
        spent = time.perf_counter() - started
        stream.seconds += spent
        self.clock += spent

    def _account_time(self) -> None:
        now = time.perf_counter()
        rows = sum(s.span_rows for s in self.active)
        for stream in self.active:
            if rows:
                stream.seconds += (now - self.clock) * stream.span_rows / rows
            stream.span_rows = 0
        self.clock = now


def _batch_sizes(num: int, batch_size: int) -> Iterator[int]:
    full, rest = divmod(num, batch_size)
    yield from [batch_size] * full
    if rest:
        yield rest
