"""Ablation: what the base classifier of (de)randomized ablation smoothing sees (Levine & Feizi,
NeurIPS 2020 "(De)Randomized Smoothing for Certifiable Defense against Patch Attacks"; AAAI 2020
"Robustness Certificates for Sparse Adversarial Attacks by Randomized Ablation").

Only part of the image is kept: one band of ``size`` columns (``column``), one ``size``×``size``
block (``block``), both wrapping around the image's edges, or ``keep`` pixels drawn without
replacement (``pixels``, every channel of a kept pixel kept). An ablated pixel is written as NaN
in pixel space: the model's first layer (:class:`~smoothcert.models.encodings.AblationEncoding`)
turns a kept value x into the pair (x, 1 − x) and an ablated one into (0, 0), the authors'
encoding, so that "ablated" differs from "black". A model without that layer returns NaN
logits, which the engine refuses: an ablated input can never be read as an image by mistake.

:class:`Sweep` and :class:`RandomAblation` are what the engine's ``Draws`` carry in place of a
noise (anything with ``perturb_(out, x, generator)``): the sweep visits every band or block
position once, in order (deterministic, no generator), the random ablation draws masks from the
request's generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SmoothcertError

MODES = ("column", "block", "pixels")


@dataclass(frozen=True)
class Ablation:
    """One ablation scheme: ``mode`` (:data:`MODES`), ``size`` b (band width or block side;
    unused for ``pixels``) and ``keep`` k (pixels kept; used only for ``pixels``)."""

    mode: str
    size: int = 0
    keep: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise SmoothcertError(f"ablation mode must be one of {', '.join(MODES)}, "
                                  f"got {self.mode!r}")
        wanted = "keep" if self.mode == "pixels" else "size"
        value = getattr(self, wanted)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SmoothcertError(f"ablation mode {self.mode!r} needs {wanted} >= 1, "
                                  f"got {value!r}")

    def check(self, shape) -> None:
        """Refuse a scheme that does not fit an input of ``shape`` (C, H, W): a band wider than
        the image, a block larger than it, more pixels kept than it has."""
        _, h, w = (int(s) for s in shape)
        if self.mode == "column" and self.size > w:
            raise SmoothcertError(f"a band of {self.size} columns is wider than the image "
                                  f"({w} columns)")
        if self.mode == "block" and self.size > min(h, w):
            raise SmoothcertError(f"a {self.size}x{self.size} block does not fit a {h}x{w} image")
        if self.mode == "pixels" and self.keep > h * w:
            raise SmoothcertError(f"keep={self.keep} is more than the image's {h * w} pixels")

    def positions(self, shape) -> int:
        """How many band (W) or block (H·W) positions a sweep visits; pixels have none."""
        _, h, w = (int(s) for s in shape)
        if self.mode == "pixels":
            raise SmoothcertError("pixel ablation is random: it has no positions to sweep")
        return w if self.mode == "column" else h * w

    def sweep_masks(self, shape, start: int, count: int, device=None) -> torch.Tensor:
        """(count, H, W) bool: the kept pixels of positions start, …, start + count − 1."""
        return self.masks_at(shape, torch.arange(start, start + count, device=device))

    def masks_at(self, shape, pos: torch.Tensor) -> torch.Tensor:
        """(len(pos), H, W) bool: the kept pixels of each band or block position in ``pos``
        (a column band starts at column p; a block at row p // W, column p % W; both wrap),
        built for every position at once (no host synchronisation per mask on a GPU)."""
        _, h, w = (int(s) for s in shape)
        count, device = pos.shape[0], pos.device
        cols = torch.arange(w, device=device)
        col_in = (cols[None, :] - (pos % w)[:, None]) % w < self.size  # (count, W)
        if self.mode == "column":
            return col_in[:, None, :].expand(count, h, w)
        rows = torch.arange(h, device=device)
        row_in = (rows[None, :] - (pos // w)[:, None]) % h < self.size  # (count, H)
        return row_in[:, :, None] & col_in[:, None, :]

    def random_masks(self, count: int, shape, generator: torch.Generator | None = None,
                     device=None) -> torch.Tensor:
        """(count, H, W) bool masks drawn from ``generator``: a uniform band or block position,
        or ``keep`` pixels uniformly without replacement."""
        _, h, w = (int(s) for s in shape)
        if self.mode != "pixels":
            pos = torch.randint(self.positions(shape), (count,), generator=generator,
                                device=device)
            return self.masks_at(shape, pos)
        scores = torch.rand((count, h * w), generator=generator, device=device)
        kept = scores.topk(self.keep, dim=1).indices
        mask = torch.zeros((count, h * w), dtype=torch.bool, device=device)
        return mask.scatter_(1, kept, True).view(count, h, w)


def ablate_(out: torch.Tensor, x: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """``out`` (B, C, H, W) ← x (C, H, W, or B×) where the mask (B, H, W) keeps, NaN elsewhere."""
    out.copy_(x.expand_as(out) if x.dim() == out.dim() - 1 else x)
    return out.masked_fill_(~masks[:, None, :, :].to(out.device), float("nan"))


class Sweep:
    """The engine's stand-in for a noise that visits every position of ``ablation`` once, in
    order: the k-th ablated copy of an input is position k. One object per request (it keeps a
    cursor), and no generator is read, so a sweep's counts do not depend on the seed."""

    def __init__(self, ablation: Ablation):
        self.ablation, self.cursor = ablation, 0

    def perturb_(self, out: torch.Tensor, x: torch.Tensor, generator=None) -> torch.Tensor:
        masks = self.ablation.sweep_masks(x.shape, self.cursor, out.shape[0], out.device)
        self.cursor += out.shape[0]
        return ablate_(out, x, masks)


class RandomAblation:
    """The engine's stand-in for a noise that ablates at random (training, ℓ0 certification):
    each copy draws its mask from the request's generator."""

    def __init__(self, ablation: Ablation):
        self.ablation = ablation

    def perturb_(self, out: torch.Tensor, x: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        masks = self.ablation.random_masks(out.shape[0], x.shape[-3:], generator, out.device)
        return ablate_(out, x, masks)


NO_NOISE = "none"
"""The noise a run's identity names when its certifier draws none (``uses_noise`` False: the
ablation certifier), with σ = 0."""


class NoNoise:
    """The run's noise object when its certifier draws no noise: accepts every input and draws
    nothing (a program of such a certifier yields :class:`Sweep` or :class:`RandomAblation`)."""

    norm = None

    def check_input(self, x: torch.Tensor) -> None:
        return None

    def scalar_sigma(self) -> float:
        return 0.0

    def perturb_(self, out, x, generator=None):
        raise SmoothcertError("this run draws no noise: its certifier ablates instead")
