"""Small torch utilities shared by every layer: model modes, devices, frozen parameters, copies."""

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
