"""How the engine turns a forward batch's logits into votes in its counts table, on device.

The table (``engine._Scheduler``) has one row per request segment ("cell") and num_classes + 2
columns: the votes of each class, then the rows whose logits do not vote (:func:`voting`:
refused when the request's counts are read) and the base-model passes the model reported.
A batch is a list of ``(cell, rows)`` pieces, its rows in that order. Two voting rules:

* argmax (Cohen et al.'s base classifier): each row votes for its one top class;
* threshold θ (Levine & Feizi, NeurIPS 2020, ``utils_band.py: predict_and_certify``): each row
  votes for every class whose softmax score is >= θ, several or none.

Dense outputs (``Draws.outputs``) are gathered per request segment beside the table, which
still counts their rows that do not vote and their passes: per-pixel argmax counts
(:func:`count_pixels`) and the raw outputs of a regression model (:func:`gather_values`).
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import SmoothcertError


def voting(logits: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the rows whose argmax is a vote, those whose largest logit is finite. A NaN
    (NaN weights: argmax would say class 0) or a +inf (an overflow: ties) makes it NaN or
    +inf; −inf logits are fine beside a finite one (the log of a hard classifier's 0), but a
    row of −inf only votes for nothing."""
    return torch.isfinite(logits.amax(dim=1))


def _row_cells(cells: list, device) -> torch.Tensor:
    """(B,) int64: the table row of each batch row."""
    return torch.repeat_interleave(torch.tensor([c for c, _ in cells]),
                                   torch.tensor([r for _, r in cells])).to(device,
                                                                           non_blocking=True)


def count_argmax(table: torch.Tensor, cells: list, logits: torch.Tensor,
                 passes: torch.Tensor | None) -> None:
    """Add each row's argmax vote (a row that does not vote: column C), and its passes where
    reported, to its cell of ``table``."""
    width = table.shape[1]  # a request's model may have fewer classes than the table
    labels = logits.argmax(dim=1).masked_fill_(~voting(logits), width - 2)
    if len(cells) == 1:
        cell = cells[0][0]
        table[cell, :-1] += torch.bincount(labels, minlength=width - 1)
        if passes is not None:
            table[cell, -1] += passes.sum()
        return
    flat = _row_cells(cells, labels.device) * width
    table.view(-1).index_add_(0, flat + labels, torch.ones_like(labels))
    if passes is not None:
        table.view(-1).index_add_(0, flat + width - 1, passes)


def count_threshold(table: torch.Tensor, cells: list, logits: torch.Tensor,
                    passes: torch.Tensor | None, threshold: float) -> None:
    """Threshold votes: each row adds 1 to every class whose softmax score (in the logits'
    dtype, at least float32) is >= ``threshold``; a row that does not vote adds 1 to column C
    instead; its passes as :func:`count_argmax`."""
    ok = voting(logits)
    scores = logits.to(torch.promote_types(logits.dtype, torch.float32)).softmax(dim=1)
    rows = torch.zeros((ok.shape[0], table.shape[1]), dtype=torch.long, device=logits.device)
    rows[:, :scores.shape[1]] = (scores >= threshold) & ok[:, None]
    rows[:, -2] = ~ok
    if passes is not None:
        rows[:, -1] = passes
    table.index_add_(0, _row_cells(cells, logits.device), rows)


def count_pixels(counts: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Add the per-pixel argmax votes of ``logits`` (r, K, H, W) to ``counts`` (H·W, K); returns
    the (r,) mask of rows that do not vote (some pixel's largest logit not finite), which add
    nothing (their input is refused when its counts are read)."""
    rows, classes = logits.shape[:2]
    # (r, P, K): the classes contiguous, as argmax over them is 8× faster on the CPU
    flat = logits.reshape(rows, classes, -1).transpose(1, 2).contiguous()
    pixels = flat.shape[1]
    bad = ~torch.isfinite(flat.amax(dim=2)).all(dim=1)
    labels = flat[~bad].argmax(dim=2)  # (r', P)
    index = labels + torch.arange(pixels, device=labels.device) * classes
    counts.view(-1).add_(torch.bincount(index.reshape(-1), minlength=pixels * classes))
    return bad


def gather_values(values: list, outputs: torch.Tensor) -> torch.Tensor:
    """Append the (r, D) ``outputs`` in float64 to ``values``; returns the (r,) mask of rows with
    a non-finite output (their input is refused when its values are read)."""
    values.append(outputs.to(torch.float64))
    return ~torch.isfinite(outputs).all(dim=1)


def answer(outputs: str, counts: np.ndarray, dense: list):
    """What a finished request's program receives (``Draws``): its vote ``counts``, or its
    ``dense`` outputs (pixel counts (segments, H·W, K); values, one (size, D) array per
    segment)."""
    if outputs == "pixel-votes":
        return torch.stack(dense).cpu().numpy()
    if outputs == "values":
        return [torch.cat(v).cpu().numpy() if v else np.zeros((0, 0)) for v in dense]
    return counts


def check_outputs(logits, size: int, num_classes: int, outputs: str = "votes",
                  batch_shape: tuple = ()) -> None:
    """Refuse model outputs of another shape than a request of ``outputs`` reads (per-pixel
    logits: of the input batch's ``batch_shape`` (B, C, H, W) pixels)."""
    dims, shape = (4, f"({size}, K, H, W)") if outputs == "pixel-votes" else (2, f"({size}, C)")
    if not isinstance(logits, torch.Tensor) or logits.dim() != dims or logits.shape[0] != size:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise SmoothcertError(f"the model returned {got}; expected {shape}")
    if outputs == "pixel-votes" and logits.shape[2:] != batch_shape[2:]:
        raise SmoothcertError(f"the model returned logits of {tuple(logits.shape[2:])} pixels "
                              f"for inputs of {tuple(batch_shape[2:])}: a segmentation model "
                              f"labels every input pixel")
    if logits.shape[1] != num_classes:
        what = "outputs" if outputs == "values" else "classes"
        raise SmoothcertError(
            f"num_classes mismatch: the model outputs {logits.shape[1]} {what}, "
            f"but num_classes={num_classes}"
        )
