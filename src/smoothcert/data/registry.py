"""The dataset registry: what a dataset is (:class:`DatasetSpec`), independent of its files.

:data:`DATASETS` maps a name to its spec: classes, input shape, the per-channel normalization
statistics that go into the model's first layer, the training augmentation, and either a
``loader`` that reads a whole split into memory (:mod:`.formats`, :mod:`.datasets`) or an
``opener`` that scans an image folder (:mod:`.image_folders`). Registering is all a new dataset
needs; :func:`smoothcert.data.datasets.load_dataset` reads any registered name.

Every dataset that :func:`~smoothcert.data.datasets.load_dataset` returns names its classes,
for tables and the HTML gallery, through its spec (``dataset.spec``) and as attributes of its
own:

* ``class_names``: a tuple of ``num_classes`` str, entry c naming label c (for a segmentation
  set, mask value c; the ``ignore_index`` is no class and is not named), or None where the
  names are unknown (a regression set's outputs are no classes). Built in: ``mnist`` and
  ``digits`` "0".."9"; ``fashion-mnist`` Zalando's ten names ("T-shirt/top", ...); ``cifar10``
  "airplane" .. "truck" in label order; ``fashion-mnist-seg`` "background" then
  Fashion-MNIST's names; ``imagenet`` and ``imagefolder`` the class folder names in label
  (sorted) order, for ImageNet its wnids (``n01440764``, ...): human-readable names would need
  the devkit's wnid list to be sure they match; ``segfolder`` the lines of ``classes.txt``.
  A name holds no control character (folders and ``classes.txt`` that would give one are
  refused, :func:`smoothcert.errors.check_plain_name`).
* ``background_index``: for a segmentation set, the label of the class named "background"
  (case-insensitive; the first if several are), as Pascal VOC's class 0, which a figure may
  mute; None for other tasks and where no class has that name.
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
    class_names: tuple[str, ...] | None = None  # label c's name, see the module's docstring

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"dataset task {self.task!r} is not one of {TASKS}")
        if self.class_names is not None and self.num_classes and \
                len(self.class_names) != self.num_classes:
            raise ValueError(f"dataset {self.name!r} names {len(self.class_names)} classes, "
                             f"has {self.num_classes}")

    @property
    def background_index(self) -> int | None:
        """Segmentation only: the label of the first class named "background" (any case), else
        None (see the module's docstring)."""
        if self.task != "segmentation" or self.class_names is None:
            return None
        lowered = [name.lower() for name in self.class_names]
        return lowered.index("background") if "background" in lowered else None

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
    class_names: tuple[str, ...] | None = None,
) -> Callable[[Loader], Loader]:
    """Decorator: register ``loader`` under ``name`` with the dataset's fixed properties
    (``task``: one of :data:`TASKS`; for a regression set ``num_classes`` is its outputs;
    ``class_names``: label c's name, or None)."""

    def wrap(loader: Loader) -> Loader:
        spec = (name, num_classes, tuple(input_shape), tuple(mean), tuple(std), augmentation)
        names = tuple(class_names) if class_names is not None else None
        DATASETS.register(name)(DatasetSpec(*spec, loader, task=task,
                                            ignore_index=ignore_index, class_names=names))
        return loader

    return wrap


def register_folder_dataset(name: str, *, num_classes: int, image_size: int,
                            mean: tuple[float, ...], std: tuple[float, ...],
                            opener: Callable, task: str = "classification",
                            ignore_index: int | None = None) -> None:
    """Register a streamed image-folder dataset (RGB, ``image_size`` square by default); its
    ``opener`` sets the spec's ``class_names`` from the folder it scans."""
    spec = DatasetSpec(name, num_classes, (3, image_size, image_size), tuple(mean), tuple(std),
                       "none", None, opener, task=task, ignore_index=ignore_index)
    DATASETS.register(name)(spec)


def dataset_spec(name: str) -> DatasetSpec:
    return DATASETS[name]
