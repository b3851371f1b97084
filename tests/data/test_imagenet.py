"""ImageNet end to end on CPU: a random-weight ResNet-50 saved in Cohen et al.'s layout
(``Sequential(NormalizeLayer, DataParallel(resnet50))``, keys ``1.module.*``) is imported and
certified on an ImageNet-layout folder of 1000 wnid classes, every 100th image as Cohen et al."""

from __future__ import annotations

import numpy as np
import torch
import torchvision
from PIL import Image
from torch import nn

from conftest import DataParallelKeys
from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.runs.records import read_records


def write_imagenet_val(root, per_class: int = 1):
    """``val/<wnid>/*.JPEG``: 1000 classes (wnid-like names, sorted = label order)."""
    rng = np.random.default_rng(0)
    for c in range(1000):
        folder = root / "val" / f"n{c:08d}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, size=(12, 15, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"ILSVRC2012_val_{c:05d}{i}.JPEG")
    return root


class CohenNormalize(nn.Module):
    """Their NormalizeLayer: the means and stds are plain attributes, not state."""

    def __init__(self):
        super().__init__()
        self.means = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        self.sds = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def forward(self, x):
        return (x - self.means) / self.sds


def test_cohen_resnet50_certifies_on_an_imagenet_folder(tmp_path, capsys):
    root = write_imagenet_val(tmp_path / "imagenet")
    data = load_dataset("imagenet", "test", root)
    assert len(data) == 1000 and data.input_shape == (3, 224, 224)
    assert data.classes[0] == "n00000000" and data.samples[999][1] == 999

    torch.manual_seed(0)
    reference = nn.Sequential(CohenNormalize(), DataParallelKeys(torchvision.models.resnet50()))
    assert next(iter(reference.state_dict())).startswith("1.module.")
    torch.save({"epoch": 90, "arch": "resnet50", "state_dict": reference.state_dict(),
                "optimizer": {}}, tmp_path / "checkpoint.pth.tar")
    checkpoint = tmp_path / "cohen_r50.pt"
    assert main(["import-checkpoint", str(tmp_path / "checkpoint.pth.tar"), "--format", "cohen",
                 "--arch", "resnet50", "--dataset", "imagenet", "--sigma", "0.25",
                 "--out", str(checkpoint)]) == 0

    out = tmp_path / "certify.tsv"
    # two images of 2 + 4 draws: a ResNet-50 forward at 224×224 costs ~0.1 s a draw on a CPU
    assert main(["certify", str(checkpoint), "--data-root", str(root), "--skip", "500",
                 "--max", "2", "--n0", "2", "--n", "4", "--batch", "16", "--device", "cpu",
                 "--no-progress", "--out", str(out)]) == 0
    records = read_records(out)
    assert records["idx"].tolist() == [0, 500] and records["label"].tolist() == [0, 500]
    assert set(records["n"].tolist()) == {4} and np.all(records["sigma"] == 0.25)

    # the imported model is the reference network on the same pixels (eval mode)
    from smoothcert.models.checkpoint import model_from_checkpoint

    ours, meta = model_from_checkpoint(checkpoint)
    x = torch.stack([data[0][0], data[100][0]])
    with torch.no_grad():
        assert torch.allclose(ours(x), reference.eval()(x), atol=1e-4, rtol=1e-4)
    assert meta["dataset"] == "imagenet" and meta["num_classes"] == 1000
