"""Whole datasets held in memory as uint8 tensors, batched on their device, and ``digits``.

A dataset is an :class:`ImageDataset`: ``images`` (N, C, H, W) uint8 and ``labels`` (N,) int64,
with ``scale`` mapping stored values to pixels in [0, 1] (``pixel = images.float() * scale``).
:meth:`ImageDataset.batch` returns float32 pixels on the dataset's device, ready for noise.
:func:`load_dataset` reads a split of any dataset in the registry (:mod:`.registry`; the file
readers are in :mod:`.formats`), :func:`balanced_subset` fixes a class-balanced training subset,
and :func:`data_files` describes the files read, for run manifests.

Normalization statistics (per-channel mean and std) belong to the :class:`DatasetSpec` and go into
the model's first layer (``NormalizeLayer``); they are never applied to the data, so noise and
certified radii live in pixel units (Cohen et al. 2019, ``datasets.py``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import SmoothcertError, printable
from ..io import file_sha256
from .formats import DIGIT_NAMES
from .registry import SPLITS, DatasetSpec, dataset_spec, register_dataset

# Files up to this size are fingerprinted by their SHA-256 in a run's manifest (a few ms per
# MiB: every dataset file we read, CIFAR-10's 31 MB batches included); larger ones by size and
# modification time only.
HASHED_FILE_BYTES = 64 << 20


@dataclass(frozen=True)
class ImageDataset:
    """A whole split in memory: ``images`` (N, C, H, W) uint8 and ``labels`` as its spec's task
    has them (:data:`~smoothcert.data.registry.TASKS`): (N,) int64 classes, (N, H, W) uint8
    pixel classes (an eighth of int64's memory: 47 MB for Fashion-MNIST's 60,000 masks; read as
    int64 by :meth:`batch`), or (N, D) float32 outputs.

    Pixels are ``images.float() * scale`` and lie in [0, 1]. All tensors live on one device;
    :meth:`batch` and :meth:`example` return tensors on it.
    """

    spec: DatasetSpec
    split: str
    images: torch.Tensor
    labels: torch.Tensor
    scale: float
    files: tuple = ()
    """The files the split was read from (:func:`describe_files`), for run manifests."""

    def __post_init__(self):
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise SmoothcertError(
                f"{self.spec.name} images must be a uint8 (N, C, H, W) tensor, got "
                f"{self.images.dtype} of shape {tuple(self.images.shape)}"
            )
        dtype, shape = label_layout(self.spec, self.images.shape)
        if self.labels.dtype != dtype or tuple(self.labels.shape) != shape:
            raise SmoothcertError(
                f"{self.spec.name} labels must be a {dtype} tensor of shape {shape}, got "
                f"{self.labels.dtype} {tuple(self.labels.shape)}")

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        """Example ``idx`` (a map-style dataset of (x, y), as torch's ``Dataset``)."""
        return self.example(int(idx))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def num_classes(self) -> int:
        return self.spec.num_classes

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return self.spec.input_shape

    @property
    def class_names(self) -> tuple[str, ...] | None:
        """Label c's name, or None: see :mod:`~smoothcert.data.registry`."""
        return self.spec.class_names

    @property
    def background_index(self) -> int | None:
        """A segmentation set's "background" label, or None: see
        :mod:`~smoothcert.data.registry`."""
        return self.spec.background_index

    @property
    def device(self) -> torch.device:
        return self.images.device

    def to(self, device) -> ImageDataset:
        """A copy with images and labels on ``device``."""
        images, labels = self.images.to(device), self.labels.to(device)
        return dataclasses.replace(self, images=images, labels=labels)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pixels x (B, C, H, W) float32 in [0, 1] and labels y (B,) int64 at ``indices`` (B,).

        Computed as a division by 1/scale, so 8-bit data match torchvision's ``ToTensor``
        (``x.float().div(255)``) bit for bit.
        """
        indices = indices.to(self.device)
        x = self.images[indices].to(torch.float32).div_(1.0 / self.scale)
        y = self.labels[indices]
        return x, y.long() if y.dtype == torch.uint8 else y  # masks: stored as uint8

    def subset(self, indices: torch.Tensor) -> ImageDataset:
        """The examples at ``indices``, as a dataset of their own."""
        indices = indices.to(self.device)
        images, labels = self.images[indices], self.labels[indices]
        return dataclasses.replace(self, images=images, labels=labels)

    def example(self, idx: int) -> tuple[torch.Tensor, int | torch.Tensor]:
        """Example ``idx``: pixels (C, H, W) float32 in [0, 1] and its label (an int; for a
        segmentation or regression set its (H, W) or (D,) tensor)."""
        x, y = self.batch(torch.tensor([idx], dtype=torch.long))
        return x[0], int(y[0]) if self.spec.task == "classification" else y[0]

    def data_files(self) -> dict:
        """``{"files": [...]}``: each file read, see :func:`describe_files`."""
        return {"files": list(self.files)}


def data_files(dataset) -> dict | None:
    """Which data files ``dataset`` was read from, for a run's manifest: ``{"files": [{path,
    bytes, mtime[, sha256]}, ...]}`` for the in-memory datasets, ``{"folder", "classes",
    "image_files"}`` for an image folder; None for a dataset that does not say (a user's own)."""
    describe = getattr(dataset, "data_files", None)
    return describe() if callable(describe) else None


def describe_files(paths) -> tuple[dict, ...]:
    """Each path's resolved location, size in bytes and modification time (UTC, ISO 8601),
    with its SHA-256 when it is at most :data:`HASHED_FILE_BYTES`."""
    described = []
    for path in paths:
        path = Path(path).resolve()
        st = path.stat()
        entry = {"path": str(path), "bytes": st.st_size,
                 "mtime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime))}
        if st.st_size <= HASHED_FILE_BYTES:
            entry["sha256"] = file_sha256(path)
        described.append(entry)
    return tuple(described)


SUBSET_SEED = 0  # seed of the per-class permutations of balanced_subset


def balanced_subset(labels: torch.Tensor, size: int) -> torch.Tensor:
    """Sorted indices of a fixed class-balanced subset of ``size`` examples.

    Each class's indices are permuted by one ``np.random.default_rng(SUBSET_SEED)`` (classes in
    label order); the subset takes the first example of every class, then the second, and so on,
    until it holds ``size``: class counts differ by at most one where the classes allow it. The
    subset depends only on the labels and ``size`` (not on a run's seed), so every run of a study
    trains on the same examples, and a subset of size k is contained in the one of size k + 1.
    """
    if labels.dim() != 1:  # a dense task's masks or targets have no one class per image
        return torch.arange(min(size, len(labels)))
    y = labels.cpu().numpy()
    if not 1 <= size <= len(y):
        raise SmoothcertError(f"train_size must lie in 1..{len(y)}, got {size}")
    rng = np.random.default_rng(SUBSET_SEED)
    rank = np.empty(len(y), dtype=np.int64)  # position of each example within its class
    for c in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == c))
        rank[rows] = np.arange(len(rows))
    order = np.lexsort((y, rank))  # round-robin over the classes, by rank then label
    return torch.from_numpy(np.sort(order[:size]))


def load_dataset(
    name: str, split: str, data_root: str | os.PathLike | None = None, download: bool = True,
    *, image_size: int | None = None,
):
    """Split ``"train"`` or ``"test"`` of dataset ``name``: an :class:`ImageDataset` in CPU
    memory, or for image folders (``imagenet``, ``imagefolder``) a streamed
    :class:`~smoothcert.data.image_folders.FolderDataset` that decodes images when read.

    ``data_root`` is where to look first (see each loader); ``download`` allows fetching with
    torchvision when the data are found nowhere locally. ``image_size`` (folders only) is the
    side S of the square inputs.
    """
    spec = dataset_spec(name)
    if split not in SPLITS:
        raise SmoothcertError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if spec.streamed:
        return spec.opener(spec, split, data_root, image_size)
    if image_size is not None:
        raise SmoothcertError(f"--image-size is for image folders; {name} images are "
                              f"{spec.input_shape[1]}×{spec.input_shape[2]}")
    if data_root is not None and not isinstance(data_root, (str, os.PathLike)):
        raise SmoothcertError(f"data_root must be a folder path, got {data_root!r}")
    root = Path(data_root).expanduser() if data_root is not None else None
    if root is not None and not root.is_dir():  # a typo must not fall back to other folders
        raise SmoothcertError(f"--data-root {printable(root)} does not exist or is not a "
                              f"folder; pass the folder that holds the {name} files, or leave "
                              "--data-root out")
    images, labels, scale, *read = spec.loader(split, root, download)
    _check_loaded(spec, images, labels)
    files = describe_files(read[0]) if read else ()
    return ImageDataset(spec, split, images, labels, float(scale), files)


def label_layout(spec: DatasetSpec, images_shape) -> tuple[torch.dtype, tuple]:
    """The dtype and shape of the labels of ``images_shape`` (N, C, H, W) images by the task."""
    n, _, h, w = images_shape
    return {"classification": (torch.int64, (n,)), "segmentation": (torch.uint8, (n, h, w)),
            "regression": (torch.float32, (n, spec.num_classes))}[spec.task]


def _check_loaded(spec: DatasetSpec, images: torch.Tensor, labels: torch.Tensor) -> None:
    if tuple(images.shape[1:]) != spec.input_shape:
        raise SmoothcertError(
            f"{spec.name} images have shape {tuple(images.shape[1:])}, expected "
            f"{spec.input_shape}; check that --data-root holds {spec.name} files"
        )
    if spec.task == "regression":
        if not bool(torch.isfinite(labels).all()):
            raise SmoothcertError(f"{spec.name} targets must be finite numbers")
        return
    if spec.task == "segmentation":  # uint8 masks: only too large values can be wrong
        wrong = (labels >= spec.num_classes) & (labels != spec.ignore_index)
        labels = torch.zeros(1, dtype=torch.long) + (spec.num_classes if wrong.any() else 0)
    if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < spec.num_classes:
        raise SmoothcertError(
            f"{spec.name} labels must lie in 0..{spec.num_classes - 1}; "
            f"check that --data-root holds {spec.name} files"
        )


# ---------------------------------------------------------------------------------------------
# digits: scikit-learn's bundled 8×8 handwritten digits (UCI optdigits test set, 1,797 images).

DIGITS_SPLIT_SEED = 0  # seed of the fixed per-class permutation below
DIGITS_TEST_FRACTION = 0.2  # of each class, rounded half up


def digits_split_indices() -> tuple[np.ndarray, np.ndarray]:
    """The fixed stratified split of ``load_digits()``: sorted (train, test) row indices.

    For each class c = 0..9 in order, the rows with label c are permuted by one
    ``np.random.default_rng(DIGITS_SPLIT_SEED)`` and the first ``floor(0.2·n_c + 0.5)`` go to test.
    Independent of sklearn's split functions, so it never changes with sklearn versions.
    """
    from sklearn.datasets import load_digits

    target = load_digits().target
    rng = np.random.default_rng(DIGITS_SPLIT_SEED)
    train, test = [], []
    for c in range(10):
        rows = rng.permutation(np.flatnonzero(target == c))
        n_test = math.floor(DIGITS_TEST_FRACTION * len(rows) + 0.5)
        test.append(rows[:n_test])
        train.append(rows[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


# Pixel mean and population std (ddof=0) over all pixels of the train split above, pixels = raw/16;
# recomputed by tests/data/test_data.py::test_digits_normalization_matches_train_split.
@register_dataset("digits", num_classes=10, input_shape=(1, 8, 8), mean=(0.30548,), std=(0.37611,),
                  class_names=DIGIT_NAMES)
def _load_digits(split: str, data_root: Path | None, download: bool):
    from sklearn.datasets import load_digits

    bunch = load_digits()
    rows = digits_split_indices()[SPLITS.index(split)]
    # Values are integer counts 0..16 stored as float64; uint8 is exact.
    images = torch.from_numpy(bunch.data[rows].astype(np.uint8).reshape(-1, 1, 8, 8))
    labels = torch.from_numpy(bunch.target[rows].astype(np.int64))
    return images, labels, 1.0 / 16.0, [p for p in [_digits_file()] if p.is_file()]


def _digits_file() -> Path:
    """The file ``load_digits()`` reads, inside scikit-learn."""
    import sklearn.datasets

    return Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"
