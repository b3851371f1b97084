"""Streamed image folders (imagenet, imagefolder): transforms against torchvision's, the layout's
bad inputs, and the CLI end to end on folders the tests write (JPEG and PNG, odd sizes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

from conftest import CLASSES, write_folder
from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.data.image_folders import _crop_box, eval_resize
from smoothcert.errors import SmoothcertError
from smoothcert.runs.records import read_records


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("folder"))


# --------------------------------------------------------------------------- transforms
def test_eval_transform_is_torchvisions_resize_center_crop(folder):
    data = load_dataset("imagefolder", "test", folder, image_size=32)
    reference = T.Compose([T.Resize(eval_resize(32)), T.CenterCrop(32), T.ToTensor()])
    assert data.classes == CLASSES and len(data) == 9 and data.input_shape == (3, 32, 32)
    for idx, (path, label) in enumerate(data.samples):
        x, y = data[idx]
        assert y == label == idx // 3
        assert torch.equal(x, reference(Image.open(path).convert("RGB")))
    assert eval_resize(224) == 256  # Cohen et al.'s ImageNet Resize(256) + CenterCrop(224)


def test_train_transform_is_torchvisions_draw_for_draw():
    """RandomResizedCrop(S) + RandomHorizontalFlip() with torch.manual_seed(s) equals ours with
    a generator seeded s: the same crops and flips, from an explicit generator."""
    from smoothcert.data.image_folders import _train_transform

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (61, 83, 3), np.uint8))
    reference = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()])
    for seed in range(60):
        torch.manual_seed(seed)
        expected = reference(image)
        assert torch.equal(_train_transform(image, 24, torch.Generator().manual_seed(seed)),
                           expected)
    for seed in range(60):  # a thin image exercises the fallback (central crop)
        torch.manual_seed(seed)
        thin = T.RandomResizedCrop.get_params(Image.new("RGB", (5, 400)), [0.08, 1.0],
                                              [3 / 4, 4 / 3])
        assert _crop_box(400, 5, torch.Generator().manual_seed(seed)) == thin


def test_training_crops_depend_on_seed_epoch_idx_only(folder):
    data = load_dataset("imagefolder", "train", folder, image_size=16)
    a, b = data.augmented(0, 1), data.augmented(0, 2)
    assert torch.equal(a[4][0], data.augmented(0, 1)[4][0])  # reproducible: resume-exact
    assert not torch.equal(a[4][0], b[4][0])  # a new epoch, new crops
    x, y = a.batch(torch.tensor([4, 0]))
    assert x.shape == (2, 3, 16, 16) and y.tolist() == [1, 0]
    assert torch.equal(x[0], a[4][0])


# --------------------------------------------------------------------------- bad layouts
def bad_layout(tmp_path, case):
    root = tmp_path / "data"
    if case == "no val":
        write_folder(root, splits=("train",))
    elif case == "empty class":
        write_folder(root)
        (root / "val" / "dog").mkdir()
    elif case == "empty split":
        write_folder(root, splits=("train",))
        (root / "val").mkdir()
    elif case == "no root":
        pass
    return root


@pytest.mark.parametrize("case, match", [
    ("no val", r"has no val/ or test/ folder"),
    ("empty class", r"class folder .*dog holds no image files"),
    ("empty split", r"val has no class folders"),
    ("no root", r"is not a folder"),
])
def test_bad_layout_is_one_clear_error(tmp_path, case, match):
    root = bad_layout(tmp_path, case)
    with pytest.raises(SmoothcertError, match=match):
        load_dataset("imagefolder", "test", root)


def test_imagenet_needs_its_1000_classes_and_a_data_root(folder):
    with pytest.raises(SmoothcertError, match="3 class folders, imagenet has 1000"):
        load_dataset("imagenet", "test", folder)
    with pytest.raises(SmoothcertError, match="pass --data-root"):
        load_dataset("imagenet", "test")
    with pytest.raises(SmoothcertError, match="evaluated at 224"):
        load_dataset("imagenet", "test", folder, image_size=32)
    with pytest.raises(SmoothcertError, match="--image-size is for image folders"):
        load_dataset("digits", "test", image_size=32)


def test_corrupt_image_names_the_file(tmp_path):
    root = write_folder(tmp_path / "data")
    bad = root / "val" / "bee" / "img1.png"
    bad.write_bytes(b"not a png")
    data = load_dataset("imagefolder", "test", root, image_size=16)
    with pytest.raises(SmoothcertError, match=r"cannot decode image .*bee/img1.png"):
        data[4]


# --------------------------------------------------------------------------- the CLI
def run(*argv):
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def resnet18_run(folder, tmp_path_factory):
    """A torchvision ResNet-18 trained one epoch on the folder (16×16 inputs)."""
    out = tmp_path_factory.mktemp("r18")
    assert run("train", "--dataset", "imagefolder", "--data-root", folder, "--image-size", 16,
               "--arch", "torchvision:resnet18", "--method", "gaussian", "--sigma", 0.25,
               "--epochs", 1, "--batch", 4, "--lr", 0.01, "--out", out, "--device", "cpu",
               "--no-progress") == 0
    return out / "checkpoint.pt"


CERTIFY = ("--n0", 8, "--n", 40, "--batch", 32, "--device", "cpu", "--no-progress")


def test_train_stores_classes_and_arch(resnet18_run):
    meta = torch.load(resnet18_run, weights_only=True)["meta"]
    assert meta["classes"] == list(CLASSES) and meta["arch"] == "torchvision:resnet18"
    assert meta["input_shape"] == [3, 16, 16]


def test_certify_folder_resume_and_shards_equal_one_run(folder, resnet18_run, tmp_path):
    whole = tmp_path / "whole.tsv"
    assert run("certify", resnet18_run, "--data-root", folder, "--workers", 1, *CERTIFY,
               "--max", 3, "--out", whole) == 0
    # grow the run: --max 3 -> all 9 is another configuration; the same command resumes
    assert run("certify", resnet18_run, "--data-root", folder, "--workers", 0, *CERTIFY,
               "--max", 3, "--out", whole) == 0
    assert len(read_records(whole)) == 3
    full = tmp_path / "full.tsv"
    assert run("certify", resnet18_run, "--data-root", folder, *CERTIFY, "--out", full) == 0
    for k in range(2):
        assert run("certify", resnet18_run, "--data-root", folder, "--workers", 2, *CERTIFY,
                   "--num-shards", 2, "--shard-index", k, "--out", tmp_path / "s.tsv") == 0
    merged = tmp_path / "merged.tsv"
    shards = sorted(tmp_path.glob("s.shard*-of-2.tsv"))
    assert run("merge", *shards, "--out", merged) == 0
    a, b = read_records(full), read_records(merged)
    for column in ("idx", "label", "predict", "radius", "nA", "p_lower"):
        assert np.array_equal(a[column], b[column]), column
    first = read_records(whole)
    assert np.array_equal(first["nA"], a["nA"][:3])  # workers do not change the rows


def test_certify_refuses_other_classes(tmp_path, resnet18_run, capsys):
    other = write_folder(tmp_path / "other", classes=("ant", "bee", "dog"))
    out = tmp_path / "c.tsv"
    assert run("certify", resnet18_run, "--data-root", other, *CERTIFY, "--out", out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "classes differ" in err and "dog" in err
    assert not out.exists()


@pytest.mark.parametrize("extra, match", [
    (("--workers", -1), "workers must be an integer >= 0"),
    (("--image-size", 8, "--dataset", "imagefolder"), "expects inputs of shape"),
])
def test_certify_bad_folder_flags(folder, resnet18_run, tmp_path, capsys, extra, match):
    out = tmp_path / "c.tsv"
    assert run("certify", resnet18_run, "--data-root", folder, *CERTIFY, *extra,
               "--out", out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err
    assert not out.exists()


def test_corrupt_image_stops_cleanly_and_resumes(tmp_path, resnet18_run):
    root = write_folder(tmp_path / "data")
    good = (root / "val" / "bee" / "img1.png").read_bytes()
    (root / "val" / "bee" / "img1.png").write_bytes(b"broken")
    out = tmp_path / "c.tsv"
    args = ("certify", resnet18_run, "--data-root", root, *CERTIFY, "--workers", 1,
            "--out", out)
    assert run(*args) == 2
    kept = read_records(out)
    assert 4 not in set(kept["idx"].tolist())
    (root / "val" / "bee" / "img1.png").write_bytes(good)
    assert run(*args) == 0
    assert sorted(read_records(out)["idx"].tolist()) == list(range(9))


def test_unknown_torchvision_and_timm_names(folder, tmp_path, capsys):
    base = ("train", "--dataset", "imagefolder", "--data-root", folder, "--image-size", 16,
            "--method", "gaussian", "--sigma", 0.25, "--epochs", 1, "--device", "cpu",
            "--no-progress", "--out", tmp_path / "r")
    assert run(*base, "--arch", "torchvision:resnet1") == 2
    assert "close names: resnet18" in capsys.readouterr().err
    assert run(*base, "--arch", "torchvision:vit_b_16") == 2
    assert "cannot take 3×16×16 inputs" in capsys.readouterr().err
    assert run(*base, "--arch", "lenet", "--arch-param", "depth=3") == 2
    assert "arch 'lenet' takes no arch parameters, got depth" in capsys.readouterr().err


def test_training_does_not_depend_on_decoding_workers(folder, tmp_path):
    """The same run decoded in the step (0 workers) and by 2 DataLoader workers ends with the
    same weights: crops come from (seed, epoch, idx), not from the process that decodes."""
    from smoothcert.training import TrainConfig, train

    config = TrainConfig(dataset="imagefolder", arch="torchvision:resnet18", sigma=0.25,
                         epochs=1, batch_size=4, lr=0.01, data_root=str(folder), image_size=16)
    weights = []
    for workers in (0, 2):
        path = train(config, tmp_path / f"w{workers}", progress=False, workers=workers)
        weights.append(torch.load(path, weights_only=True)["state_dict"])
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_arch_params_reach_the_checkpoint_and_rebuild(folder, tmp_path):
    from smoothcert.models.checkpoint import model_from_checkpoint

    out = tmp_path / "mnv3"
    assert run("train", "--dataset", "imagefolder", "--data-root", folder, "--image-size", 32,
               "--arch", "torchvision:mobilenet_v3_small", "--arch-param", "dropout=0.3",
               "--sigma", 0.25, "--epochs", 1, "--batch", 4, "--lr", 0.01, "--out", out,
               "--device", "cpu", "--no-progress", "--workers", 0) == 0
    model, meta = model_from_checkpoint(out / "checkpoint.pt")
    assert meta["arch_kwargs"] == {"dropout": 0.3} and meta["config"]["arch_kwargs"] == \
        {"dropout": 0.3}
    assert model[1].classifier[2].p == 0.3


def test_timm_not_installed_says_how_to_install(monkeypatch):
    import sys

    from smoothcert.models import build_model

    monkeypatch.setitem(sys.modules, "timm", None)  # import timm now raises ImportError
    with pytest.raises(SmoothcertError, match=r"pip install 'smoothcert\[timm\]'"):
        build_model("timm:resnet18", 3, (3, 16, 16), [0.5] * 3, [0.2] * 3)
