"""What a program asks the engine for (:class:`Draws`) and what the engine gives back when it
ends (:class:`Finished`); the protocol of :mod:`.engine`, in a file of its own."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True, eq=False)
class Draws:
    """A request for ``sum(sizes)`` noisy votes at one input ``x`` (C, H, W), on the model's device.

    The segments are drawn in order from ``generator`` with ``noise``; the program that yielded
    the request receives an int64 array (len(sizes), num_classes) of argmax f(x + δ) counts,
    one row per segment (e.g. CERTIFY's n0 selection draws and its n estimation draws).
    With ``threshold`` θ in [0, 1] a draw votes instead for every class c with
    softmax f(x + δ)_c >= θ (several classes or none: Levine & Feizi 2020's base classifier),
    so a row may sum to more or less than its draws; None (default) is the argmax vote.
    ``model`` forwards these draws through another classifier of the same inputs than the
    run's (a cascade's level, ACES' selection model; None: the run's), with ``num_classes``
    classes (None: the run's; at most the run's, whose columns its counts keep).

    ``outputs`` says what the model returns and the program receives (:data:`OUTPUTS`):
    "votes" (the default, above); "pixel-votes" for a segmentation model, logits (B, K, H, W):
    an int64 array (len(sizes), H·W, K), per segment the argmax counts of each pixel
    (row-major), the votes of Fischer et al. 2021's per-pixel smoothing; "values" for a
    regression model, outputs (B, D): a list of float64 arrays (size_i, D), one per segment,
    the outputs f(x + δ_i) in draw order (Chiang et al. 2020's median smoothing sorts them).
    """

    x: torch.Tensor
    noise: object
    sizes: tuple
    generator: torch.Generator | None = None
    threshold: float | None = None
    model: nn.Module | None = None
    num_classes: int | None = None
    outputs: str = "votes"

    def batch_key(self) -> tuple:
        """Requests of one key share forward batches: one kind of output and voting rule, one
        model."""
        return (self.outputs, self.threshold), id(self.model) if self.model is not None else None


OUTPUTS = ("votes", "pixel-votes", "values")
"""What a request reads from the model's outputs (:class:`Draws`)."""


@dataclass(frozen=True)
class Finished:
    """A program's return value, with its share of the engine's wall time and its cost.

    ``seconds`` divides the time between host synchronisations among the programs in
    proportion to the noisy inputs each had in the forward passes, so the seconds of a run's
    programs add up to its wall time. ``passes``: the base-model forward passes its noisy
    inputs took, where the model reports them (an ensemble's member evaluations), else None.
    """

    key: object
    result: object
    seconds: float
    passes: int | None = None


Program = Generator  # yields Draws, receives np.ndarray counts, returns a result
