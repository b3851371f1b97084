"""Dataset registry: whole datasets held in memory as uint8 tensors, batched on their device.

A dataset is an :class:`ImageDataset`: ``images`` (N, C, H, W) uint8 and ``labels`` (N,) int64,
with ``scale`` mapping stored values to pixels in [0, 1] (``pixel = images.float() * scale``).
:meth:`ImageDataset.batch` returns float32 pixels on the dataset's device, ready for noise.

Normalization statistics (per-channel mean and std) belong to the :class:`DatasetSpec` and go into
the model's first layer (``NormalizeLayer``); they are never applied to the data, so noise and
certified radii live in pixel units (Cohen et al. 2019, ``datasets.py``).

Data are read by our own readers of the original formats (IDX for (Fashion-)MNIST, the python
pickle batches for CIFAR-10), so tests can build tiny files in those formats and nothing needs a
network. torchvision is used only to download, when asked to and when nothing is found locally.
"""

from __future__ import annotations

import codecs
import dataclasses
import gzip
import math
import os
import pickle
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import SmoothcertError
from ..io import file_sha256
from ..registry import Registry

SPLITS = ("train", "test")

# Where the Debian package ``dataset-fashion-mnist`` puts the four gzipped IDX files.
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")

# (images uint8 (N, C, H, W), labels int64 (N,), scale[, files read]) from (split, data_root,
# download); the optional fourth item lists the paths read, for run manifests (data_files).
# (String parts keep the alias valid at run time on Python 3.9.)
Loader = Callable[[str, "Path | None", bool], "tuple[torch.Tensor, torch.Tensor, float]"]
# Files up to this size are fingerprinted by their SHA-256 in a run's manifest (a few ms per
# MiB: every dataset file we read, CIFAR-10's 31 MB batches included); larger ones by size and
# modification time only.
HASHED_FILE_BYTES = 64 << 20


@dataclass(frozen=True)
class DatasetSpec:
    """What a dataset is, independent of where its files are.

    ``mean`` and ``std`` are per-channel statistics of pixels in [0, 1]; they parametrize the
    model's ``NormalizeLayer``. ``augmentation`` names an entry of :data:`AUGMENTATIONS` used for
    training.
    """

    name: str
    num_classes: int
    input_shape: tuple[int, int, int]  # (C, H, W)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augmentation: str
    """The training augmentation: a name in :data:`AUGMENTATIONS`."""
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


@dataclass(frozen=True)
class ImageDataset:
    """A whole split in memory: ``images`` (N, C, H, W) uint8, ``labels`` (N,) int64.

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
        if self.labels.dtype != torch.int64 or self.labels.shape != self.images.shape[:1]:
            raise SmoothcertError(
                f"{self.spec.name} labels must be an int64 tensor of shape "
                f"({self.images.shape[0]},), got {self.labels.dtype} {tuple(self.labels.shape)}"
            )

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
        return x, self.labels[indices]

    def subset(self, indices: torch.Tensor) -> ImageDataset:
        """The examples at ``indices``, as a dataset of their own."""
        indices = indices.to(self.device)
        images, labels = self.images[indices], self.labels[indices]
        return dataclasses.replace(self, images=images, labels=labels)

    def example(self, idx: int) -> tuple[torch.Tensor, int]:
        """Example ``idx``: pixels (C, H, W) float32 in [0, 1] and its label."""
        x, y = self.batch(torch.tensor([idx], dtype=torch.long))
        return x[0], int(y[0])

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
        raise SmoothcertError(f"--data-root {root} does not exist or is not a folder; pass the "
                              f"folder that holds the {name} files, or leave --data-root out")
    images, labels, scale, *read = spec.loader(split, root, download)
    _check_loaded(spec, images, labels)
    files = describe_files(read[0]) if read else ()
    return ImageDataset(spec, split, images, labels, float(scale), files)


def _check_loaded(spec: DatasetSpec, images: torch.Tensor, labels: torch.Tensor) -> None:
    if tuple(images.shape[1:]) != spec.input_shape:
        raise SmoothcertError(
            f"{spec.name} images have shape {tuple(images.shape[1:])}, expected "
            f"{spec.input_shape}; check that --data-root holds {spec.name} files"
        )
    if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < spec.num_classes:
        raise SmoothcertError(
            f"{spec.name} labels must lie in 0..{spec.num_classes - 1}; "
            f"check that --data-root holds {spec.name} files"
        )


def default_cache_dir() -> Path:
    """Where downloads go when no ``data_root`` is given: ``~/.cache/smoothcert``."""
    return Path("~/.cache/smoothcert").expanduser()


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
# recomputed by tests/test_data.py::test_digits_normalization_matches_train_split.
@register_dataset("digits", num_classes=10, input_shape=(1, 8, 8), mean=(0.30548,), std=(0.37611,))
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


# ---------------------------------------------------------------------------------------------
# IDX files (LeCun's MNIST format, also used by Fashion-MNIST).

_IDX_STEMS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an unsigned-byte IDX file (plain, or gzipped when the name ends in ``.gz``).

    Layout: magic ``00 00 08 ndim``, ``ndim`` big-endian uint32 sizes, then exactly
    prod(sizes) bytes. Anything else raises :class:`SmoothcertError`.
    """
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or not 1 <= raw[3] <= 4:
        raise SmoothcertError(f"{path} is not an unsigned-byte IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise SmoothcertError(f"{path} is truncated (incomplete IDX header); download it again")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    if len(raw) - header != math.prod(shape):
        raise SmoothcertError(
            f"{path} holds {len(raw) - header} data bytes but its header says {shape} "
            f"({math.prod(shape)}); the file is truncated or corrupt, download it again"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as err:
        raise SmoothcertError(f"cannot read {path} ({err}); download it again") from err


def _idx_file(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _find_idx_pair(folders: list[Path], split: str) -> tuple[Path, Path] | None:
    """The first folder holding both the image and label IDX files of ``split``."""
    for folder in folders:
        pair = tuple(_idx_file(folder, stem) for stem in _IDX_STEMS[split])
        if all(pair):
            return pair
    return None


def _read_idx_pair(pair: tuple[Path, Path]) -> tuple[torch.Tensor, torch.Tensor, float]:
    images, labels = read_idx(pair[0]), read_idx(pair[1])
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise SmoothcertError(
            f"{pair[0]} and {pair[1]} do not form an image/label pair "
            f"(shapes {images.shape} and {labels.shape})"
        )
    images = torch.from_numpy(images.copy()).unsqueeze(1)  # (N, 1, H, W)
    return images, torch.from_numpy(labels.astype(np.int64)), 1.0 / 255.0, list(pair)


@dataclass(frozen=True)
class _IdxSource:
    name: str  # our dataset name, also a sub-folder of data_root
    torchvision_class: str  # also torchvision's folder: <root>/<class>/raw
    system_dirs: tuple[Path, ...] = ()
    install_hint: str = ""

    def folders(self, data_root: Path | None) -> list[Path]:
        """Search order: data_root, data_root/<name>, torchvision's layout, system folders; with
        no data_root, the system folders, then where an earlier download went."""
        if data_root is None:
            return [*self.system_dirs, default_cache_dir() / self.torchvision_class / "raw"]
        tv_raw = data_root / self.torchvision_class / "raw"
        return [data_root, data_root / self.name, tv_raw, *self.system_dirs]

    def load(self, split: str, data_root: Path | None, download: bool):
        folders = self.folders(data_root)
        pair = _find_idx_pair(folders, split)
        if pair is None and download:
            pair = self._download(split, data_root or default_cache_dir())
        if pair is None:
            raise self._not_found(folders, download)
        return _read_idx_pair(pair)

    def _download(self, split: str, root: Path) -> tuple[Path, Path] | None:
        import torchvision.datasets

        try:
            getattr(torchvision.datasets, self.torchvision_class)(
                root=str(root), train=split == "train", download=True
            )
        except Exception:  # no network, a proxy error, ...: report what we looked for below
            return None
        return _find_idx_pair([root / self.torchvision_class / "raw"], split)

    def _not_found(self, folders: list[Path], download: bool) -> SmoothcertError:
        looked = ", ".join(str(f) for f in folders)
        tried = "download failed" if download else "download disabled"
        return SmoothcertError(
            f"{self.name} IDX files not found (looked in {looked}; {tried}); "
            f"{self.install_hint}pass --data-root pointing to a folder with the IDX files"
        )


# Normalization: the commonly used training-set statistics of pixels in [0, 1], as in the PyTorch
# MNIST example (0.1307, 0.3081) and for Fashion-MNIST (0.2860, 0.3530; matches the train split of
# the Debian package to 4 decimals: mean 0.28604, population std 0.35302).
_MNIST = _IdxSource("mnist", "MNIST")
_FASHION = _IdxSource(
    "fashion-mnist",
    "FashionMNIST",
    install_hint="install them with `apt-get install dataset-fashion-mnist` or ",
)


@register_dataset("mnist", num_classes=10, input_shape=(1, 28, 28), mean=(0.1307,), std=(0.3081,))
def _load_mnist(split: str, data_root: Path | None, download: bool):
    return _MNIST.load(split, data_root, download)


@register_dataset(
    "fashion-mnist", num_classes=10, input_shape=(1, 28, 28), mean=(0.2860,), std=(0.3530,)
)
def _load_fashion_mnist(split: str, data_root: Path | None, download: bool):
    # The system folder is read at call time, so tests can point it elsewhere.
    source = dataclasses.replace(_FASHION, system_dirs=(FASHION_MNIST_SYSTEM_DIR,))
    return source.load(split, data_root, download)


# ---------------------------------------------------------------------------------------------
# CIFAR-10: the python pickle batches of cifar-10-python.tar.gz.

_CIFAR_DIR = "cifar-10-batches-py"
_CIFAR_FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts of numpy arrays and nothing else: a data file must not run code."""

    def find_class(self, module: str, name: str):
        reconstruct = np.empty(0).__reduce__()[0]  # numpy's _reconstruct, whatever its module
        allowed = {
            ("numpy.core.multiarray", "_reconstruct"): reconstruct,
            ("numpy._core.multiarray", "_reconstruct"): reconstruct,
            ("numpy", "ndarray"): np.ndarray,
            ("numpy", "dtype"): np.dtype,
            ("_codecs", "encode"): codecs.encode,  # how python 3 pickles bytes at protocol 2
        }
        if (module, name) not in allowed:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return allowed[(module, name)]


def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 python batch: images (N, 3, 32, 32) uint8 and labels (N,) int64.

    The file is a pickled dict with ``b'data'`` (N, 3072) uint8, rows laid out as 1024 red,
    1024 green, 1024 blue values in row-major order, and ``b'labels'`` (N ints).
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except Exception as err:  # truncated pickle, foreign object, missing key, ...
        raise SmoothcertError(
            f"{path} is not a readable CIFAR-10 python batch ({err}); download it again"
        ) from err
    if data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (len(data),):
        raise SmoothcertError(
            f"{path} is not a CIFAR-10 batch: data {data.shape}, labels {labels.shape}"
        )
    return data.reshape(-1, 3, 32, 32), labels


def _find_cifar_dir(folders: list[Path], split: str) -> Path | None:
    for folder in folders:
        if all((folder / name).is_file() for name in _CIFAR_FILES[split]):
            return folder
    return None


def _read_cifar_split(folder: Path, split: str):
    files = [folder / name for name in _CIFAR_FILES[split]]
    parts = [read_cifar_batch(path) for path in files]
    images = torch.from_numpy(np.concatenate([p[0] for p in parts]))
    labels = torch.from_numpy(np.concatenate([p[1] for p in parts]))
    return images, labels, 1.0 / 255.0, files


def _download_cifar(root: Path) -> None:
    import torchvision.datasets

    # torchvision only fetches and unpacks here; reading is ours (its reader checks md5 sums).
    try:
        torchvision.datasets.CIFAR10(root=str(root), train=False, download=True)
    except Exception:  # no network, a proxy error, ...: the caller reports what it looked for
        return


# Normalization as in Cohen et al.'s datasets.py (_CIFAR10_MEAN, _CIFAR10_STDDEV), which the
# released checkpoints were trained with.
@register_dataset(
    "cifar10",
    num_classes=10,
    input_shape=(3, 32, 32),
    mean=(0.4914, 0.4822, 0.4465),
    std=(0.2023, 0.1994, 0.2010),
    augmentation="crop_flip",
)
def _load_cifar10(split: str, data_root: Path | None, download: bool):
    root = data_root or default_cache_dir()
    folders = [root / _CIFAR_DIR] + ([data_root] if data_root is not None else [])
    folder = _find_cifar_dir(folders, split)
    if folder is None and download:
        _download_cifar(root)
        folder = _find_cifar_dir([root / _CIFAR_DIR], split)
    if folder is None:
        looked = ", ".join(str(f) for f in folders)
        tried = "download failed" if download else "download disabled"
        raise SmoothcertError(
            f"cifar10 batches not found (looked in {looked}; {tried}); pass --data-root pointing "
            f"to a folder containing {_CIFAR_DIR}/ from cifar-10-python.tar.gz"
        )
    return _read_cifar_split(folder, split)


# ---------------------------------------------------------------------------------------------
# Training augmentations: batched, on x's device, randomness from an explicit generator.

Augmentation = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
AUGMENTATIONS: Registry = Registry("augmentation")
register_augmentation = AUGMENTATIONS.register


def augment(kind: str, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Apply augmentation ``kind`` to a batch x (B, C, H, W); ``generator`` lives on x's device."""
    return AUGMENTATIONS[kind](x, generator)


@register_augmentation("none")
def _identity(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return x


CROP_PADDING = 4  # pixels of zero padding per side, as torchvision RandomCrop(32, padding=4)


@register_augmentation("crop_flip")
def _random_crop_flip(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crop from the zero-padded image, then horizontal flip with probability ½.

    The distribution of torchvision's ``RandomCrop(H, padding=4)`` + ``RandomHorizontalFlip()``
    used by Cohen et al. for CIFAR-10: offsets uniform on {0, …, 8} per axis and sample.
    """
    b, device = x.shape[0], x.device
    top = torch.randint(0, 2 * CROP_PADDING + 1, (b,), generator=generator, device=device)
    left = torch.randint(0, 2 * CROP_PADDING + 1, (b,), generator=generator, device=device)
    flip = torch.rand(b, generator=generator, device=device) < 0.5
    return crop_and_flip(x, top, left, flip, CROP_PADDING)


def crop_and_flip(
    x: torch.Tensor, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor, padding: int
) -> torch.Tensor:
    """Per-sample crops of the zero-padded batch, mirrored where ``flip``; no Python loop.

    x (B, C, H, W); ``top``, ``left`` (B,) int offsets in [0, 2·padding] into the padded image;
    ``flip`` (B,) bool. Output (B, C, H, W): out[i] = padded[i, :, top_i:top_i+H, left_i:left_i+W],
    reversed along W where flip[i].
    """
    b, _, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding)).permute(0, 2, 3, 1)  # (B, H', W', C)
    rows = top[:, None] + torch.arange(h, device=x.device)  # (B, H)
    cols = left[:, None] + torch.arange(w, device=x.device)  # (B, W)
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    batch = torch.arange(b, device=x.device)[:, None, None]
    out = padded[batch, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()
