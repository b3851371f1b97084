"""Datasets: the registry, the in-memory sets and the streamed image folders.

Importing the package registers every dataset (``image_folders`` registers ``imagenet`` and
``imagefolder``).
"""

from . import image_folders  # noqa: F401  (registers the streamed folder datasets)
from .datasets import (
    DATASETS,
    SPLITS,
    DatasetSpec,
    ImageDataset,
    balanced_subset,
    dataset_spec,
    load_dataset,
    read_idx,
)

__all__ = ["DATASETS", "SPLITS", "DatasetSpec", "ImageDataset", "balanced_subset",
           "dataset_spec", "load_dataset", "read_idx"]
