"""Readers of the original file formats and the datasets registered on them.

IDX for (Fashion-)MNIST and the python pickle batches for CIFAR-10, read by our own code, so
tests can build tiny files in those formats and nothing needs a network. torchvision is used only
to download, when asked to and when nothing is found locally. Importing this module registers
``mnist``, ``fashion-mnist`` and ``cifar10``.
"""

from __future__ import annotations

import codecs
import dataclasses
import gzip
import math
import os
import pickle
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import SmoothcertError, printable
from .registry import register_dataset

# Where the Debian package ``dataset-fashion-mnist`` puts the four gzipped IDX files.
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")


def default_cache_dir() -> Path:
    """Where downloads go when no ``data_root`` is given: ``~/.cache/smoothcert``."""
    return Path("~/.cache/smoothcert").expanduser()


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
        raise SmoothcertError(f"{printable(path)} is not an unsigned-byte IDX file "
                              "(bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise SmoothcertError(f"{printable(path)} is truncated (incomplete IDX header); "
                              "download it again")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    if len(raw) - header != math.prod(shape):
        raise SmoothcertError(
            f"{printable(path)} holds {len(raw) - header} data bytes but its header says {shape} "
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
        raise SmoothcertError(f"cannot read {printable(path)} ({printable(err)}); "
                              "download it again") from err


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
            f"{printable(pair[0])} and {printable(pair[1])} do not form an image/label pair "
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
        looked = ", ".join(printable(f) for f in folders)
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


DIGIT_NAMES = tuple(str(d) for d in range(10))  # mnist's and digits' labels are the digits
# Zalando's names of labels 0..9 (zalandoresearch/fashion-mnist README, torchvision's
# FashionMNIST.classes).
FASHION_MNIST_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                       "Sneaker", "Bag", "Ankle boot")
# The batches.meta label_names of cifar-10-python.tar.gz, labels 0..9.
CIFAR10_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                 "truck")


@register_dataset("mnist", num_classes=10, input_shape=(1, 28, 28), mean=(0.1307,), std=(0.3081,),
                  class_names=DIGIT_NAMES)
def _load_mnist(split: str, data_root: Path | None, download: bool):
    return _MNIST.load(split, data_root, download)


@register_dataset(
    "fashion-mnist", num_classes=10, input_shape=(1, 28, 28), mean=(0.2860,), std=(0.3530,),
    class_names=FASHION_MNIST_NAMES,
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
            f"{printable(path)} is not a readable CIFAR-10 python batch ({printable(err)}); "
            "download it again"
        ) from err
    if data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (len(data),):
        raise SmoothcertError(
            f"{printable(path)} is not a CIFAR-10 batch: data {data.shape}, labels {labels.shape}"
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
    class_names=CIFAR10_NAMES,
)
def _load_cifar10(split: str, data_root: Path | None, download: bool):
    root = data_root or default_cache_dir()
    folders = [root / _CIFAR_DIR] + ([data_root] if data_root is not None else [])
    folder = _find_cifar_dir(folders, split)
    if folder is None and download:
        _download_cifar(root)
        folder = _find_cifar_dir([root / _CIFAR_DIR], split)
    if folder is None:
        looked = ", ".join(printable(f) for f in folders)
        tried = "download failed" if download else "download disabled"
        raise SmoothcertError(
            f"cifar10 batches not found (looked in {looked}; {tried}); pass --data-root pointing "
            f"to a folder containing {_CIFAR_DIR}/ from cifar-10-python.tar.gz"
        )
    return _read_cifar_split(folder, split)
