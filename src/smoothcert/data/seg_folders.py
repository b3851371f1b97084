"""Streamed segmentation folders: ``segfolder``, images and their PNG masks side by side,
VOC-style, under ``--data-root``::

    ROOT/classes.txt                     one class name per line: line i (from 0) names class i
    ROOT/train/images/NAME.{jpg,png,...}
    ROOT/train/masks/NAME.png            the mask of images/NAME.*: same NAME, same size
    ROOT/val/...                         (or ROOT/test/...), laid out as train/

A mask is an 8-bit PNG, grey (mode L) or palette (mode P, as Pascal VOC's ``SegmentationClass``
files, whose palette indices are the class ids): value c < K is class c (K = the lines of
``classes.txt``, at most 255), 255 is an unlabelled pixel (the dataset's ``ignore_index``, VOC's
object outlines); any other value is refused when the mask is read. Every image needs its mask
(a missing one is refused when the folder is scanned); masks without an image are not read.

``classes.txt`` is UTF-8 (a byte-order mark is dropped), lines end with ``\n``, ``\r\n`` or
``\r`` (no other character ends a line: a name holding one would shift every later id), and
a name is stripped of surrounding white space. A name holding a control character (terminal
escapes, NUL, line breaks, bidi controls) is refused with its line number, the name quoted
escaped (:func:`smoothcert.errors.check_plain_name`): class names go into checkpoints, tables
and pages. The class named "background" (any case), VOC's class 0, is the dataset's
``background_index`` (:mod:`.registry`).

As in ``imagefolder``, a dangling symbolic link where an image or its mask would be is refused
when the folder is scanned, and an image or a mask beyond PIL's pixel limit is one error when
it is read (:mod:`.image_folders`: resize both alike).

Like ``imagefolder`` (:mod:`.image_folders`, whose pieces this module reuses) only the file list
is held in memory, images are RGB pixels in [0, 1] at ``--image-size`` S (default 224) with
ImageNet's statistics in the model's normalization layer, and the geometry is the same:
evaluation ``Resize(⌊S·8/7⌉)`` + ``CenterCrop(S)``, training ``RandomResizedCrop(S)`` +
``RandomHorizontalFlip()`` drawn from (run seed, epoch, idx). The mask goes through the very
same resize, crop and flip with nearest-neighbour sampling, so every label stays a class id
(never a blend of two) and stays on its pixel.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import SmoothcertError, check_plain_name, printable
from ..rng import derived_seed
from .image_folders import (
    DEFAULT_IMAGE_SIZE,
    IMAGE_EXTENSIONS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    FolderDataset,
    _crop_box,
    _decode,
    _eval_transform,
    _image_size,
    _split_folder,
    check_link,
    eval_resize,
    image_files,
    large_images_quiet,
    listing,
    open_image,
)
from .registry import DatasetSpec, register_folder_dataset

IGNORE_INDEX = 255
CLASSES_FILE = "classes.txt"
MASK_MODES = ("L", "P")  # 8-bit grey values or palette indices: the class ids themselves
LAYOUT = "images/<NAME>.<ext> and masks/<NAME>.png"
RESUME_HINT = "replace or remove the file, then rerun the same command to resume"
RESIZE_HINT = "resize the image and its mask alike (the mask nearest-neighbour)"


@dataclass(frozen=True)
class SegFolderDataset(FolderDataset):
    """One split of a segmentation folder: ``samples`` ((image path, mask path), ...) and
    ``classes`` in label order; item i is (pixels (3, S, S) float32 in [0, 1], labels (S, S)
    int64 in [0, K) or 255). ``augment_seed`` as :class:`FolderDataset`'s."""

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        image_path, mask_path = self.samples[idx]
        with large_images_quiet():
            image = _decode(image_path, RESIZE_HINT)
            mask = _decode_mask(mask_path, image.size, len(self.classes), image_path)
            if self.augment_seed is None:
                return _eval_pair(image, mask, self.image_size)
            gen = torch.Generator().manual_seed(derived_seed(*self.augment_seed, idx))
            return _train_pair(image, mask, self.image_size, gen)

    @property
    def labels(self) -> torch.Tensor:
        """(N, S, S) int64: every mask decoded under the evaluation transform (slow on a large
        folder: it reads every mask)."""
        return torch.stack([self[i][1] for i in range(len(self))])

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pixels (B, 3, S, S) and labels (B, S, S) at ``indices``, on the indices' device."""
        items = [self[int(i)] for i in indices.tolist()]
        x = torch.stack([item[0] for item in items]).to(indices.device)
        return x, torch.stack([item[1] for item in items]).to(indices.device)


def open_seg_folder(spec: DatasetSpec, split: str, data_root,
                    image_size: int | None) -> SegFolderDataset:
    """Scan split ``split`` ("train", or "test" = ``val/`` or ``test/``) of the segmentation
    folder under ``data_root``; every problem is one SmoothcertError naming the file or folder."""
    if data_root is None:
        raise SmoothcertError(f"{spec.name} reads a segmentation folder: pass --data-root "
                              f"pointing to a folder with {CLASSES_FILE}, train/ and val/, each "
                              f"split holding {LAYOUT}")
    size = _image_size(spec, image_size)
    root = Path(data_root).expanduser()
    folder = _split_folder(root, split, spec.name, LAYOUT)
    classes = read_classes(root / CLASSES_FILE)
    samples = tuple(_pairs(folder))
    spec = dataclasses.replace(spec, num_classes=len(classes), input_shape=(3, size, size),
                               class_names=classes)
    return SegFolderDataset(spec, split, folder, classes, samples, size)


def read_classes(path: Path) -> tuple[str, ...]:
    """The class names of ``classes.txt``, line i naming class id i (blank lines at the end are
    ignored); 2 to 255 distinct, non-empty names without a control character (see the
    module's docstring)."""
    shown = printable(path)
    names = [line.strip() for line in _class_lines(path)]
    while names and not names[-1]:
        names.pop()
    if "" in names:
        raise SmoothcertError(f"{shown} line {names.index('') + 1} is blank: every line up to "
                              "the last names one class (its line number − 1 is its id)")
    for line, name in enumerate(names, start=1):
        check_plain_name(name, f"{shown} line {line} names class", "edit that line")
    if not 2 <= len(names) <= IGNORE_INDEX:
        raise SmoothcertError(f"{shown} names {len(names)} classes; a segmentation folder needs "
                              f"2 to {IGNORE_INDEX} (mask value {IGNORE_INDEX} is unlabelled)")
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise SmoothcertError(f"{shown} names class {twice[0]!r} twice; class names are "
                              "distinct")
    return tuple(names)


def _class_lines(path: Path) -> list[str]:
    """The lines of ``classes.txt``: split at ``\n`` only (text mode has made ``\r\n`` and
    ``\r`` one), not at the other characters ``str.splitlines`` ends lines at (``\x0c``,
    ``\x1c``, ``\x85``, ``\u2028``, ...), which are refused inside a name instead."""
    try:
        return path.read_text(encoding="utf-8-sig").split("\n")
    except FileNotFoundError:
        if path.is_symlink():
            raise SmoothcertError(f"{printable(path)} is a symbolic link to "
                                  f"{printable(os.readlink(path))}, which does not exist; fix "
                                  "or remove the link") from None
        raise SmoothcertError(f"{printable(path)} not found: a segmentation folder names its "
                              "classes there, one per line, line i naming class id i of the "
                              "masks") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SmoothcertError(f"cannot read {printable(path)} ({printable(err)})") from err


def _pairs(folder: Path):
    """(image path, mask path) of every image in ``folder/images``, sorted by file name; a
    dangling link for an image or its mask is one error."""
    images, masks = folder / "images", folder / "masks"
    for sub in (images, masks):
        if not sub.is_dir():
            raise SmoothcertError(f"{printable(folder)} has no {sub.name}/ folder; a "
                                  f"segmentation split holds {LAYOUT}")
    files = image_files(images)
    if not files:
        raise SmoothcertError(f"{printable(images)} holds no image files "
                              f"({', '.join(IMAGE_EXTENSIONS)})")
    mask_entries = {entry.name: entry for entry in listing(masks)}
    stems = [Path(path).stem for path in files]
    counts = Counter(stems)
    for path, stem in zip(files, stems):
        if counts[stem] > 1:
            raise SmoothcertError(f"{printable(images)} holds several images named {stem!r} "
                                  f"(one mask {printable(stem)}.png cannot serve them all); "
                                  "rename or remove one")
        mask = mask_entries.get(f"{stem}.png")
        if mask is not None:
            check_link(mask)
        if mask is None or not mask.is_file():
            raise SmoothcertError(f"image {printable(path)} has no mask "
                                  f"{printable(masks / (stem + '.png'))}; add it or remove the "
                                  "image")
    return [(path, str(masks / f"{stem}.png")) for path, stem in zip(files, stems)]


def _decode_mask(path: str, size: tuple[int, int], num_classes: int, image_path: str):
    """The mask at ``path`` as an 8-bit grey PIL image of class ids, checked: an L or P PNG of
    ``size`` (W, H), values < ``num_classes`` or 255."""
    from PIL import Image

    with open_image(path, "mask", RESIZE_HINT) as mask:
        mode, mask_size = mask.mode, mask.size
        values = np.array(mask) if mode in MASK_MODES else None
    shown = printable(path)
    if values is None:
        raise SmoothcertError(f"mask {shown} is a {mode} image; a mask holds class ids as 8-bit "
                              f"grey (L) or palette (P) values; {RESUME_HINT}")
    if mask_size != size:
        raise SmoothcertError(f"mask {shown} is {mask_size[0]}×{mask_size[1]} but its image "
                              f"{printable(image_path)} is {size[0]}×{size[1]}; {RESUME_HINT}")
    bad = values[(values >= num_classes) & (values != IGNORE_INDEX)]
    if bad.size:
        raise SmoothcertError(f"mask {shown} holds value {int(bad[0])}, neither a class id "
                              f"0..{num_classes - 1} nor {IGNORE_INDEX} (unlabelled); "
                              f"{RESUME_HINT}")
    return Image.fromarray(values.astype(np.uint8), mode="L")


def _mask_tensor(mask) -> torch.Tensor:
    return torch.from_numpy(np.array(mask, dtype=np.int64))


def _eval_pair(image, mask, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """imagefolder's evaluation transform of the image; the same resize and crop of the mask,
    nearest-neighbour."""
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    mask = TF.resize(mask, eval_resize(size), interpolation=InterpolationMode.NEAREST)
    return _eval_transform(image, size), _mask_tensor(TF.center_crop(mask, size))


def _train_pair(image, mask, size: int, gen: torch.Generator):
    """imagefolder's training transform of the image, draw for draw (crop box, then the flip's
    draw, from ``gen``); the same crop, resize and flip of the mask, nearest-neighbour."""
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    top, left, h, w = _crop_box(image.height, image.width, gen)
    image = TF.resized_crop(image, top, left, h, w, [size, size])
    mask = TF.resized_crop(mask, top, left, h, w, [size, size],
                           interpolation=InterpolationMode.NEAREST)
    if torch.rand(1, generator=gen) < 0.5:  # RandomHorizontalFlip's draw
        image, mask = TF.hflip(image), TF.hflip(mask)
    return TF.to_tensor(image), _mask_tensor(mask)


# A user's segmentation folder: the class count comes from classes.txt; ImageNet's statistics in
# the normalization layer, as for the ImageNet-pretrained backbones of torchvision's segmenters.
register_folder_dataset(
    "segfolder", num_classes=0, image_size=DEFAULT_IMAGE_SIZE, mean=IMAGENET_MEAN,
    std=IMAGENET_STD, opener=open_seg_folder, task="segmentation", ignore_index=IGNORE_INDEX)
