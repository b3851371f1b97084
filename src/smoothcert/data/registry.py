"""The dataset registry: what a dataset is (:class:`DatasetSpec`), independent of its files.

:data:`DATASETS` maps a name to its spec: classes, input shape, the per-channel normalization
statistics that go into the model's first layer, the training augmentation, and either a
``loader`` that reads a whole split into memory (:mod:`.formats`, :mod:`.datasets`) or an
``opener`` that scans an image folder (:mod:`.image_folders`). Registering is all a new dataset
needs; :func:`smoothcert.data.datasets.load_dataset` reads any registered name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..registry import Registry

SPLITS = ("train", "test")
TASKS = ("classification", "segmentation", "regression")
"""What a dataset's labels are, and so which models, losses and certifiers fit it:

* classification: one class per image, labels (N,) int64;
* segmentation: one class per pixel, labels (N, H, W) int64 in [0, num_classes) or the
  dataset's ``ignore_index`` (unlabelled pixels, left out of losses and metrics);
* regression: ``num_classes`` real outputs per image (a box: 4), labels (N, D) float32.
"""

# (images uint8 (N, C, H, W), labels int64 (N,), scale[, files read]) from (split, data_root,
# download); the optional fourth item lists the paths read, for run manifests (data_files).
# (String parts keep the alias valid at run time on Python 3.9.)
Loader = Callable[[str, "Path | None", bool], "tuple[torch.Tensor, torch.Tensor, float]"]


@dataclass(frozen=True)
class DatasetSpec:
    """What a dataset is, independent of where its files are.

    ``mean`` and ``std`` are per-channel statistics of pixels in [0, 1]; they parametrize the
    model's ``NormalizeLayer``. ``augmentation`` names an entry of
    :data:`~smoothcert.data.transforms.AUGMENTATIONS` used for training.
    """

    name: str
    num_classes: int
    input_shape: tuple[int, int, int]  # (C, H, W)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augmentation: str
    """The training augmentation: a name in :data:`~smoothcert.data.transforms.AUGMENTATIONS`."""
    loader: Loader | None
    # Streamed image folders (``image_folders.py``): ``opener(spec, split, data_root,
    # image_size)`` scans the folder and returns a FolderDataset; ``loader`` is then None and
    # ``num_classes`` 0 when the folder decides it.
    opener: Callable | None = None
    task: str = "classification"  # one of TASKS
    ignore_index: int | None = None  # segmentation: the label of unlabelled pixels

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"dataset task {self.task!r} is not one of {TASKS}")

    @property
    def streamed(self) -> bool:
        """Whether examples are decoded from files as they are needed (an image folder)."""
        return callable(self.opener)


DATASETS: Registry = Registry("dataset")


def register_dataset(
    name: str,
    *,
    num_classes: int,
    input_shape: tuple[int, int, int],
    mean: tuple[float, ...],
    std: tuple[float, ...],
    augmentation: str = "none",
    task: str = "classification",
    ignore_index: int | None = None,
) -> Callable[[Loader], Loader]:
    """Decorator: register ``loader`` under ``name`` with the dataset's fixed properties
    (``task``: one of :data:`TASKS`; for a regression set ``num_classes`` is its outputs)."""

    def wrap(loader: Loader) -> Loader:
        spec = (name, num_classes, tuple(input_shape), tuple(mean), tuple(std), augmentation)
        DATASETS.register(name)(DatasetSpec(*spec, loader, task=task,
                                            ignore_index=ignore_index))
        return loader

    return wrap


def register_folder_dataset(name: str, *, num_classes: int, image_size: int,
                            mean: tuple[float, ...], std: tuple[float, ...],
                            opener: Callable, task: str = "classification",
                            ignore_index: int | None = None) -> None:
    """Register a streamed image-folder dataset (RGB, ``image_size`` square by default)."""
    spec = DatasetSpec(name, num_classes, (3, image_size, image_size), tuple(mean), tuple(std),
                       "none", None, opener, task=task, ignore_index=ignore_index)
    DATASETS.register(name)(spec)


def dataset_spec(name: str) -> DatasetSpec:
    return DATASETS[name]
