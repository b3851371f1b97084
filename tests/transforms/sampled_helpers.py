"""Helpers shared by the soundness tests of TSS's sampled transformations
(test_rotation_soundness.py, test_scaling_soundness.py): smooth test images, a linear model
whose Gaussian-smoothed classifier is itself, and one certification run through
``certify_dataset``. Not collected (no ``test_`` prefix)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from smoothcert.runs import certify_dataset


def blobs(count, size, channels=1, seed=0, width=None):
    """Smooth images in [0, 1]: a few Gaussian blobs each; ``width`` columns (default square)."""
    g = torch.Generator().manual_seed(seed)
    width = size if width is None else width
    i = torch.arange(size, dtype=torch.float64)
    j = torch.arange(width, dtype=torch.float64)
    out = torch.zeros((count, channels, size, width), dtype=torch.float64)
    for k in range(count):
        for _ in range(3):
            cy, cx = (torch.rand(2, generator=g, dtype=torch.float64) * (size - 1)).tolist()
            spread = 1.0 + 3.0 * float(torch.rand((), generator=g))
            bump = torch.exp(-((i[:, None] - cy) ** 2 + (j[None, :] - cx) ** 2) / spread**2)
            out[k] += bump * torch.rand((channels, 1, 1), generator=g, dtype=torch.float64)
    return (out / out.amax(dim=(1, 2, 3), keepdim=True)).float()


class Linear(nn.Module):
    """Two logits (−h, h), h = v·z + c0 on the input z."""

    def __init__(self, v, c0):
        super().__init__()
        self.register_buffer("v", v.flatten().double())
        self.c0 = c0

    def forward(self, z):
        h = z.flatten(1).double() @ self.v + self.c0
        return torch.stack([-h, h], dim=1)


def certify(model, xs, labels, transform, **kwargs):
    """``certify_dataset`` with the tss certifier and ``transform``: n0 64, n 1000, α 0.001."""
    data = torch.utils.data.TensorDataset(xs, labels)
    return certify_dataset(model, data, certifier="tss", options={"transform": transform},
                           n0=64, n=1000, alpha=0.001, batch=512, seed=3, num_classes=2,
                           **kwargs)


def place_boundaries(xs, h, grid, targets, kappa, identity):
    """Set each image's centre pixel (which rotation and scaling never move) so that the least
    h(image, θ) over ``grid`` is ``targets[k]``: x_c = (target − least with x_c = 0)/κ, κ the
    linear model's weight there (h is linear in x_c with slope κ). Returns the labels, the
    sign of h at the ``identity`` parameter; every pixel stays in [0, 1]."""
    ci, cj = xs.shape[-2] // 2, xs.shape[-1] // 2
    for k in range(len(xs)):
        xs[k, 0, ci, cj] = 0.0
        lowest = float(h(xs[k], grid).min())
        xs[k, 0, ci, cj] = (targets[k] - lowest) / kappa
    assert bool((xs >= 0).all() & (xs <= 1).all()), xs[:, 0, ci, cj]
    at = torch.full((1,), identity, dtype=torch.float64)
    return (torch.stack([h(x, at)[0] for x in xs]) > 0).long()


def golden(name: str):
    """tests/fixtures/tss/``name``: the parsed file, its images (float32, as the authors' data
    gives them) and ``rows(part)``, that part's rows as dicts of its fields."""
    found = json.loads((Path(__file__).parents[1] / "fixtures" / "tss" / name).read_text())
    images = [torch.tensor(img, dtype=torch.float32) for img in found["images"]]

    def rows(part):
        table = found[part]
        return [dict(zip(table["fields"], row, strict=True)) for row in table["rows"]]

    return found, images, rows
