"""Small models of the dense tasks (:data:`~smoothcert.data.registry.TASKS`), sized for the
1×28×28 sets derived from Fashion-MNIST (:mod:`smoothcert.data.dense`).

- ``fcn_small`` (segmentation): a two-level U-Net-style fully convolutional net, pixels
  (B, C, H, W) → per-pixel logits (B, K, H, W) at the input's resolution.
- ``lenet_box`` (regression): the Caffe LeNet of :mod:`.archs` with D real outputs (B, D) in
  pixels; for a box (D = 4) it starts from the whole image's box.

Both are classifiers by role: :func:`~smoothcert.models.archs.build_model` puts
``NormalizeLayer`` first, so noise and certificates stay in pixel space as for every classifier.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SmoothcertError, check_count
from ..registry import option
from .archs import LeNet, register_model


def _block(cin: int, cout: int) -> nn.Sequential:
    """(conv3×3 → batch norm → ReLU) twice, padded so the size is kept."""
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


class FCNSmall(nn.Module):
    """Encoder at H and H/2, a middle at H/4, decoder back up with the encoder's features
    concatenated (U-Net's skips, Ronneberger et al. 2015), a 1×1 conv to K logits per pixel.

    Widths w, 2w, 4w; max-pool 2 down, bilinear up to the skip's exact size (so odd sizes work:
    7 → 14 → 28 for Fashion-MNIST). Batch normalization after every convolution: without it the
    ten plain layers train slowly under the trainer's SGD at lr 0.1 (120 steps of batch 64 at
    σ = 0.25 reach 58 % noisy pixel accuracy on fashion-mnist-seg, 75 % with it; He init alone
    58 %). In eval mode (certification) it is a fixed affine map per channel, so an input's
    logits do not depend on its batch-mates. About 22M multiply-adds per 28×28 image at w = 16.
    """

    def __init__(self, num_classes: int, channels: int, width: int):
        super().__init__()
        self.enc1 = _block(channels, width)
        self.enc2 = _block(width, 2 * width)
        self.mid = _block(2 * width, 4 * width)
        self.dec2 = _block(4 * width + 2 * width, 2 * width)
        self.dec1 = _block(2 * width + width, width)
        self.head = nn.Conv2d(width, num_classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([_up(m, e2), e2], dim=1))
        d1 = self.dec1(torch.cat([_up(d2, e1), e1], dim=1))
        return self.head(d1)


def _up(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return F.interpolate(x, size=like.shape[-2:], mode="bilinear", align_corners=False)


@dataclasses.dataclass(frozen=True)
class FCNParams:
    width: int = option(16, "channels of the first level; the next two have 2× and 4×")

    def __post_init__(self):
        check_count("width", self.width)


@register_model("fcn_small", params=FCNParams, task="segmentation")
def fcn_small(num_classes: int, input_shape: tuple[int, int, int], *,
              width: int = 16) -> nn.Module:
    """A small fully convolutional segmenter (:class:`FCNSmall`): per-pixel logits (B, K, H, W)
    for any C×H×W with H, W ≥ 4 (two 2× poolings)."""
    c, h, w = input_shape
    if h < 4 or w < 4:
        raise SmoothcertError(f"fcn_small needs inputs of at least 4×4 pixels, got {h}×{w}")
    return FCNSmall(num_classes, c, width)


class LeNetBox(LeNet):
    """:class:`~smoothcert.models.archs.LeNet` as a regressor of D real outputs in pixels, whose
    last bias starts at the whole image's box (0, 0, W, H) when D = 4 (else at 0).

    Why this start, not outputs scaled from fractions of the image: the outputs are trained
    like logits (the trainer's SGD at lr 0.1, Cohen et al.'s defaults), and a scale s on them
    multiplies the last layer's effective step by s² (784 for 28 pixels), which diverges; plain
    pixel outputs starting near 0 must first travel ~14 pixels. Fashion-MNIST's items fill the
    image (mean box (3.2, 2.0, 25.2, 26.2) over the train split, std ~3 pixels), so the whole
    image is a close prior: 80 SGD steps (batch 256, σ = 0.25) reach a noisy-input mean absolute
    error of 0.62 pixels from it, 2.2 from 0 and 13 with the scale (lr 0.1; 0.52, 2.1 and 2.2 at
    lr 0.01). The state dict is LeNet's.
    """

    def __init__(self, outputs: int, input_shape: tuple[int, int, int]):
        super().__init__(outputs, input_shape)
        _, h, w = input_shape
        if outputs == 4:
            with torch.no_grad():
                self.fc2.bias.copy_(torch.tensor([0.0, 0.0, float(w), float(h)]))


@register_model("lenet_box", task="regression")
def lenet_box(num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    """A LeNet regressor of ``num_classes`` real outputs (a box: x_min, y_min, x_max, y_max in
    pixels, starting from the whole image's) for inputs of at least 16×16 pixels
    (:class:`LeNetBox`)."""
    return LeNetBox(num_classes, input_shape)
