"""The dense datasets: fashion-mnist-seg and fashion-mnist-box against a per-image numpy oracle
(on tiny IDX files and, when installed, the real test split), and segfolder on folders written
here: image and mask kept aligned through every transform, bad layouts as one error line."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch
from PIL import Image

from smoothcert.data import formats
from smoothcert.data.datasets import load_dataset
from smoothcert.data.dense import IGNORE_INDEX, THRESHOLD, item_boxes, segmentation_masks
from smoothcert.data.formats import read_idx
from smoothcert.data.image_folders import _decode, _eval_transform, _train_transform
from smoothcert.data.registry import dataset_spec
from smoothcert.errors import SmoothcertError
from smoothcert.rng import derived_seed

REAL_FASHION_MNIST_DIR = formats.FASHION_MNIST_SYSTEM_DIR  # before any test patches it


@pytest.fixture(autouse=True)
def no_system_data(tmp_path, monkeypatch):
    """No system-wide Fashion-MNIST and no user cache unless a test asks for them."""
    monkeypatch.setattr(formats, "FASHION_MNIST_SYSTEM_DIR", tmp_path / "no-system-data")
    monkeypatch.setattr(formats, "default_cache_dir", lambda: tmp_path / "cache")


# --------------------------------------------------------------------------- the derivation
def oracle(image: np.ndarray, cls: int) -> tuple[np.ndarray, np.ndarray]:
    """One image's mask and box, pixel by pixel, as the module's docstring states them."""
    mask = np.zeros(image.shape, dtype=np.int64)
    for (r, c), v in np.ndenumerate(image):
        mask[r, c] = cls + 1 if v > THRESHOLD else (IGNORE_INDEX if v > 0 else 0)
    rows, cols = np.nonzero(image > THRESHOLD)
    box = np.array([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1], dtype=np.float32)
    return mask, box


def sparse_images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (n, 1, 28, 28) with background 0, a faint band and a bright item somewhere."""
    rng = np.random.default_rng(seed)
    images = np.zeros((n, 28, 28), dtype=np.uint8)
    for i in range(n):
        top, left = rng.integers(0, 20, size=2)
        h, w = rng.integers(1, 28 - top), rng.integers(1, 28 - left)
        images[i, top:top + h, left:left + w] = rng.integers(0, 256, size=(h, w))
        images[i, top, left] = 200  # at least one item pixel
    return torch.from_numpy(images).unsqueeze(1), torch.from_numpy(rng.integers(0, 10, n))


def test_masks_and_boxes_match_the_pixelwise_oracle():
    images, classes = sparse_images(40, seed=1)
    masks, boxes = segmentation_masks(images, classes), item_boxes(images)
    assert masks.dtype == torch.uint8 and masks.shape == (40, 28, 28)
    assert boxes.dtype == torch.float32 and boxes.shape == (40, 4)
    for i in range(40):
        mask, box = oracle(images[i, 0].numpy(), int(classes[i]))
        assert np.array_equal(masks[i].numpy(), mask)
        assert np.array_equal(boxes[i].numpy(), box)
    # the band is really exercised: all three kinds of label occur
    assert {0, IGNORE_INDEX} < set(masks.unique().tolist())


def test_box_is_tight_and_holds_every_item_pixel():
    images, _ = sparse_images(40, seed=2)
    boxes = item_boxes(images).to(torch.int64)
    for image, (x0, y0, x1, y1) in zip(images[:, 0] > THRESHOLD, boxes.tolist()):
        assert image.sum() == image[y0:y1, x0:x1].sum()  # every item pixel inside
        # tight: each of the four edge lines of the box holds an item pixel
        assert image[y0, x0:x1].any() and image[y1 - 1, x0:x1].any()
        assert image[y0:y1, x0].any() and image[y0:y1, x1 - 1].any()
    one = torch.zeros(1, 1, 28, 28, dtype=torch.uint8)
    one[0, 0, 5, 9] = THRESHOLD + 1  # row 5, column 9: covers [9, 10) × [5, 6)
    assert item_boxes(one).tolist() == [[9.0, 5.0, 10.0, 6.0]]
    one[0, 0, 5, 9] = THRESHOLD  # at the threshold: not the item's
    with pytest.raises(SmoothcertError, match="image 0 has no pixel above 25"):
        item_boxes(one)


def test_specs():
    base = dataset_spec("fashion-mnist")
    seg, box = dataset_spec("fashion-mnist-seg"), dataset_spec("fashion-mnist-box")
    assert (seg.task, seg.num_classes, seg.ignore_index) == ("segmentation", 11, 255)
    assert (box.task, box.num_classes, box.ignore_index) == ("regression", 4, None)
    for spec in (seg, box):
        assert (spec.input_shape, spec.mean, spec.std) == (base.input_shape, base.mean, base.std)
    folder = dataset_spec("segfolder")
    assert (folder.task, folder.ignore_index, folder.num_classes) == ("segmentation", 255, 0)


# --------------------------------------------------------------------------- through load_dataset
def write_idx(path, array: np.ndarray) -> None:
    raw = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(raw + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def test_loaded_from_tiny_idx_files_deterministically(tmp_path):
    images, classes = sparse_images(6, seed=3)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images[:, 0].numpy())
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", classes.numpy().astype(np.uint8))
    plain = load_dataset("fashion-mnist", "test", tmp_path, download=False)
    seg = load_dataset("fashion-mnist-seg", "test", tmp_path, download=False)
    box = load_dataset("fashion-mnist-box", "test", tmp_path, download=False)
    for data in (seg, box):  # the same pixels and files as fashion-mnist's
        assert torch.equal(data.images, plain.images) and data.files == plain.files
    assert torch.equal(seg.labels, segmentation_masks(images, classes))
    assert torch.equal(box.labels, item_boxes(images))
    x, y = seg.example(2)
    assert x.shape == (1, 28, 28) and y.dtype == torch.int64 and y.shape == (28, 28)
    assert torch.equal(y, seg.labels[2])
    x, y = box.example(2)
    assert y.dtype == torch.float32 and y.shape == (4,)
    again = load_dataset("fashion-mnist-seg", "test", tmp_path, download=False)
    assert torch.equal(again.labels, seg.labels)
    with pytest.raises(SmoothcertError, match="fashion-mnist IDX files not found"):
        load_dataset("fashion-mnist-box", "train", tmp_path, download=False)


def test_real_fashion_mnist_test_split(monkeypatch):
    if not REAL_FASHION_MNIST_DIR.is_dir():
        pytest.skip("Debian package dataset-fashion-mnist is not installed")
    monkeypatch.setattr(formats, "FASHION_MNIST_SYSTEM_DIR", REAL_FASHION_MNIST_DIR)
    seg = load_dataset("fashion-mnist-seg", "test", download=False)
    box = load_dataset("fashion-mnist-box", "test", download=False)
    # the classes from their own file (the images are fashion-mnist's: see the test above)
    classes = torch.from_numpy(read_idx(REAL_FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz")
                               .astype(np.int64))
    values, masks = seg.images[:, 0], seg.labels
    assert torch.equal(box.images, seg.images)
    item = (masks >= 1) & (masks <= 10)
    assert torch.equal(item, values > THRESHOLD)  # nonzero class exactly where v passes
    assert torch.equal(masks == IGNORE_INDEX, (values > 0) & (values <= THRESHOLD))
    assert torch.equal(masks[item], (classes.view(-1, 1, 1).expand_as(masks) + 1)[item])
    # the figures of the module's docstring: 45.4 % item pixels, 4.6 % band, >= 53 per image
    assert round(item.double().mean().item(), 3) == 0.454
    assert round((masks == IGNORE_INDEX).double().mean().item(), 3) == 0.046
    assert int(item.flatten(1).sum(1).min()) == 53
    for i in range(0, 10_000, 389):  # the oracle on a spread of 26 images
        mask, expected = oracle(values[i].numpy(), int(classes[i]))
        assert np.array_equal(masks[i].numpy(), mask)
        assert np.array_equal(box.labels[i].numpy(), expected)
    assert float(box.labels.min()) >= 0 and float(box.labels.max()) <= 28


# --------------------------------------------------------------------------- segfolder
CLASSES = ("background", "square", "disk")
# Each label's colour: affinely independent, so no blend of some labels' colours (bilinear,
# antialiased resizing) comes within 2/255 of another label's: such a pixel's label is sure.
COLOURS = {0: (0, 0, 0), 1: (255, 0, 0), 2: (0, 255, 0), IGNORE_INDEX: (0, 0, 255)}
PALETTE = [255 - v for v in range(256) for _ in range(3)]  # colours unlike the indices


def blocky_mask(h: int, w: int, seed: int) -> np.ndarray:
    """Large blocks of labels 0, 1, 2 and 255, so most pixels are far from a boundary."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((h, w), dtype=np.uint8)
    for label in (1, 2, IGNORE_INDEX):
        top, left = rng.integers(0, h // 2), rng.integers(0, w // 2)
        mask[top:top + h // 2, left:left + w // 2] = label
    return mask


def write_pair(split_dir, name: str, size, seed: int, ext=".png", palette=False) -> None:
    mask = blocky_mask(*size, seed)
    rgb = np.zeros((*size, 3), dtype=np.uint8)
    for label, colour in COLOURS.items():
        rgb[mask == label] = colour
    Image.fromarray(rgb).save(split_dir / "images" / f"{name}{ext}")
    out = Image.fromarray(mask, mode="L")
    if palette:  # VOC's SegmentationClass PNGs: palette indices are the class ids
        out = out.convert("P")
        out.putpalette(PALETTE)
    out.save(split_dir / "masks" / f"{name}.png")


def write_seg_folder(root, sizes=((37, 53), (48, 40), (45, 45))):
    for s, split in enumerate(("train", "val")):
        for sub in ("images", "masks"):
            (root / split / sub).mkdir(parents=True)
        for i, size in enumerate(sizes):
            write_pair(root / split, f"im{i}", size, seed=10 * s + i, palette=i == 1)
    (root / "classes.txt").write_text("\n".join(CLASSES) + "\n\n")
    return root


@pytest.fixture(scope="module")
def seg_root(tmp_path_factory):
    return write_seg_folder(tmp_path_factory.mktemp("seg"))


def agreement(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(fraction of pixels whose colour is one label's, within 2/255 per channel; fraction of
    those whose mask label is that label): 1.0 is image and mask aligned."""
    sure = torch.zeros_like(y, dtype=torch.bool)
    same = torch.zeros_like(sure)
    for label, colour in COLOURS.items():
        here = ((x * 255 - torch.tensor(colour).view(3, 1, 1)).abs() <= 2).all(dim=0)
        sure |= here
        same |= here & (y == label)
    return sure.float().mean().item(), (same.sum() / sure.sum()).item()


def test_segfolder_eval_keeps_image_and_mask_aligned(seg_root):
    data = load_dataset("segfolder", "test", seg_root, image_size=16)
    assert len(data) == 3 and data.classes == CLASSES and data.num_classes == 3
    assert data.input_shape == (3, 16, 16) and data.spec.task == "segmentation"
    for idx, (image_path, _) in enumerate(data.samples):
        x, y = data[idx]
        assert torch.equal(x, _eval_transform(_decode(image_path), 16))  # imagefolder's pixels
        assert y.dtype == torch.int64 and y.shape == (16, 16)
        assert set(y.unique().tolist()) <= {0, 1, 2, IGNORE_INDEX}
        sure, same = agreement(x, y)
        assert sure > 0.6 and same == 1.0
        assert agreement(x, y.flip(1))[1] < 0.9  # unsound control: a mask flipped alone
    x, y = data.batch(torch.tensor([2, 0]))
    assert x.shape == (2, 3, 16, 16) and torch.equal(y, torch.stack([data[2][1], data[0][1]]))
    assert torch.equal(data.labels, torch.stack([data[i][1] for i in range(3)]))
    assert data.example(1)[1].shape == (16, 16)


def test_segfolder_training_crops_move_the_mask_with_the_image(seg_root):
    data = load_dataset("segfolder", "train", seg_root, image_size=20)
    flipped = 0
    for epoch in range(4):
        aug = data.augmented(7, epoch)
        for idx, (image_path, _) in enumerate(data.samples):
            x, y = aug[idx]
            gen = torch.Generator().manual_seed(derived_seed(7, epoch, idx))
            assert torch.equal(x, _train_transform(_decode(image_path), 20, gen))
            sure, same = agreement(x, y)
            assert same == 1.0, (epoch, idx)
            flipped += agreement(x, y.flip(1))[1] < 0.9
    assert flipped >= 6  # the control catches most misaligned masks
    assert torch.equal(data.augmented(7, 1)[2][1], data.augmented(7, 1)[2][1])


def broken(root, case: str):
    val = root / "val"
    if case == "missing mask":
        (val / "masks" / "im1.png").unlink()
    elif case == "no classes file":
        (root / "classes.txt").unlink()
    elif case == "blank class":
        (root / "classes.txt").write_text("background\n\ndisk\n")
    elif case == "no masks folder":
        for f in (val / "masks").iterdir():
            f.unlink()
        (val / "masks").rmdir()
    elif case == "two images one stem":
        Image.new("RGB", (8, 8)).save(val / "images" / "im1.jpg")


@pytest.mark.parametrize("case, match", [
    ("missing mask", r"image .*im1.png has no mask .*masks/im1.png; add it"),
    ("no classes file", r"classes.txt not found"),
    ("blank class", r"classes.txt line 2 is blank"),
    ("no masks folder", r"val has no masks/ folder"),
    ("two images one stem", r"several images named 'im1'"),
])
def test_segfolder_bad_layout_is_one_error_at_scan(tmp_path, case, match):
    root = write_seg_folder(tmp_path / "seg")
    broken(root, case)
    with pytest.raises(SmoothcertError, match=match) as info:
        load_dataset("segfolder", "test", root)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("case, match", [
    ("size", r"mask .*im0.png is 30×20 but its image .*im0.png is 53×37"),
    ("value", r"mask .*im0.png holds value 7, neither a class id 0..2 nor 255"),
    ("rgb", r"mask .*im0.png is a RGB image"),
    ("corrupt", r"cannot decode mask .*im0.png"),
])
def test_segfolder_bad_mask_is_one_error_when_read(tmp_path, case, match):
    root = write_seg_folder(tmp_path / "seg")
    mask = root / "val" / "masks" / "im0.png"
    if case == "size":
        Image.new("L", (30, 20)).save(mask)
    elif case == "value":
        Image.new("L", (53, 37), color=7).save(mask)
    elif case == "rgb":
        Image.new("RGB", (53, 37)).save(mask)
    else:
        mask.write_bytes(b"not a png")
    data = load_dataset("segfolder", "test", root, image_size=8)
    assert data[1][1].shape == (8, 8)  # the other pairs read
    with pytest.raises(SmoothcertError, match=match) as info:
        data[0]
    assert "\n" not in str(info.value) and "rerun the same command to resume" in str(info.value)


def test_segfolder_needs_a_data_root():
    with pytest.raises(SmoothcertError, match="segfolder reads a segmentation folder"):
        load_dataset("segfolder", "test")
