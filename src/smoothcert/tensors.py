"""Small torch utilities shared by every layer: model modes, devices, frozen parameters, copies."""

from __future__ import annotations

import contextlib
import contextvars

import torch
from torch import nn


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """Put ``model`` in eval mode for the block, then restore its previous mode."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer (CPU for a parameterless model)."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device
    return torch.device("cpu")


@contextlib.contextmanager
def frozen(model: nn.Module):
    """No parameter gradients inside the block; each parameter's flag is restored after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def copies(x: torch.Tensor, m: int) -> torch.Tensor:
    """``x`` (B, ...) repeated m times copy-major: row j·B + i is input i (``x.repeat``)."""
    return x.repeat((m,) + (1,) * (x.dim() - 1))


_ARGMAX_ONLY = contextvars.ContextVar("smoothcert_argmax_only", default=False)


@contextlib.contextmanager
def argmax_only():
    """Declare that the model calls inside read only each row's argmax and whether its output is
    finite (the engine's vote counting). A model may then skip work that cannot change either —
    an ensemble's exact consensus — while its plain calls (soft scores, gradients) stay the whole
    function."""
    token = _ARGMAX_ONLY.set(True)
    try:
        yield
    finally:
        _ARGMAX_ONLY.reset(token)


def reading_argmax_only() -> bool:
    """Whether the current model call is inside :func:`argmax_only`."""
    return _ARGMAX_ONLY.get()
