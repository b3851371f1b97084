"""A resumed run never appends to a file whose rows it no longer matches (issue 45, Step 21):
a segmentation folder changed since the file was written is refused, in-memory data files are
compared by their SHA-256, and a done row whose map is missing or another is redone."""

import logging
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from smoothcert.data.datasets import load_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.runs import certify_dataset
from smoothcert.runs.artifacts import artifact_path, read_artifact
from smoothcert.runs.records import manifest_path, read_manifest, read_records
from smoothcert.runs.same_data import check_same_data


class Thresholds(nn.Module):
    """Each pixel's class by its mean value: class 0 below 1/3, 1 up to 2/3, 2 above."""

    task, num_classes = "segmentation", 3

    def forward(self, x):
        m = x.mean(dim=1, keepdim=True)
        return torch.cat([torch.zeros_like(m), 6 * m - 2, 12 * m - 6], dim=1)


def write_pair(root, name: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(root / "val" / "images" / f"{name}.png")
    mask = rng.integers(0, 3, (8, 8), dtype=np.uint8)
    Image.fromarray(mask, mode="L").save(root / "val" / "masks" / f"{name}.png")


@pytest.fixture
def seg_root(tmp_path):
    root = tmp_path / "seg"
    for sub in ("images", "masks"):
        (root / "val" / sub).mkdir(parents=True)
    for i in range(3):
        write_pair(root, f"im{i}", seed=i)
    (root / "classes.txt").write_text("a\nb\nc\n")
    return root


def segment(root, out, max_count):
    data = load_dataset("segfolder", "test", root, image_size=8)
    return certify_dataset(Thresholds(), data, certifier="segment", sigma=0.1, n0=10, n=40,
                           batch=64, seed=1, max_count=max_count, out=out,
                           options={"tau": 0.75})


def without_time(rows):
    return [{k: v for k, v in r.items() if k != "time"} for r in rows]


# --------------------------------------------------------------------------- the data changed
def remove_first(root):
    (root / "val" / "images" / "im0.png").unlink()


def add_first(root):
    write_pair(root, "a0", seed=9)  # sorts before im0: every idx moves by one


def rename_first(root):
    for sub in ("images", "masks"):
        os.rename(root / "val" / sub / "im0.png", root / "val" / sub / "im9.png")


@pytest.mark.parametrize(("change", "says"), [
    (remove_first, "1 image gone, 3 then and 2 now"),
    (add_first, "1 image added, 3 then and 4 now"),
    (rename_first, "images renamed or replaced, the same 3 but another file list"),
])
def test_a_changed_segmentation_folder_is_not_resumed(seg_root, tmp_path, change, says):
    """Before: each resumed with exit 0 and appended idx 1, now another image than the one
    the run would have read (the manifest's dataset_size and its provenance disagreeing)."""
    out = tmp_path / "r.tsv"
    segment(seg_root, out, max_count=1)
    before = out.read_bytes(), manifest_path(out).read_bytes()
    change(seg_root)
    with pytest.raises(SmoothcertError) as caught:
        segment(seg_root, out, max_count=2)
    message = str(caught.value)
    assert "\n" not in message and f"{out} was made from other data" in message
    assert says in message and "choose another --out" in message
    assert (out.read_bytes(), manifest_path(out).read_bytes()) == before


def test_the_same_listing_moved_and_touched_resumes(seg_root, tmp_path):
    """What may differ: the folder's place (another --data-root) and the files' times."""
    out = tmp_path / "r.tsv"
    segment(seg_root, out, max_count=1)
    moved = shutil.copytree(seg_root, tmp_path / "moved")
    for image in (moved / "val" / "images").iterdir():
        os.utime(image, (1, 1))
    rows = segment(moved, out, max_count=2)
    assert [r["idx"] for r in rows] == [0, 1]
    assert without_time(rows) == without_time(segment(seg_root, tmp_path / "w.tsv", 2))
    files = read_manifest(out)["provenance"]["data_files"]
    assert files["image_files"] == 3 and len(files["listing_sha256"]) == 64


def files_manifest(*files):
    return {"provenance": {"data_files": {"files": list(files)}}}


def test_in_memory_data_files_are_compared_by_their_hash():
    a = {"path": "/old/t10k-images.gz", "bytes": 10, "mtime": "2020", "sha256": "a" * 64}
    moved = {**a, "path": "/new/t10k-images.gz", "mtime": "2024"}  # another copy: resumes
    check_same_data("r.tsv", files_manifest(a), {"files": [moved]})
    changed = {**moved, "sha256": "b" * 64}
    with pytest.raises(SmoothcertError, match=r"/new/t10k-images.gz differs from "
                                              r"/old/t10k-images.gz as it was read \(SHA-256\)"):
        check_same_data("r.tsv", files_manifest(a), {"files": [changed]})
    big = {k: v for k, v in a.items() if k != "sha256"}  # over the hashed size: by its size
    check_same_data("r.tsv", files_manifest(big), {"files": [moved]})
    with pytest.raises(SmoothcertError, match=r"as it was read \(size\)"):
        check_same_data("r.tsv", files_manifest(big), {"files": [{**moved, "bytes": 11}]})
    with pytest.raises(SmoothcertError, match="read from 1 files then, 2 now"):
        check_same_data("r.tsv", files_manifest(a), {"files": [a, a]})
    check_same_data("r.tsv", {"provenance": {}}, {"files": [a]})  # a file from before: as it was


# --------------------------------------------------------------------------- done rows' maps
class Masks(torch.utils.data.TensorDataset):
    task, ignore_index = "segmentation", 255


def masks(count=3):
    g = torch.Generator().manual_seed(0)
    return Masks(torch.rand(count, 1, 4, 4, generator=g),
                 torch.randint(0, 3, (count, 4, 4), generator=g))


def certify_maps(out):
    return certify_dataset(Thresholds(), masks(), certifier="segment", sigma=0.1, n0=10, n=40,
                           batch=64, seed=2, num_classes=3, out=out, options={"tau": 0.75})


@pytest.mark.parametrize("damage", ["missing", "garbage", "another row's"])
def test_a_done_rows_missing_or_wrong_map_is_redone(tmp_path, caplog, damage):
    """Before: the resume saw every row done and left the file naming a map that is not
    there (or not its own): exit 0, and a report refused it later."""
    out = tmp_path / "r.tsv"
    whole = certify_maps(out)
    target = artifact_path(out, "map", 1)
    if damage == "missing":
        target.unlink()
    elif damage == "garbage":
        target.write_bytes(b"not a png")
    else:
        shutil.copyfile(artifact_path(out, "map", 2), target)
    kept = artifact_path(out, "map", 0).stat().st_mtime_ns
    with caplog.at_level(logging.WARNING):
        resumed = certify_maps(out)
    assert f"the images of 1 examples are missing or not their rows' (first: {target}); " \
        "redoing those examples" in caplog.text
    assert [r["idx"] for r in resumed] == [0, 2, 1]  # redone, so appended at the end
    by_idx = {r["idx"]: r for r in without_time(resumed)}
    assert [by_idx[i] for i in range(3)] == without_time(whole)
    for row in read_records(out).rows():  # every map is its row's again
        read_artifact(out, "map", row["idx"], row["map_sha256"])
    assert artifact_path(out, "map", 0).stat().st_mtime_ns == kept  # only the lost one redone
