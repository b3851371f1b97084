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
) -> Callable[[Loader], Loader]:
    """Decorator: register ``loader`` under ``name`` with the dataset's fixed properties."""

    def wrap(loader: Loader) -> Loader:
        spec = (name, num_classes, tuple(input_shape), tuple(mean), tuple(std), augmentation)
        DATASETS.register(name)(DatasetSpec(*spec, loader))
        return loader

    return wrap


def register_folder_dataset(name: str, *, num_classes: int, image_size: int,
                            mean: tuple[float, ...], std: tuple[float, ...],
                            opener: Callable) -> None:
    """Register a streamed image-folder dataset (RGB, ``image_size`` square by default)."""
    spec = DatasetSpec(name, num_classes, (3, image_size, image_size), tuple(mean), tuple(std),
                       "none", None, opener)
    DATASETS.register(name)(spec)


def dataset_spec(name: str) -> DatasetSpec:
    return DATASETS[name]
