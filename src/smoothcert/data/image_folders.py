"""Streamed image-folder datasets: ``imagenet`` and any user ``imagefolder``.

A folder dataset is torchvision's ImageFolder layout under ``--data-root``::

    ROOT/train/<class>/*.{jpg,jpeg,png,...}
    ROOT/val/<class>/...      (or ROOT/test/<class>/...)

Classes are the sub-folder names in sorted order, label c the c-th of them, as every reference
implementation builds ImageNet (torchvision ``ImageFolder`` on the wnid folders). Only the file
list is held in memory; each image is decoded when it is read (:meth:`FolderDataset.__getitem__`),
so a :class:`torch.utils.data.DataLoader` with workers streams any split of any size.

What the scan refuses, each with one line naming the file or folder: a symbolic link whose target
is missing where a class folder or an image file would be (skipping it would drop an image, or
a whole class and shift every later label), and a class folder whose name holds a control
character (:func:`smoothcert.errors.check_plain_name`: class names go into checkpoints, tables
and pages). Paths in messages are escaped (:func:`smoothcert.errors.printable`).

Large images: PIL refuses to open an image of more than 2 × ``PIL.Image.MAX_IMAGE_PIXELS``
pixels (178,956,970 by default, about 13,377²; its guard against decompression bombs), which
becomes one error naming the file and its pixel count, raised when the image is read; resize
the image. The limit is PIL's, read when each image is opened: smoothcert never raises it, and
a Python user who trusts their files may. Between ``MAX_IMAGE_PIXELS`` and twice it PIL decodes
the image and warns (``DecompressionBombWarning``); the image is a user's own data and is
decoded exactly as PIL decodes it, so that warning is silenced while an example is read rather
than printed in the middle of a run.

Transforms keep pixels in [0, 1] (``ToTensor``); the normalization is the model's first layer:

- evaluation: ``Resize(⌊S·8/7⌉)`` + ``CenterCrop(S)``: Resize(256) + CenterCrop(224) for
  ImageNet, as Cohen et al.'s ``datasets.py`` ``_imagenet`` test transform;
- training: ``RandomResizedCrop(S)`` + ``RandomHorizontalFlip()`` (Cohen et al.'s train
  transform), with the randomness of example ``idx`` drawn from a generator seeded from
  (run seed, epoch, idx), so that a resumed run decodes the same crops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import SmoothcertError, check_count, check_plain_name, printable
from ..rng import derived_seed
from .registry import SPLITS, DatasetSpec, register_folder_dataset

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# Folder names of the evaluation split, in the order they are looked for.
EVAL_FOLDERS = ("val", "test")
IMAGENET_CLASSES = 1000
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DEFAULT_IMAGE_SIZE = 224
# RandomResizedCrop's defaults (torchvision): area fraction and aspect-ratio range, 10 tries.
CROP_SCALE, CROP_RATIO, CROP_TRIES = (0.08, 1.0), (3 / 4, 4 / 3), 10


def eval_resize(image_size: int) -> int:
    """The shorter side before the center crop: S·8/7 rounded (224 → 256, 32 → 37)."""
    return int(math.floor(image_size * 8 / 7 + 0.5))


@dataclass(frozen=True)
class FolderDataset(torch.utils.data.Dataset):
    """One split of an image folder: ``samples`` ((path, label), ...) and ``classes`` in label
    order; item i is (pixels (3, S, S) float32 in [0, 1], label int).

    ``augment_seed`` = (run seed, epoch) switches to the training transform, drawn from
    (run seed, epoch, idx); ``None`` is the deterministic evaluation transform.
    """

    spec: DatasetSpec
    split: str
    folder: Path
    classes: tuple[str, ...]
    samples: tuple[tuple[str, int], ...]
    image_size: int
    augment_seed: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[idx]
        with large_images_quiet():
            image = _decode(path)
            if self.augment_seed is None:
                return _eval_transform(image, self.image_size), label
            gen = torch.Generator().manual_seed(derived_seed(*self.augment_seed, idx))
            return _train_transform(image, self.image_size, gen), label

    # The interface of data.ImageDataset that the runner and the trainer use.
    name = property(lambda self: self.spec.name)
    num_classes = property(lambda self: self.spec.num_classes)
    input_shape = property(lambda self: self.spec.input_shape)
    device = property(lambda self: torch.device("cpu"))
    # ``classes`` as a tuple, and the segmentation "background" label (see data/registry.py).
    class_names = property(lambda self: self.spec.class_names)
    background_index = property(lambda self: self.spec.background_index)

    @property
    def labels(self) -> torch.Tensor:
        """(N,) int64, from the file list (no image is decoded)."""
        return torch.tensor([label for _, label in self.samples], dtype=torch.int64)

    def to(self, device) -> FolderDataset:
        """Itself: images are decoded on the host; :meth:`batch` moves them."""
        return self

    def example(self, idx: int) -> tuple[torch.Tensor, int]:
        return self[int(idx)]

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pixels (B, 3, S, S) and labels (B,) at ``indices``, on the indices' device."""
        items = [self[int(i)] for i in indices.tolist()]
        x = torch.stack([item[0] for item in items]).to(indices.device)
        y = torch.tensor([item[1] for item in items], dtype=torch.int64, device=indices.device)
        return x, y

    def subset(self, indices: torch.Tensor) -> FolderDataset:
        samples = tuple(self.samples[int(i)] for i in indices.tolist())
        return dataclasses.replace(self, samples=samples)

    def data_files(self) -> dict:
        """The split's folder, its class count and image files (not each file: there may be
        millions), for run manifests."""
        return {"folder": str(self.folder.resolve()), "classes": len(self.classes),
                "image_files": len(self.samples)}

    def augmented(self, seed: int, epoch: int) -> FolderDataset:
        """The same examples under the training transform of epoch ``epoch``."""
        return dataclasses.replace(self, augment_seed=(int(seed), int(epoch)))


def open_folder(spec: DatasetSpec, split: str, data_root, image_size: int | None) -> FolderDataset:
    """Scan split ``split`` ("train", or "test" = ``val/`` or ``test/``) of the folder dataset
    ``spec`` under ``data_root``; every problem is one SmoothcertError naming the folder."""
    if data_root is None:
        raise SmoothcertError(f"{spec.name} reads image folders: pass --data-root pointing to a "
                              "folder with train/ and val/ sub-folders of class folders")
    size = _image_size(spec, image_size)
    folder = _split_folder(Path(data_root).expanduser(), split, spec.name)
    classes = _class_folders(folder)
    if spec.num_classes and len(classes) != spec.num_classes:
        raise SmoothcertError(f"{printable(folder)} has {len(classes)} class folders, "
                              f"{spec.name} has {spec.num_classes}; check --data-root")
    samples = tuple(_samples(folder, classes))
    spec = dataclasses.replace(spec, num_classes=len(classes), input_shape=(3, size, size),
                               class_names=tuple(classes))
    return FolderDataset(spec, split, folder, tuple(classes), samples, size)


def _image_size(spec: DatasetSpec, image_size: int | None) -> int:
    """The side S of the inputs; S² must stay within PIL's limit (the crop is an S×S image)."""
    from PIL import Image

    if image_size is None:
        return spec.input_shape[1]
    check_count("image size", image_size)
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and image_size**2 > 2 * limit:
        raise SmoothcertError(f"--image-size {image_size} makes {image_size**2:,}-pixel inputs, "
                              f"more than the {2 * limit:,} that PIL crops; choose a smaller size")
    if spec.name == "imagenet" and image_size != DEFAULT_IMAGE_SIZE:
        raise SmoothcertError(f"imagenet is evaluated at {DEFAULT_IMAGE_SIZE}×"
                              f"{DEFAULT_IMAGE_SIZE}; use --dataset imagefolder for another size")
    return image_size


def _split_folder(root: Path, split: str, name: str,
                  layout: str = "<class>/<image files>") -> Path:
    """The folder of ``split`` under ``root``; ``layout`` is what the error says it should hold."""
    if not root.is_dir():
        raise SmoothcertError(f"--data-root {printable(root)} is not a folder")
    if split not in SPLITS:
        raise SmoothcertError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    names = ("train",) if split == "train" else EVAL_FOLDERS
    for sub in names:
        if (root / sub).is_dir():
            return root / sub
    wanted = " or ".join(f"{sub}/" for sub in names)
    raise SmoothcertError(f"{printable(root)} has no {wanted} folder; {name} needs "
                          f"{printable(root)}/{names[0]}/{layout}")


def _class_folders(folder: Path) -> list[str]:
    """The names of the class folders of ``folder`` (hidden ones left out), sorted; a dangling
    link or a name with a control character is one error."""
    classes = []
    for entry in listing(folder):
        if entry.name.startswith("."):
            continue
        check_link(entry)  # a dangling link here may be a missing class: every label would shift
        if entry.is_dir():
            classes.append(check_plain_name(entry.name, f"{printable(folder)} has the class "
                                            "folder", "rename the folder"))
    if not classes:
        raise SmoothcertError(f"{printable(folder)} has no class folders; the split is empty")
    return sorted(classes)


def _samples(folder: Path, classes: list[str]):
    """(path, label) of every image file, classes in label order, files sorted by name."""
    for label, name in enumerate(classes):
        files = image_files(folder / name)
        if not files:
            raise SmoothcertError(f"class folder {printable(folder / name)} holds no image files "
                                  f"({', '.join(IMAGE_EXTENSIONS)}); remove it or add images")
        yield from ((path, label) for path in files)


def listing(folder: Path) -> list[os.DirEntry]:
    """The entries of ``folder``; a folder that cannot be listed is one error."""
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError as err:
        raise SmoothcertError(f"cannot list {printable(folder)} "
                              f"({printable(err.strerror or err)})") from err


def check_link(entry: os.DirEntry) -> None:
    """Refuse a symbolic link whose target is missing (or cannot be reached), naming it: a scan
    that skipped it would leave the example out without a word."""
    if entry.is_symlink() and not os.path.exists(entry.path):
        raise SmoothcertError(f"{printable(entry.path)} is a symbolic link to "
                              f"{printable(os.readlink(entry.path))}, which does not exist or "
                              "cannot be reached; fix or remove the link")


def image_files(folder: Path) -> list[str]:
    """The paths of the image files (by extension, :data:`IMAGE_EXTENSIONS`) in ``folder``,
    sorted; a dangling link with such a name is one error (:func:`check_link`)."""
    files = []
    for entry in listing(folder):
        if entry.name.lower().endswith(IMAGE_EXTENSIONS):
            check_link(entry)
            if entry.is_file():
                files.append(entry.path)
    return sorted(files)


@contextlib.contextmanager
def large_images_quiet():
    """PIL's ``DecompressionBombWarning`` silenced (for images between ``MAX_IMAGE_PIXELS`` and
    twice it, which PIL decodes; see the module's docstring). Beyond twice it PIL raises, and
    :func:`open_image` turns that into one error."""
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield


@contextlib.contextmanager
def open_image(path: str, what: str, resize: str = "resize it"):
    """``PIL.Image.open(path)`` as a context: an image over PIL's pixel limit (then ``resize``
    says how to fix it), a corrupt or an unreadable file, is one SmoothcertError naming ``what``
    (image, mask) and its path; a SmoothcertError of the body passes unchanged."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            yield image
    except SmoothcertError:
        raise
    except Image.DecompressionBombError as err:
        found = re.search(r"\((\d+) pixels\)", str(err))
        pixels = f"{int(found.group(1)):,} pixels" if found else "too many pixels"
        limit = 2 * (Image.MAX_IMAGE_PIXELS or 0)
        raise SmoothcertError(
            f"{what} {printable(path)} has {pixels}, more than the {limit:,} that PIL opens "
            f"(its guard against decompression bombs, 2 × PIL.Image.MAX_IMAGE_PIXELS): "
            f"{resize}, then rerun the same command to resume") from None
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as err:
        raise SmoothcertError(f"cannot decode {what} {printable(path)} ({printable(err)}); "
                              "replace or remove the file, then rerun the same command to "
                              "resume") from err


def _decode(path: str, resize: str = "resize it"):
    """The image at ``path`` as 8-bit RGB (PIL); a corrupt, unreadable or too large file is one
    error (:func:`open_image`)."""
    with open_image(path, "image", resize) as image:
        return image.convert("RGB")


def _eval_transform(image, size: int) -> torch.Tensor:
    import torchvision.transforms.functional as TF

    image = TF.center_crop(TF.resize(image, eval_resize(size)), size)
    return TF.to_tensor(image)


def _train_transform(image, size: int, gen: torch.Generator) -> torch.Tensor:
    """RandomResizedCrop(size) + RandomHorizontalFlip() as torchvision draws them, from ``gen``."""
    import torchvision.transforms.functional as TF

    top, left, h, w = _crop_box(image.height, image.width, gen)
    image = TF.resized_crop(image, top, left, h, w, [size, size])
    if torch.rand(1, generator=gen) < 0.5:  # RandomHorizontalFlip's draw
        image = TF.hflip(image)
    return TF.to_tensor(image)


def _crop_box(height: int, width: int, gen: torch.Generator) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` draw for draw (the same float32 draws in
    the same order, from ``gen`` instead of the global generator): area fraction uniform in
    CROP_SCALE, log-aspect uniform in log CROP_RATIO, up to CROP_TRIES tries, else the central
    crop of the clamped aspect ratio. Returns (top, left, h, w)."""
    area = height * width
    log_ratio = torch.log(torch.tensor(CROP_RATIO))  # float32, as torchvision
    for _ in range(CROP_TRIES):
        target = area * torch.empty(1).uniform_(*CROP_SCALE, generator=gen).item()
        ratio = torch.exp(torch.empty(1).uniform_(
            float(log_ratio[0]), float(log_ratio[1]), generator=gen)).item()
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,), generator=gen))
            left = int(torch.randint(0, width - w + 1, size=(1,), generator=gen))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < CROP_RATIO[0]:
        w, h = width, int(round(width / CROP_RATIO[0]))
    elif in_ratio > CROP_RATIO[1]:
        h, w = height, int(round(height * CROP_RATIO[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


register_folder_dataset(
    "imagenet", num_classes=IMAGENET_CLASSES, image_size=DEFAULT_IMAGE_SIZE,
    mean=IMAGENET_MEAN, std=IMAGENET_STD, opener=open_folder)
# Any user folder: the class count comes from the folder; ImageNet's statistics in the
# normalization layer, as for the ImageNet-pretrained models users fine-tune on their folders.
register_folder_dataset(
    "imagefolder", num_classes=0, image_size=DEFAULT_IMAGE_SIZE,
    mean=IMAGENET_MEAN, std=IMAGENET_STD, opener=open_folder)
