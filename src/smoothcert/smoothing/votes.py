"""How the engine turns a forward batch's logits into votes in its counts table, on device.

The table (``engine._Scheduler``) has one row per request segment ("cell") and num_classes + 2
columns: the votes of each class, then the rows whose logits do not vote (:func:`voting`:
refused when the request's counts are read) and the base-model passes the model reported.
A batch is a list of ``(cell, rows)`` pieces, its rows in that order. Two voting rules:

* argmax (Cohen et al.'s base classifier): each row votes for its one top class;
* threshold θ (Levine & Feizi, NeurIPS 2020, ``utils_band.py: predict_and_certify``): each row
  votes for every class whose softmax score is >= θ, several or none.
"""

from __future__ import annotations

import torch


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
