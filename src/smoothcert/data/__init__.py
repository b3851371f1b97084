"""Datasets: the registry, the in-memory sets, their file formats and augmentations, and the
streamed image folders.

Importing the package registers every dataset (``formats`` registers ``mnist``,
``fashion-mnist`` and ``cifar10``, ``datasets`` registers ``digits``, ``image_folders``
registers ``imagenet`` and ``imagefolder``, ``dense`` registers ``fashion-mnist-seg`` and
``fashion-mnist-box``, ``seg_folders`` registers ``segfolder``).
"""

from ..registry import import_submodules
from .datasets import ImageDataset, balanced_subset, load_dataset
from .formats import read_idx
from .registry import DATASETS, SPLITS, DatasetSpec, dataset_spec

import_submodules(__name__, __path__, skip=("registry",))

__all__ = ["DATASETS", "SPLITS", "DatasetSpec", "ImageDataset", "balanced_subset",
           "dataset_spec", "load_dataset", "read_idx"]
