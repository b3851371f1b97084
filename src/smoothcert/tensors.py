"""Small torch utilities shared by every layer: model modes, devices, frozen parameters, copies,
the dtype a model takes its inputs in."""

from __future__ import annotations

import contextlib

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


def input_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's first floating-point parameter or buffer (None: it has none)."""
    tensors = (t for group in (model.parameters(), model.buffers()) for t in group)
    return next((t.dtype for t in tensors if t.is_floating_point()), None)


def model_input(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """``batch`` cast to the model's dtype where they differ (a half or bf16 model, float64
    inputs), so that every caller of a model (the engine, attacks, σ optimization) feeds it
    alike instead of failing in torch with "Input type and bias type should be the same"."""
    wanted = input_dtype(model)
    return batch if wanted in (None, batch.dtype) else batch.to(wanted)
