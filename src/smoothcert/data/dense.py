"""Dense tasks derived from Fashion-MNIST: ``fashion-mnist-seg`` and ``fashion-mnist-box``.

Both read the Fashion-MNIST IDX files through the ``fashion-mnist`` loader (same folders, same
--data-root, same errors) and derive their labels deterministically from each image's pixels and
class, so they need no files of their own and every derived label can be checked against its
image:

- ``fashion-mnist-seg`` (segmentation, 11 classes): pixel value v (uint8) > :data:`THRESHOLD`
  is the item's, labelled with its class + 1; v = 0 is background, 0; the faint band
  0 < v ≤ :data:`THRESHOLD` is unlabelled, :data:`IGNORE_INDEX` (255).
- ``fashion-mnist-box`` (regression, 4 outputs): the tight bounding box of the item's pixels
  (v > :data:`THRESHOLD`), float32 (x_min, y_min, x_max, y_max) in pixel-edge coordinates:
  pixel (row r, column c) covers [c, c + 1) × [r, r + 1), so x_min is the first column holding
  an item pixel and x_max the last one + 1 (torchvision's and COCO's x1 y1 x2 y2 convention);
  0 ≤ x_min < x_max ≤ 28.

Why 25 and a band. Fashion-MNIST's background is exactly 0 (half of all pixels); the items are
anti-aliased, so their outlines fade through small values before it, and dark garments have faint
interiors. In the 10,000 test images the counts of the values 1..9 fall from 80k to 8k and stay
near 7-8k per value from 10 on, the level of the items' own dark pixels; v > 25 (x > 0.098 once
divided by 255, about 0.1) keeps the items' bodies (45.4 % of test pixels, at least 53 per
image; 30 in the train split) and leaves the fringe (4.6 %) to the band. Labelling the fringe
either way would be arbitrary, so it is left out of losses and metrics, as Pascal VOC marks
its objects' outlines 255. Normalization is Fashion-MNIST's (the images are the same).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import SmoothcertError
from .formats import FASHION_MNIST_NAMES
from .registry import DATASETS, register_dataset

THRESHOLD = 25
"""A pixel is the item's when its uint8 value exceeds this (see the module's docstring)."""
IGNORE_INDEX = 255
"""The label of the faint band 0 < v ≤ THRESHOLD in ``fashion-mnist-seg``."""
SEG_CLASSES = 11  # background + Fashion-MNIST's 10 classes
SEG_CLASS_NAMES = ("background", *FASHION_MNIST_NAMES)  # label c + 1 is the item's class c
BOX_OUTPUTS = 4  # x_min, y_min, x_max, y_max
_MEAN, _STD = (0.2860,), (0.3530,)  # fashion-mnist's (formats.py)


def segmentation_masks(images: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """Per-pixel labels (N, H, W) uint8 of uint8 images (N, 1, H, W) with classes (N,): class + 1
    where v > THRESHOLD, 0 where v = 0, IGNORE_INDEX in between."""
    values = images[:, 0]
    item = (classes.to(torch.uint8) + 1).view(-1, 1, 1).expand_as(values)
    masks = torch.where(values > THRESHOLD, item, torch.zeros_like(item))
    return masks.masked_fill((values > 0) & (values <= THRESHOLD), IGNORE_INDEX)


def item_boxes(images: torch.Tensor) -> torch.Tensor:
    """The tight box (N, 4) float32 (x_min, y_min, x_max, y_max), pixel edges, of the pixels
    v > THRESHOLD of each uint8 image (N, 1, H, W); an image without one is refused."""
    item = images[:, 0] > THRESHOLD
    cols, rows = item.any(dim=1), item.any(dim=2)  # (N, W), (N, H)
    empty = ~cols.any(dim=1)
    if bool(empty.any()):
        first = int(empty.nonzero()[0])
        raise SmoothcertError(f"image {first} has no pixel above {THRESHOLD}: its item has no "
                              "bounding box; check that --data-root holds Fashion-MNIST files")
    (x_min, x_max), (y_min, y_max) = _span(cols), _span(rows)
    return torch.stack([x_min, y_min, x_max, y_max], dim=1).to(torch.float32)


def _span(present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first index, last index + 1) of the True entries of each row of ``present`` (N, L)."""
    length = present.shape[1]
    first = present.to(torch.uint8).argmax(dim=1)  # argmax returns the first maximum
    last = length - 1 - present.flip(1).to(torch.uint8).argmax(dim=1)
    return first, last + 1


def _fashion_mnist(split: str, data_root: Path | None, download: bool):
    """``fashion-mnist``'s loader: (images uint8 (N, 1, 28, 28), classes (N,), scale, files)."""
    return DATASETS["fashion-mnist"].loader(split, data_root, download)


@register_dataset("fashion-mnist-seg", num_classes=SEG_CLASSES, input_shape=(1, 28, 28),
                  mean=_MEAN, std=_STD, task="segmentation", ignore_index=IGNORE_INDEX,
                  class_names=SEG_CLASS_NAMES)
def _load_fashion_mnist_seg(split: str, data_root: Path | None, download: bool):
    images, classes, scale, *read = _fashion_mnist(split, data_root, download)
    return (images, segmentation_masks(images, classes), scale, *read)


@register_dataset("fashion-mnist-box", num_classes=BOX_OUTPUTS, input_shape=(1, 28, 28),
                  mean=_MEAN, std=_STD, task="regression")
def _load_fashion_mnist_box(split: str, data_root: Path | None, download: bool):
    images, _, scale, *read = _fashion_mnist(split, data_root, download)
    return (images, item_boxes(images), scale, *read)
