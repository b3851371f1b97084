"""Input encodings: a classifier's first layer when its inputs are not plain images.

Ablation smoothing (Levine & Feizi, NeurIPS 2020 "(De)Randomized Smoothing for Certifiable
Defense against Patch Attacks", AAAI 2020 "Robustness Certificates for Sparse Adversarial Attacks
by Randomized Ablation") shows the base classifier images whose ablated pixels are NaN in pixel
space (:mod:`smoothcert.smoothing.ablation`). :class:`AblationEncoding` turns such an image of C
channels into the authors' 2C channels: a kept value x becomes the pair (x, 1 − x) and an ablated
one (0, 0), so that "ablated" differs from every kept value, black (0, 1) and white (1, 0)
included. ``build_model(..., input_encoding="ablation")`` puts it in front of the
``NormalizeLayer`` (:mod:`smoothcert.models.archs`); a model without it turns NaN into NaN
logits, which the engine refuses.

:data:`ENCODINGS` maps an encoding's name (what a checkpoint's ``meta["input_encoding"]``
records) to its layer; each layer says how many channels it makes of C (``out_channels``) and
the normalization statistics of those channels (``normalization``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..registry import Registry

ENCODINGS: Registry = Registry("input encoding")


@ENCODINGS.register("ablation")
class AblationEncoding(nn.Module):
    """(B, C, H, W) pixels in [0, 1], NaN where ablated → (B, 2C, H, W): channels 0..C−1 hold
    x where kept and 0 where ablated, channels C..2C−1 hold 1 − x where kept and 0 where ablated
    (the authors' ``torch.cat((out_c1, out_c2), 1)`` order). Stateless: no weights, no buffers.

    Gradients flow to the kept values (∂/∂x of the pair is (1, −1)) and are 0 at ablated
    ones; the NaN never reaches the arithmetic (``torch.where`` picks 0 there)."""

    @staticmethod
    def out_channels(channels: int) -> int:
        return 2 * channels

    @staticmethod
    def normalization(mean: Sequence[float],
                      std: Sequence[float]) -> tuple[list[float], list[float]]:
        """Means and stds of the 2C encoded channels from the dataset's C: (m, s) for the x
        channels, (1 − m, s) for the 1 − x channels, so a kept pixel normalises to (z, −z),
        z = (x − m)/s, as the image would.

        Normalizing is an affine bijection per channel, so it keeps all the encoding's
        information, and ablated stays apart from kept: an ablated pixel normalises to
        (−m/s, (m − 1)/s), whose two values sum to −1/s ≠ 0, while every kept pixel's sum to 0.
        """
        return [float(m) for m in mean] + [1.0 - float(m) for m in mean], \
            [float(s) for s in std] * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = ~torch.isnan(x)
        zero = x.new_zeros(())
        return torch.cat((torch.where(kept, x, zero), torch.where(kept, 1.0 - x, zero)), dim=1)
