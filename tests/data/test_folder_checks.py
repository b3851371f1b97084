"""What the folder datasets (imagefolder, imagenet, segfolder) refuse, and how (Step 21,
"nothing silently wrong"): images beyond PIL's pixel limit, class names with control characters,
dangling symbolic links, each one line naming the file, with control characters escaped; and
the class names every dataset exposes (``class_names``, ``background_index``)."""

from __future__ import annotations

import os
import struct
import warnings
import zlib

import pytest
import torch
from PIL import Image
from test_dense_data import write_seg_folder

from conftest import CLASSES, write_folder
from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.data.formats import read_idx
from smoothcert.data.image_folders import _decode, _eval_transform
from smoothcert.data.registry import DATASETS, dataset_spec
from smoothcert.errors import SmoothcertError


def one_clean_line(message: str) -> str:
    """``message`` if it is one line of printable characters (no ESC, NUL, BEL, ...)."""
    assert message.isprintable(), repr(message)
    return message


def refused(call, match: str) -> str:
    with pytest.raises(SmoothcertError, match=match) as info:
        call()
    return one_clean_line(str(info.value))


# --------------------------------------------------------------------------- huge images
def png_bytes(width: int, height: int) -> bytes:
    """A valid all-black 1-bit grey PNG, written row by row: 14000×14000 takes ~25 KB and a
    fraction of a second (PIL would allocate a byte per pixel, 196 MB)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    row = bytes(1 + (width + 7) // 8)  # filter byte 0, then the packed bits
    packer = zlib.compressobj(9)
    idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def huge_png():
    return png_bytes(14000, 14000)  # 196,000,000 pixels: over PIL's 178,956,970


def test_the_fixture_is_a_real_14000_square_png(huge_png, tmp_path):
    (tmp_path / "huge.png").write_bytes(huge_png)
    Image.MAX_IMAGE_PIXELS, limit = None, Image.MAX_IMAGE_PIXELS
    try:
        with Image.open(tmp_path / "huge.png") as image:
            assert image.size == (14000, 14000) and image.mode == "1"
    finally:
        Image.MAX_IMAGE_PIXELS = limit


@pytest.mark.parametrize("where", ["imagefolder", "segfolder image", "segfolder mask"])
def test_an_image_over_pils_limit_is_one_line_naming_it(tmp_path, huge_png, where):
    if where == "imagefolder":
        root, name = write_folder(tmp_path / "data"), "imagefolder"
        path, idx = root / "val" / "bee" / "img1.png", 4
    else:
        root, name = write_seg_folder(tmp_path / "seg"), "segfolder"
        path, idx = root / "val" / where.split()[1].replace("image", "images") \
            .replace("mask", "masks") / "im0.png", 0
    path.write_bytes(huge_png)
    data = load_dataset(name, "test", root, image_size=8)
    data[idx + 1]  # the other images read
    message = refused(lambda: data[idx], "has 196,000,000 pixels, more than the 178,956,970")
    assert str(path) in message and "resize" in message and "rerun the same command" in message
    if name == "segfolder":
        assert "its mask alike" in message


def test_images_between_pils_warning_and_error_limits_decode_without_a_warning(
        tmp_path, monkeypatch):
    """PIL warns above MAX_IMAGE_PIXELS and refuses above twice it. write_folder's images are
    37×53 (1961 pixels), 64×41 (2624) and 29×29 (841): with the limit at 1000, the first is in
    the warning band, decoded exactly as PIL decodes it and silently; the second is refused."""
    root = write_folder(tmp_path / "data")
    data = load_dataset("imagefolder", "test", root, image_size=8)
    expected = _eval_transform(_decode(data.samples[0][0]), 8)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(data[0][0], expected)
        data.augmented(0, 1)[0]  # the training crops too
    assert not [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]
    refused(lambda: data[1], r"img1.png has 2,624 pixels, more than the 2,000")


def test_too_large_image_size_is_refused(tmp_path):
    root = write_folder(tmp_path / "data")
    refused(lambda: load_dataset("imagefolder", "test", root, image_size=14000),
            "--image-size 14000 makes 196,000,000-pixel inputs")


def test_cli_exits_2_with_one_line_on_a_huge_image(tmp_path, huge_png, capsys):
    root = write_folder(tmp_path / "data")
    (root / "train" / "cat" / "img0.jpg").write_bytes(huge_png)  # PIL reads it as a PNG
    code = main(["train", "--dataset", "imagefolder", "--data-root", str(root), "--image-size",
                 "8", "--arch", "digits_cnn", "--sigma", "0.25", "--epochs", "1", "--batch", "4",
                 "--out", str(tmp_path / "run"), "--device", "cpu", "--no-progress",
                 "--workers", "0"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert "img0.jpg has 196,000,000 pixels" in one_clean_line(captured.err.rstrip("\n"))


# --------------------------------------------------------------------------- control characters
HOSTILE = ["\x1b]0;pwned\x07", "\x1b[2J", "nul\x00byte", "left\u202eright", "a\u2028b",
           "file\x1cseparator", "c1\x9bcontrol", "del\x7f"]


@pytest.mark.parametrize("name", HOSTILE)
def test_classes_txt_refuses_a_control_character_quoted_on_one_line(tmp_path, name):
    root = write_seg_folder(tmp_path / "seg")
    (root / "classes.txt").write_text(f"background\n{name}\ndisk\n", encoding="utf-8")
    message = refused(lambda: load_dataset("segfolder", "test", root),
                      r"classes.txt line 2 names class '.*', which holds the control character")
    assert repr(name)[1:-1] in message  # quoted as repr escapes it


def test_classes_txt_with_terminal_escapes_exits_2_and_prints_none(tmp_path, capsys):
    root = write_seg_folder(tmp_path / "seg")
    (root / "classes.txt").write_text("\x1b]0;pwned\x07\n\x1b[2J\n\x00\n")
    code = main(["train", "--dataset", "segfolder", "--data-root", str(root), "--image-size",
                 "16", "--arch", "fcn_small", "--sigma", "0.25", "--epochs", "1",
                 "--out", str(tmp_path / "run"), "--device", "cpu", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    err = one_clean_line(captured.err.rstrip("\n"))
    assert "line 1 names class '\\x1b]0;pwned\\x07'" in err


def test_classes_txt_plain_names_byte_order_mark_and_line_ends(tmp_path):
    root = write_seg_folder(tmp_path / "seg")
    names = ("Background", "T-shirt/top", "猫 cat", "👩\u200d🔬", "café")
    (root / "classes.txt").write_bytes("\ufeff".encode() + "\r\n".join(names).encode()
                                       + b"\r\n \r\n")
    data = load_dataset("segfolder", "test", root)
    assert data.classes == names == data.class_names and data.background_index == 0


def test_image_folder_refuses_a_class_folder_with_a_control_character(tmp_path):
    root = write_folder(tmp_path / "data", classes=("ant", "bee\x1b[2J"))
    message = refused(lambda: load_dataset("imagefolder", "test", root),
                      r"val has the class folder 'bee\\x1b\[2J', which holds the control")
    assert "rename the folder" in message


@pytest.mark.parametrize("dataset", ["imagefolder", "segfolder", "mnist"])
def test_paths_in_messages_are_escaped(tmp_path, dataset):
    missing = tmp_path / "data\x1b]0;pwned\x07"
    message = refused(lambda: load_dataset(dataset, "test", missing), "is not a folder")
    assert "data\\x1b]0;pwned\\x07" in message
    bad = tmp_path / "labels\x1b[2J.idx"
    bad.write_bytes(b"\x1b[2J not an IDX file")
    refused(lambda: read_idx(bad), r"labels\\x1b\[2J.idx is not an unsigned-byte IDX file")


def test_a_corrupt_image_named_with_escapes_is_escaped(tmp_path):
    root = write_folder(tmp_path / "data")
    (root / "val" / "bee" / "img\x1b[2J.png").write_bytes(b"not a png")
    data = load_dataset("imagefolder", "test", root, image_size=8)
    bad = [i for i, (path, _) in enumerate(data.samples) if "\x1b" in path][0]
    refused(lambda: data[bad], r"cannot decode image .*img\\x1b\[2J.png")


# --------------------------------------------------------------------------- dangling links
def dangle(link, target="/nonexistent/gone.png"):
    if link.exists() or link.is_symlink():
        link.unlink()
    os.symlink(target, link)


@pytest.mark.parametrize("where", ["images/zz.png", "masks/im1.png", "images/im1.png"])
def test_segfolder_refuses_a_dangling_link(tmp_path, where):
    root = write_seg_folder(tmp_path / "seg")
    dangle(root / "val" / where)
    message = refused(lambda: load_dataset("segfolder", "test", root),
                      f"val/{where} is a symbolic link to /nonexistent/gone.png, which does "
                      "not exist")
    assert "class folder" not in message


@pytest.mark.parametrize("where", ["bee/zz.png", "aardvark", "ant/img0.jpg"])
def test_image_folder_refuses_a_dangling_link(tmp_path, where):
    """A dangling class-folder link ("aardvark", sorted first) would shift every label."""
    root = write_folder(tmp_path / "data")
    dangle(root / "val" / where, "/nonexistent/gone")
    refused(lambda: load_dataset("imagefolder", "test", root),
            f"val/{where} is a symbolic link to /nonexistent/gone, which does not exist")


def test_links_that_resolve_are_read(tmp_path):
    root = write_folder(tmp_path / "data")
    os.symlink(root / "val" / "bee" / "img1.png", root / "val" / "ant" / "linked.png")
    os.symlink(root / "val" / "cat", root / "val" / "cow")
    data = load_dataset("imagefolder", "test", root, image_size=8)
    assert data.classes == (*CLASSES, "cow") and len(data) == 13
    seg = write_seg_folder(tmp_path / "seg")
    os.symlink(seg / "val" / "masks" / "im0.png", seg / "val" / "masks" / "im9.png")
    os.symlink(seg / "val" / "images" / "im0.png", seg / "val" / "images" / "im9.png")
    assert torch.equal(load_dataset("segfolder", "test", seg, image_size=8)[3][1],
                       load_dataset("segfolder", "test", seg, image_size=8)[0][1])


def test_segfolder_messages_speak_of_its_layout(tmp_path):
    root = write_seg_folder(tmp_path / "seg")
    for sub in ("images", "masks"):
        for f in (root / "val" / sub).iterdir():
            f.unlink()
    message = refused(lambda: load_dataset("segfolder", "test", root), "holds no image files")
    assert "class folder" not in message and "val/images" in message
    refused(lambda: load_dataset("segfolder", "train", tmp_path / "nothing"), "is not a folder")


# --------------------------------------------------------------------------- class names
DIGITS = tuple("0123456789")
FASHION = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot")
CIFAR10 = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
           "truck")
NAMES = {"digits": DIGITS, "mnist": DIGITS, "fashion-mnist": FASHION, "cifar10": CIFAR10,
         "fashion-mnist-seg": ("background", *FASHION), "fashion-mnist-box": None,
         "imagenet": None, "imagefolder": None, "segfolder": None}  # folders: set when scanned
BACKGROUND = {"fashion-mnist-seg": 0}


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_every_registered_dataset_names_its_classes_or_says_none(name):
    spec = dataset_spec(name)
    assert spec.class_names == NAMES[name]
    if spec.class_names is not None:
        assert len(spec.class_names) == spec.num_classes
        assert all(isinstance(c, str) and c.isprintable() for c in spec.class_names)
    assert spec.background_index == BACKGROUND.get(name)


def test_loaded_datasets_expose_class_names(tmp_path):
    digits = load_dataset("digits", "test")
    assert digits.class_names == DIGITS and digits.background_index is None
    folder = load_dataset("imagefolder", "test", write_folder(tmp_path / "data"), image_size=8)
    assert folder.class_names == CLASSES and folder.background_index is None
    assert folder.subset(torch.tensor([0])).class_names == CLASSES
    seg = load_dataset("segfolder", "test", write_seg_folder(tmp_path / "seg"), image_size=8)
    assert seg.class_names == ("background", "square", "disk") and seg.background_index == 0
    assert seg.augmented(0, 1).class_names == seg.class_names


@pytest.mark.parametrize("names, index", [(("sky", "road", "BACKGROUND"), 2),
                                          (("sky", "road"), None),
                                          (("backgrounds", "road"), None)])
def test_segfolder_background_index_from_classes_txt(tmp_path, names, index):
    root = write_seg_folder(tmp_path / "seg")
    (root / "classes.txt").write_text("\n".join(names) + "\n")
    assert load_dataset("segfolder", "test", root).background_index == index


def test_imagenet_class_names_are_its_folder_wnids(tmp_path):
    from test_imagenet import write_imagenet_val

    data = load_dataset("imagenet", "test", write_imagenet_val(tmp_path / "imagenet"))
    assert data.class_names == data.classes and data.class_names[1] == "n00000001"
    assert len(data.class_names) == 1000
