"""What the engine tells a model about a call, and what a model tells the engine back.

A model is an ``nn.Module``; the engine calls it in two ways. Counting votes it reads only each
row's argmax and whether the output is finite; estimating soft scores or taking gradients it
reads everything. :func:`engine_call` says which, through a :class:`ModelCall` that the model
finds with :func:`current_call`. A model may use ``argmax_only`` to skip work that cannot change
an argmax (an ensemble's exact consensus), and may set ``row_passes``, what each row cost it in
base-model forward passes (an ensemble: the members that ran on it), which the engine adds up
per input. A model that combines other models' outputs runs them under :func:`whole_outputs`.

The passes of one input's program reach its record through :func:`metered` and :func:`meter`:
the scheduler meters each step of a program, and a step that computes soft scores, runs a
nested scheduler or forwards the clean input (``certifiers.deterministic.clean_scores``: the
clean prediction of ``deterministic``, ``lbound`` and ``lbound-heuristic``) meters what it
forwarded, so an ensemble's record counts every member pass its example took.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch


class ModelCall:
    """One engine call of a model (module doc): ``argmax_only`` (read only argmaxes and
    finiteness) and ``row_passes`` (None, or a 1-D integer tensor on the rows' device: the
    base-model forward passes each row took), which the model may set."""

    __slots__ = ("argmax_only", "row_passes")

    def __init__(self, argmax_only: bool):
        self.argmax_only = argmax_only
        self.row_passes: torch.Tensor | None = None


_CALL: contextvars.ContextVar[ModelCall | None] = contextvars.ContextVar(
    "smoothcert_model_call", default=None)
_METER: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "smoothcert_pass_meter", default=None)


@contextlib.contextmanager
def engine_call(argmax_only: bool):
    """The model calls inside are the engine's; yields their :class:`ModelCall`."""
    call = ModelCall(argmax_only)
    token = _CALL.set(call)
    try:
        yield call
    finally:
        _CALL.reset(token)


def current_call() -> ModelCall | None:
    """The current :func:`engine_call`, None outside one (a user's own call of the model)."""
    return _CALL.get()


@contextlib.contextmanager
def whole_outputs():
    """No :func:`engine_call` for the calls inside: a model whose outputs are combined with
    others' (an ensemble's member) returns all of them and reports nothing."""
    token = _CALL.set(None)
    try:
        yield
    finally:
        _CALL.reset(token)


@contextlib.contextmanager
def metered():
    """Collect the passes :func:`meter` reports inside; yields [passes, whether any was
    reported]."""
    box = [0, False]
    token = _METER.set(box)
    try:
        yield box
    finally:
        _METER.reset(token)


def meter(passes: int | None) -> None:
    """Report ``passes`` (None: the model reported none) to the enclosing :func:`metered`."""
    box = _METER.get()
    if box is not None and passes is not None:
        box[0] += passes
        box[1] = True
