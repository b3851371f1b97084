"""Datasets from tiny files in the real formats (IDX, CIFAR pickle), digits, and augmentations."""

from __future__ import annotations

import datetime
import gzip
import math
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from smoothcert import SmoothcertError
from smoothcert.data import formats as data_mod
from smoothcert.data.datasets import (
    ImageDataset,
    balanced_subset,
    digits_split_indices,
    load_dataset,
)
from smoothcert.data.formats import read_cifar_batch, read_idx
from smoothcert.data.registry import DATASETS, dataset_spec
from smoothcert.data.transforms import AUGMENTATIONS, augment, crop_and_flip

IDX_STEMS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
TORCHVISION_FOLDER = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
SIZES = {"train": 5, "test": 3}
REAL_FASHION_MNIST_DIR = data_mod.FASHION_MNIST_SYSTEM_DIR  # before any test patches it


def write_idx(path, array: np.ndarray) -> None:
    """LeCun's IDX layout: 00 00 08 ndim, big-endian uint32 sizes, then the bytes."""
    raw = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    raw += np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(raw)
    else:
        path.write_bytes(raw)


def write_idx_dataset(folder, gz: bool, seed: int = 0) -> dict:
    """Both splits as IDX files in ``folder``; returns {split: (images, labels)}."""
    folder.mkdir(parents=True, exist_ok=True)
    rng, out = np.random.default_rng(seed), {}
    for split, (img_stem, lbl_stem) in IDX_STEMS.items():
        images = rng.integers(0, 256, size=(SIZES[split], 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=SIZES[split], dtype=np.uint8)
        suffix = ".gz" if gz else ""
        write_idx(folder / f"{img_stem}{suffix}", images)
        write_idx(folder / f"{lbl_stem}{suffix}", labels)
        out[split] = (images, labels)
    return out


@pytest.fixture(autouse=True)
def no_system_data(tmp_path, monkeypatch):
    """Tests see no system-wide Fashion-MNIST and no user cache unless they ask for them."""
    monkeypatch.setattr(data_mod, "FASHION_MNIST_SYSTEM_DIR", tmp_path / "no-system-data")
    monkeypatch.setattr(data_mod, "default_cache_dir", lambda: tmp_path / "cache")


# --- registry -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_spec_is_consistent(name):
    spec = dataset_spec(name)
    channels = spec.input_shape[0]
    assert len(spec.mean) == len(spec.std) == channels
    assert all(0 < m < 1 for m in spec.mean) and all(0 < s < 1 for s in spec.std)
    assert spec.augmentation in AUGMENTATIONS
    # image folders: ImageNet's 1000 wnids, or as many classes as the user's folder has (0);
    # the dense sets: background + 10 classes per pixel, 4 box coordinates
    expected = {"imagenet": 1000, "imagefolder": 0, "segfolder": 0, "fashion-mnist-seg": 11,
                "fashion-mnist-box": 4}.get(name, 10)
    folders = ("imagenet", "imagefolder", "segfolder")
    assert spec.num_classes == expected and spec.streamed == (name in folders)


def test_registry_has_the_embedded_and_file_datasets():
    assert {"digits", "mnist", "fashion-mnist", "cifar10"} <= set(DATASETS)


def test_unknown_dataset_and_split():
    with pytest.raises(SmoothcertError, match="known: .*digits"):
        load_dataset("imagenet-tiny", "train")
    with pytest.raises(SmoothcertError, match="split"):
        load_dataset("digits", "validation")


# --- digits -------------------------------------------------------------------------------------


def test_digits_split_sizes_and_stratification():
    target = load_digits().target
    train, test = digits_split_indices()
    assert len(train) + len(test) == len(target) == 1797
    assert len(np.intersect1d(train, test)) == 0
    assert np.array_equal(np.union1d(train, test), np.arange(1797))
    for c in range(10):
        n_c = int((target == c).sum())
        n_test = int((target[test] == c).sum())
        assert n_test == math.floor(0.2 * n_c + 0.5), c
        assert n_c - n_test == int((target[train] == c).sum()) > 0


def test_digits_split_is_fixed():
    a, b = digits_split_indices(), digits_split_indices()
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # Golden values of the documented procedure (seed 0, classes in order, 20% rounded half up):
    # a change here changes every digits result, so it must be deliberate.
    assert len(a[0]) == 1438 and len(a[1]) == 359
    assert a[1][:8].tolist() == [5, 9, 12, 14, 16, 17, 19, 23]
    assert int(a[1].sum()) == 324981


@pytest.mark.parametrize("split", ["train", "test"])
def test_digits_dataset(split):
    ds = load_dataset("digits", split)
    rows = digits_split_indices()[0 if split == "train" else 1]
    bunch = load_digits()
    assert len(ds) == len(rows) and ds.input_shape == (1, 8, 8) and ds.num_classes == 10
    assert ds.images.dtype == torch.uint8 and ds.labels.dtype == torch.int64
    assert np.array_equal(ds.labels.numpy(), bunch.target[rows])
    x, y = ds.batch(torch.arange(len(ds)))
    assert x.dtype == torch.float32 and x.shape == (len(ds), 1, 8, 8)
    assert x.min() == 0.0 and x.max() == 1.0
    np.testing.assert_array_equal(x.reshape(len(ds), 64).numpy(), bunch.data[rows] / 16.0)
    assert set(y.tolist()) == set(range(10))


def test_digits_normalization_matches_train_split():
    """The hard-coded mean/std are the train split's pixel mean and population std."""
    ds = load_dataset("digits", "train")
    x = ds.images.double() * ds.scale
    assert abs(x.mean().item() - ds.spec.mean[0]) < 1e-4
    assert abs(x.std(unbiased=False).item() - ds.spec.std[0]) < 1e-4


def test_image_dataset_accessors():
    ds = load_dataset("digits", "test")
    x, y = ds.example(3)
    assert x.shape == (1, 8, 8) and isinstance(y, int) and y == int(ds.labels[3])
    moved = ds.to("cpu")
    assert moved is not ds and moved.name == "digits" and moved.split == "test"
    assert torch.equal(moved.images, ds.images)
    xb, yb = ds.batch(torch.tensor([3, 0]))
    assert torch.equal(xb[0], x) and yb.tolist() == [y, int(ds.labels[0])]


def test_image_dataset_rejects_wrong_dtypes():
    spec = dataset_spec("digits")
    with pytest.raises(SmoothcertError, match="uint8"):
        ImageDataset(spec, "test", torch.zeros(2, 1, 8, 8), torch.zeros(2, dtype=torch.long), 1.0)
    with pytest.raises(SmoothcertError, match="int64"):
        ImageDataset(spec, "test", torch.zeros(2, 1, 8, 8, dtype=torch.uint8), torch.zeros(3), 1.0)


# --- IDX: mnist, fashion-mnist ------------------------------------------------------------------


def layout_folder(root, name, layout):
    return {
        "root": root,
        "named": root / name,
        "torchvision": root / TORCHVISION_FOLDER[name] / "raw",
    }[layout]


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("layout", ["root", "named", "torchvision"])
def test_idx_datasets_load_from_tiny_files(tmp_path, name, gz, layout):
    written = write_idx_dataset(layout_folder(tmp_path / "data", name, layout), gz)
    for split in ("train", "test"):
        ds = load_dataset(name, split, data_root=tmp_path / "data", download=False)
        images, labels = written[split]
        assert len(ds) == SIZES[split] and ds.input_shape == (1, 28, 28)
        assert torch.equal(ds.images[:, 0], torch.from_numpy(images))
        assert ds.labels.tolist() == labels.tolist()
        x, _ = ds.batch(torch.arange(len(ds)))
        # Bit-identical to torchvision's ToTensor: uint8 -> float -> / 255.
        assert torch.equal(x, torch.from_numpy(images).unsqueeze(1).float().div(255))


def test_read_idx_round_trip_and_magic(tmp_path):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a", arr)
    assert np.array_equal(read_idx(tmp_path / "a"), arr)
    (tmp_path / "b").write_bytes(b"\x00\x00\x0d\x01" + struct.pack(">I", 1) + b"\x00" * 4)
    with pytest.raises(SmoothcertError, match="magic"):
        read_idx(tmp_path / "b")  # float32 IDX: not ours
    (tmp_path / "c").write_bytes(b"GIF89a")
    with pytest.raises(SmoothcertError, match="magic"):
        read_idx(tmp_path / "c")


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_idx_raises(tmp_path, gz):
    written = write_idx_dataset(tmp_path, gz)
    img = tmp_path / f"t10k-images-idx3-ubyte{'.gz' if gz else ''}"
    raw = img.read_bytes()
    img.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(SmoothcertError, match="truncated|cannot read"):
        load_dataset("mnist", "test", data_root=tmp_path, download=False)
    assert written  # the train split is intact
    assert len(load_dataset("mnist", "train", data_root=tmp_path, download=False)) == 5


def test_truncated_idx_header(tmp_path):
    (tmp_path / "h").write_bytes(b"\x00\x00\x08\x03\x00\x00")
    with pytest.raises(SmoothcertError, match="truncated"):
        read_idx(tmp_path / "h")


def test_idx_images_and_labels_must_pair(tmp_path):
    write_idx_dataset(tmp_path, gz=False)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(7, dtype=np.uint8))
    with pytest.raises(SmoothcertError, match="pair"):
        load_dataset("mnist", "test", data_root=tmp_path, download=False)


def test_idx_wrong_image_size_is_reported(tmp_path):
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((2, 8, 8), dtype=np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(2, dtype=np.uint8))
    with pytest.raises(SmoothcertError, match="shape"):
        load_dataset("mnist", "test", data_root=tmp_path, download=False)


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_missing_idx_data_without_download(tmp_path, name):
    with pytest.raises(SmoothcertError, match="not found.*--data-root") as info:
        load_dataset(name, "test", data_root=tmp_path, download=False)
    assert str(tmp_path) in str(info.value)
    if name == "fashion-mnist":
        assert "apt-get install dataset-fashion-mnist" in str(info.value)
        assert "no-system-data" in str(info.value)  # the system folder was searched too
    with pytest.raises(SmoothcertError, match="download disabled"):
        load_dataset(name, "test", data_root=None, download=False)


def test_fashion_mnist_system_folder_is_searched(tmp_path, monkeypatch):
    system = tmp_path / "system"
    write_idx_dataset(system, gz=True)
    monkeypatch.setattr(data_mod, "FASHION_MNIST_SYSTEM_DIR", system)
    assert len(load_dataset("fashion-mnist", "test", data_root=None, download=False)) == 3
    empty = tmp_path / "x"  # a --data-root that exists but lacks the files
    empty.mkdir()
    assert len(load_dataset("fashion-mnist", "test", data_root=empty, download=False)) == 3


def test_real_fashion_mnist_test_split(monkeypatch):
    if not REAL_FASHION_MNIST_DIR.is_dir():
        pytest.skip("Debian package dataset-fashion-mnist is not installed")
    monkeypatch.setattr(data_mod, "FASHION_MNIST_SYSTEM_DIR", REAL_FASHION_MNIST_DIR)
    ds = load_dataset("fashion-mnist", "test", download=False)
    assert ds.images.shape == (10_000, 1, 28, 28)
    assert sorted(ds.labels.unique().tolist()) == list(range(10))
    assert torch.bincount(ds.labels).tolist() == [1000] * 10


# --- CIFAR-10 -----------------------------------------------------------------------------------

CIFAR_FILES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}


def write_cifar(folder, per_batch: int = 2, seed: int = 0) -> dict:
    """The python-pickle layout of cifar-10-python.tar.gz, tiny: {split: (data, labels)}."""
    folder.mkdir(parents=True, exist_ok=True)
    rng, out = np.random.default_rng(seed), {}
    for split, files in CIFAR_FILES.items():
        datas, labels = [], []
        for name in files:
            data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
            lab = rng.integers(0, 10, size=per_batch).tolist()
            batch = {b"batch_label": name.encode(), b"labels": lab, b"data": data}
            (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
            datas.append(data)
            labels += lab
        out[split] = (np.concatenate(datas), labels)
    return out


@pytest.mark.parametrize("nested", [True, False])
def test_cifar10_loads_from_tiny_pickles(tmp_path, nested):
    folder = tmp_path / "cifar-10-batches-py" if nested else tmp_path
    written = write_cifar(folder)
    train = load_dataset("cifar10", "train", data_root=tmp_path, download=False)
    test = load_dataset("cifar10", "test", data_root=tmp_path, download=False)
    assert len(train) == 10 and len(test) == 2 and train.input_shape == (3, 32, 32)
    data, labels = written["train"]
    assert train.labels.tolist() == labels
    # Row layout: 1024 red, 1024 green, 1024 blue values, each 32×32 row-major.
    row = data[7]
    assert train.images[7, 1, 5, 9] == row[1 * 1024 + 5 * 32 + 9]
    assert torch.equal(train.images.reshape(10, 3072), torch.from_numpy(data))
    assert train.spec.augmentation == "crop_flip"


def test_cifar10_missing_without_download(tmp_path):
    for root in (tmp_path, None):
        with pytest.raises(SmoothcertError, match="cifar-10-batches-py"):
            load_dataset("cifar10", "train", data_root=root, download=False)


def test_cifar_reader_refuses_code_and_truncation(tmp_path):
    evil = {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": datetime.date(2020, 1, 1)}
    (tmp_path / "evil").write_bytes(pickle.dumps(evil, protocol=2))
    with pytest.raises(SmoothcertError, match="datetime"):
        read_cifar_batch(tmp_path / "evil")
    write_cifar(tmp_path)
    raw = (tmp_path / "test_batch").read_bytes()
    (tmp_path / "test_batch").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(SmoothcertError, match="test_batch"):
        load_dataset("cifar10", "test", data_root=tmp_path, download=False)


def test_cifar_reader_checks_shape(tmp_path):
    batch = {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}
    (tmp_path / "b").write_bytes(pickle.dumps(batch, protocol=2))
    with pytest.raises(SmoothcertError, match="not a CIFAR-10 batch"):
        read_cifar_batch(tmp_path / "b")


# --- augmentations ------------------------------------------------------------------------------


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("kind", sorted(AUGMENTATIONS))
def test_augmentation_keeps_shape_and_dtype(kind):
    x = torch.rand(6, 3, 32, 32, generator=gen(0))
    out = augment(kind, x, gen(1))
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device


def test_none_is_identity():
    x = torch.rand(4, 1, 8, 8)
    assert torch.equal(augment("none", x, gen(0)), x)


def test_unknown_augmentation():
    with pytest.raises(SmoothcertError, match="crop_flip"):
        augment("mixup", torch.rand(1, 1, 4, 4), gen(0))


def test_crop_flip_is_deterministic_given_the_generator():
    x = torch.rand(16, 3, 32, 32, generator=gen(0))
    a, b = augment("crop_flip", x, gen(5)), augment("crop_flip", x, gen(5))
    assert torch.equal(a, b)
    assert not torch.equal(a, augment("crop_flip", x, gen(6)))


def test_crop_and_flip_hand_computed():
    x = torch.tensor([[1.0, 2, 3], [4, 5, 6], [7, 8, 9]]).expand(2, 1, 3, 3)
    out = crop_and_flip(
        x,
        top=torch.tensor([0, 2]),
        left=torch.tensor([0, 1]),
        flip=torch.tensor([True, False]),
        padding=1,
    )
    # Sample 0: zero offset into the 1-pixel zero-padded image, then mirrored.
    assert out[0, 0].tolist() == [[0, 0, 0], [2, 1, 0], [5, 4, 0]]
    # Sample 1: two rows down, one column right (= no horizontal shift), not mirrored.
    assert out[1, 0].tolist() == [[4, 5, 6], [7, 8, 9], [0, 0, 0]]


def test_crop_flip_zero_offset_with_default_padding():
    x = torch.arange(1.0, 33.0).repeat(32, 1).expand(1, 1, 32, 32)  # x[..., i, j] = j + 1
    out = crop_and_flip(x, torch.tensor([0]), torch.tensor([0]), torch.tensor([True]), padding=4)
    expected = torch.zeros(32, 32)
    expected[4:, 4:] = torch.arange(1.0, 29.0)  # columns 0..27 of x, shifted down-right by 4
    assert torch.equal(out[0, 0], expected.flip(1))


def test_crop_flip_pixels_come_from_the_padded_image():
    x = torch.rand(6, 2, 12, 12, generator=gen(0))
    out = augment("crop_flip", x, gen(3))
    flips = []
    for i in range(len(x)):
        matches = [
            (t, left, f)
            for t in range(9)
            for left in range(9)
            for f in (False, True)
            if torch.equal(
                out[i : i + 1],
                crop_and_flip(
                    x[i : i + 1], torch.tensor([t]), torch.tensor([left]), torch.tensor([f]), 4
                ),
            )
        ]
        assert len(matches) == 1, i
        flips.append(matches[0][2])
    assert any(flips) and not all(flips)


def test_crop_flip_offsets_cover_the_full_range():
    x = torch.ones(2000, 1, 8, 8)
    out = augment("crop_flip", x, gen(0))
    # A crop shifted by (dy, dx) keeps (8−|dy−4|)(8−|dx−4|) ones; the extremes must both occur.
    kept = out.sum(dim=(1, 2, 3))
    assert kept.max() == 64 and kept.min() == 16


# --- download path, with torchvision replaced by fakes (tests never touch the network) ----------


def fake_torchvision_idx(written: list):
    """A stand-in for torchvision's MNIST/FashionMNIST that 'downloads' tiny IDX files."""

    class Fake:
        def __init__(self, root, train, download):
            assert download
            folder = Path(root) / type(self).folder / "raw"
            written.append(write_idx_dataset(folder, gz=False))

    return Fake


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_download_then_read_with_our_reader(tmp_path, monkeypatch, name):
    import torchvision.datasets

    written = []
    fake = fake_torchvision_idx(written)
    fake.folder = TORCHVISION_FOLDER[name]
    monkeypatch.setattr(torchvision.datasets, TORCHVISION_FOLDER[name], fake)
    ds = load_dataset(name, "train", data_root=None, download=True)
    assert len(written) == 1 and (tmp_path / "cache" / TORCHVISION_FOLDER[name] / "raw").is_dir()
    assert torch.equal(ds.images[:, 0], torch.from_numpy(written[0]["train"][0]))
    # The cache is searched next time, so no second download is needed, even when disabled.
    assert len(load_dataset(name, "test", data_root=None, download=False)) == SIZES["test"]
    assert len(written) == 1


def test_failed_download_is_reported(tmp_path, monkeypatch):
    import torchvision.datasets

    def offline(*args, **kwargs):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    monkeypatch.setattr(torchvision.datasets, "MNIST", offline)
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", offline)
    with pytest.raises(SmoothcertError, match="download failed"):
        load_dataset("mnist", "test", data_root=tmp_path, download=True)
    with pytest.raises(SmoothcertError, match="download failed"):
        load_dataset("cifar10", "test", data_root=tmp_path, download=True)


def test_cifar10_download_then_read_with_our_reader(tmp_path, monkeypatch):
    import torchvision.datasets

    written = []

    def fake_cifar10(root, train, download):
        written.append(write_cifar(Path(root) / "cifar-10-batches-py"))

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", fake_cifar10)
    ds = load_dataset("cifar10", "test", data_root=tmp_path, download=True)
    assert len(written) == 1 and ds.labels.tolist() == written[0]["test"][1]


# --------------------------------------------------------------------------- balanced subsets
def test_balanced_subset_is_fixed_balanced_and_nested():
    labels = torch.tensor([c for c in range(3) for _ in range(5 + c)])  # 5, 6 and 7 examples
    nine = balanced_subset(labels, 9)
    assert torch.bincount(labels[nine], minlength=3).tolist() == [3, 3, 3]
    assert torch.equal(nine, balanced_subset(labels, 9))  # depends on labels and size only
    assert nine.tolist() == sorted(set(nine.tolist()))  # sorted, no duplicates
    assert set(nine.tolist()) < set(balanced_subset(labels, 10).tolist())  # nested
    # once a class runs out, the others fill the subset: class 0 holds only 5
    assert torch.bincount(labels[balanced_subset(labels, 17)], minlength=3).tolist() == [5, 6, 6]
    assert balanced_subset(labels, 18).tolist() == list(range(18))


@pytest.mark.parametrize("size", [0, 19, -1])
def test_balanced_subset_refuses_sizes_outside_the_split(size):
    labels = torch.tensor([c for c in range(3) for _ in range(6)])
    with pytest.raises(SmoothcertError, match="train_size must lie in 1..18"):
        balanced_subset(labels, size)


def test_subset_keeps_the_chosen_examples():
    data = load_dataset("digits", "train")
    idx = balanced_subset(data.labels, 50)
    part = data.subset(idx)
    assert len(part) == 50 and part.spec == data.spec
    assert torch.bincount(part.labels, minlength=10).tolist() == [5] * 10
    assert torch.equal(part.images, data.images[idx]) and torch.equal(part.labels, data.labels[idx])
