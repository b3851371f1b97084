"""The ``shift-enumeration`` certifier: translations certified by trying them all (Li et al.,
TSS, CCS 2021, "translation with black padding"; authors' code AI-secure/semantic-randomized-
smoothing, ``semantic/translation_certify.py`` with ``BlackTranslational`` or
``Translational``).

Integer translations of an H×W image form a finite set up to equivalence: with black padding
a shift by (dx, dy) with |dx| ≥ H or |dy| ≥ W leaves an all-black image, the same as the shift
by (H, 0); with cyclic padding shifts repeat modulo (H, W). So the base classifier f itself can
be checked on every shift: no smoothing, no Monte Carlo, no α, and the certificate is exact for
the model that ran. The shifts (dx, dy) with |dx| ≤ m, |dy| ≤ m (``max_shift`` m; default the
image's longer side, the authors' range) are visited in shells of equal ℓ2 length, shortest
first (the authors sort them by dx² + dy²); ``predict`` is f(x) (the shell of length 0), and
``radius`` is the length of the shortest shift whose prediction differs from it, or m + 1 when
none does (every shift of length ≤ m lies in the box and was checked). Guarantee: f predicts
``predict`` on every shift of x by an integer vector of ℓ2 length < ``radius``.

The authors compare each shift's prediction with the *label* (a certified-and-correct radius)
and stop at the first miss; comparing with f(x) certifies the prediction itself, whatever the
label, and equals theirs wherever f(x) is the label (``correct`` says which rows those are).

A shift: out[c, i, j] = x[c, i + dx, j + dy], zero outside the image (``padding=black``) or
with indices modulo H and W (``padding=cyclic``, the ``translation`` transformation's shift),
as the authors' ``proc``. Records: Cohen et al.'s columns (``radius`` in pixels, the ℓ2 length
of a shift), then ``n``, the shifts tried.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..data.registry import DATASETS
from ..errors import SmoothcertError
from ..registry import option
from ..smoothing.engine import Draws
from ..transforms.translation import cyclic_shift
from .certifier import Certifier, register_certifier

PADDINGS = ("black", "cyclic")


def shift_shells(max_shift: int) -> list[np.ndarray]:
    """The integer shifts (dx, dy) with |dx|, |dy| ≤ ``max_shift``, grouped by their squared
    length, shortest first: a list of (k, 2) int64 arrays (the first is [(0, 0)])."""
    side = np.arange(-max_shift, max_shift + 1)
    grid = np.stack(np.meshgrid(side, side, indexing="ij"), axis=-1).reshape(-1, 2)
    lengths = (grid**2).sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    grid, lengths = grid[order], lengths[order]
    cuts = np.flatnonzero(np.diff(lengths)) + 1
    return np.split(grid, cuts)


def black_shift(x: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W): the one image x (C, H, W) shifted by each row (dx, dy) of ``shifts``,
    zero where the source pixel x[i + dx, j + dy] lies outside the image."""
    count, (c, h, w) = shifts.shape[0], x.shape
    shifts = shifts.to(device=x.device, dtype=torch.long)
    rows = torch.arange(h, device=x.device)[None, :] + shifts[:, :1]  # (B, H)
    cols = torch.arange(w, device=x.device)[None, :] + shifts[:, 1:]  # (B, W)
    inside = ((rows >= 0) & (rows < h))[:, :, None] & ((cols >= 0) & (cols < w))[:, None, :]
    batch = x.expand(count, c, h, w)
    out = batch.gather(2, rows.clamp(0, h - 1)[:, None, :, None].expand(count, c, h, w))
    out = out.gather(3, cols.clamp(0, w - 1)[:, None, None, :].expand(count, c, h, w))
    return out * inside[:, None].to(out.dtype)


class ShiftSweep:
    """The engine's stand-in for a noise that visits ``shifts`` (N, 2) once, in order: the
    k-th copy of an input is its k-th shift. One object per request (it keeps a cursor); no
    generator is read."""

    def __init__(self, shifts: torch.Tensor, padding: str):
        self.shifts, self.padding, self.cursor = shifts, padding, 0

    def perturb_(self, out: torch.Tensor, x: torch.Tensor, generator=None) -> torch.Tensor:
        rows = self.shifts[self.cursor:self.cursor + out.shape[0]]
        self.cursor += out.shape[0]
        shift = black_shift if self.padding == "black" else cyclic_shift
        return out.copy_(shift(x, rows))


@register_certifier("shift-enumeration")
class ShiftEnumeration(Certifier):
    """Every integer shift of x up to ``max_shift`` pixels, shortest first: the ℓ2 length of
    the shortest that changes f's prediction (exact, deterministic; module doc)."""

    @dataclass(frozen=True)
    class Options:
        padding: str = option("black", "what a shift brings in: black (zeros, the authors' "
                                        "BlackTranslational) or cyclic (wrap-around, their "
                                        "Translational)", choices=PADDINGS)
        max_shift: int | None = option(None, "m, pixels: try |dx|, |dy| <= m ((2m + 1)^2 "
                                             "forwards per image; default: the image's "
                                             "longer side, the authors')")

        def __post_init__(self):
            if self.max_shift is not None and self.max_shift < 1:
                raise SmoothcertError(f"max_shift must be an integer >= 1, got "
                                      f"{self.max_shift!r}")

    columns = ("idx", "label", "predict", "radius", "correct", "time", "n", "seed")
    needs_n0 = False
    uses_noise = False

    def radius_norm(self) -> str:
        return "shift, pixels (l2 of (dx, dy))"

    def check(self, config) -> None:
        """A ``max_shift`` beyond the registered dataset's image is refused (those shifts
        repeat shorter ones)."""
        shape = getattr(DATASETS.get(config.dataset), "input_shape", None)
        if shape is not None and self.max_shift is not None and \
                self.max_shift > max(shape[-2:]):
            raise SmoothcertError(f"max_shift {self.max_shift} is beyond the "
                                  f"{shape[-2]}x{shape[-1]} image: at most {max(shape[-2:])}")

    def program(self, run, x, label, idx, generator):
        x = run.smoothed.prepare_input(x)
        m = self.max_shift if self.max_shift is not None else max(x.shape[-2:])
        shells = shift_shells(m)
        shifts = torch.as_tensor(np.concatenate(shells), device=x.device)
        counts = yield Draws(x, ShiftSweep(shifts, self.padding), tuple(len(s) for s in shells))
        counts = np.asarray(counts)
        predict = int(counts[0].argmax())
        radius = float(m + 1)
        for shell, votes in zip(shells, counts):
            if votes[predict] < len(shell):  # a shift of this length changes the prediction
                radius = math.sqrt(float((shell[0] ** 2).sum()))
                break
        return {"predict": predict, "radius": radius, "correct": int(predict == label),
                "n": int(len(shifts))}
