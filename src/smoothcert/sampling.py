"""The one Monte Carlo engine: class votes of a base classifier under noise, counted on device.

Both PREDICT and CERTIFY (``smoothing.py``) and every dataset runner get their counts from an
:class:`Engine`. It is a single swappable component so that faster engines (step 4: batches filled
across images, compiled models, autocast) can replace :class:`BatchedVotes` without touching the
statistics.
An engine also gives soft scores, the mean softmax over the draws, for certificates of the soft
smoothed classifier (the L-bound, ``lipschitz.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

import torch
from torch import nn

from .errors import SmoothcertError


class Engine(Protocol):
    def votes(
        self,
        model: nn.Module,
        x: torch.Tensor,
        noise,
        num: int,
        num_classes: int,
        batch_size: int,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Counts (num_classes,) int64, on x's device, of argmax f(x + δ_i) over ``num`` draws."""
        ...

    def soft_scores(
        self,
        model: nn.Module,
        x: torch.Tensor,
        noise,
        num: int,
        num_classes: int,
        batch_size: int,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Means (num_classes,) float64, on x's device, of softmax f(x + δ_i) over ``num`` draws."""
        ...


class BatchedVotes:
    """Draw noise in place into one preallocated buffer, forward, and bincount the argmaxes.

    No per-sample Python loop and no host synchronisation: the counts stay on the device until the
    caller makes a decision from them. The last batch is shorter when ``batch_size`` does not
    divide ``num``. Runs under ``inference_mode``; the caller puts the model in eval mode.
    """

    def votes(self, model, x, noise, num, num_classes, batch_size, generator=None):
        counts = torch.zeros(num_classes, dtype=torch.long, device=x.device)
        buffer = torch.empty(
            (min(batch_size, num),) + tuple(x.shape), dtype=x.dtype, device=x.device
        )
        with torch.inference_mode():
            for size in _batch_sizes(num, batch_size):
                batch = noise.sample_(buffer[:size], generator).add_(x)
                logits = model(batch)
                _check_logits(logits, size, num_classes)
                counts += torch.bincount(logits.argmax(dim=1), minlength=num_classes)
        return counts

    def soft_scores(self, model, x, noise, num, num_classes, batch_size, generator=None):
        """The Monte Carlo estimate (1/num)·Σ_i softmax f(x + δ_i) of the soft smoothed classifier
        G(x) = E[softmax f(x + δ)] (Salman et al. 2019), shape (num_classes,), float64, on device.

        Same noise stream as :meth:`votes`: with equal generator states, the draws are the same.
        Each softmax is taken in the logits' dtype and summed in float64, so the estimate does
        not lose precision over 10⁵ draws (float32 softmax: error ~1e-7 per entry, far below the
        Monte Carlo error ≥ ½/√n); entries lie in [0, 1] and sum to 1 up to that rounding.
        """
        sums = torch.zeros(num_classes, dtype=torch.float64, device=x.device)
        buffer = torch.empty(
            (min(batch_size, num),) + tuple(x.shape), dtype=x.dtype, device=x.device
        )
        with torch.inference_mode():
            for size in _batch_sizes(num, batch_size):
                batch = noise.sample_(buffer[:size], generator).add_(x)
                logits = model(batch)
                _check_logits(logits, size, num_classes)
                sums += logits.softmax(dim=1).sum(dim=0, dtype=torch.float64)
        return sums / num


def _batch_sizes(num: int, batch_size: int) -> Iterator[int]:
    full, rest = divmod(num, batch_size)
    yield from [batch_size] * full
    if rest:
        yield rest


def _check_logits(logits: torch.Tensor, size: int, num_classes: int) -> None:
    if logits.dim() != 2 or logits.shape[0] != size:
        raise SmoothcertError(
            f"the model returned shape {tuple(logits.shape)}; expected ({size}, C)"
        )
    if logits.shape[1] != num_classes:
        raise SmoothcertError(
            f"num_classes mismatch: the model outputs {logits.shape[1]} classes, "
            f"but num_classes={num_classes}"
        )


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
