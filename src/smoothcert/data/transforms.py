"""Training augmentations: batched, on x's device, randomness from an explicit generator.

:data:`AUGMENTATIONS` maps the name a :class:`~smoothcert.data.registry.DatasetSpec` gives
(``augmentation``) to a function of (x (B, C, H, W), generator) -> x; ``none`` and ``crop_flip``
(Cohen et al.'s CIFAR-10 random crop and horizontal flip) are registered here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..registry import Registry

Augmentation = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
AUGMENTATIONS: Registry = Registry("augmentation")
register_augmentation = AUGMENTATIONS.register


def augment(kind: str, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Apply augmentation ``kind`` to a batch x (B, C, H, W); ``generator`` lives on x's device."""
    return AUGMENTATIONS[kind](x, generator)


@register_augmentation("none")
def _identity(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return x


CROP_PADDING = 4  # pixels of zero padding per side, as torchvision RandomCrop(32, padding=4)


@register_augmentation("crop_flip")
def _random_crop_flip(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crop from the zero-padded image, then horizontal flip with probability ½.

    The distribution of torchvision's ``RandomCrop(H, padding=4)`` + ``RandomHorizontalFlip()``
    used by Cohen et al. for CIFAR-10: offsets uniform on {0, …, 8} per axis and sample.
    """
    b, device = x.shape[0], x.device
    top = torch.randint(0, 2 * CROP_PADDING + 1, (b,), generator=generator, device=device)
    left = torch.randint(0, 2 * CROP_PADDING + 1, (b,), generator=generator, device=device)
    flip = torch.rand(b, generator=generator, device=device) < 0.5
    return crop_and_flip(x, top, left, flip, CROP_PADDING)


def crop_and_flip(
    x: torch.Tensor, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor, padding: int
) -> torch.Tensor:
    """Per-sample crops of the zero-padded batch, mirrored where ``flip``; no Python loop.

    x (B, C, H, W); ``top``, ``left`` (B,) int offsets in [0, 2·padding] into the padded image;
    ``flip`` (B,) bool. Output (B, C, H, W): out[i] = padded[i, :, top_i:top_i+H, left_i:left_i+W],
    reversed along W where flip[i].
    """
    b, _, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding)).permute(0, 2, 3, 1)  # (B, H', W', C)
    rows = top[:, None] + torch.arange(h, device=x.device)  # (B, H)
    cols = left[:, None] + torch.arange(w, device=x.device)  # (B, W)
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    batch = torch.arange(b, device=x.device)[:, None, None]
    out = padded[batch, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()
