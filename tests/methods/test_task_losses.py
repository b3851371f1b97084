"""The losses and accuracies of the three tasks (methods/base.py: task_loss, task_correct)."""

import math

import torch
import torch.nn.functional as F

from smoothcert.methods.base import task_correct, task_loss


def test_segmentation_loss_ignores_unlabelled_pixels():
    logits = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 3, (2, 4, 4), generator=torch.Generator().manual_seed(1))
    y[0, 0] = 255
    keep = y != 255
    per_pixel = F.cross_entropy(logits.permute(0, 2, 3, 1)[keep], y[keep])
    assert torch.allclose(task_loss("segmentation", logits, y, 255), per_pixel)
    right, seen = task_correct("segmentation", logits, y, 255)
    assert int(seen) == int(keep.sum())
    assert int(right) == int(((logits.argmax(1) == y) & keep).sum())


def test_classification_and_regression():
    logits, y = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0])
    assert math.isclose(float(task_loss("classification", logits, y)),
                        float(F.cross_entropy(logits, y)))
    assert [int(v) for v in task_correct("classification", logits, y)] == [1, 2]
    out, target = torch.tensor([[0.0, 3.0]]), torch.tensor([[0.5, 0.0]])
    # smooth-L1: ½·0.5² for |d| < 1, |d| − ½ beyond; mean over the outputs
    assert math.isclose(float(task_loss("regression", out, target)), (0.125 + 2.5) / 2)
    assert [int(v) for v in task_correct("regression", out, target)] == [0, 0]


def _seg_batch():
    from torch import nn

    g = torch.Generator().manual_seed(0)
    model = nn.Conv2d(1, 3, 3, padding=1)
    x = torch.rand(2, 1, 5, 5, generator=g)
    y = torch.randint(0, 3, (2, 5, 5), generator=g)
    y[0, 0] = 255
    return model, x, y


def test_consistency_and_stability_train_a_segmenter_per_pixel():
    """Their per-pixel losses equal the classification losses with every pixel an input of its
    own (labelled pixels in the cross-entropy), and give every weight a gradient."""
    from smoothcert.methods import build_method
    from smoothcert.methods.base import pixel_rows
    from smoothcert.methods.consistency import _regularizer
    from smoothcert.methods.stability import stability_loss
    from smoothcert.noise import NOISES

    model, x, y = _seg_batch()
    noise = NOISES["gaussian"](0.25)
    for name in ("consistency", "stability"):
        method = build_method(name)
        method.set_task("segmentation", 255)
        out = method.loss(model, x, y, noise, torch.Generator().manual_seed(1))
        out["loss"].backward()
        assert torch.isfinite(out["loss"]) and out["logits"].shape == (2, 3, 5, 5)
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
        model.zero_grad()
    method = build_method("consistency")
    method.set_task("segmentation", 255)
    gen = torch.Generator().manual_seed(1)
    out = method.loss(model, x, y, noise, gen)
    gen = torch.Generator().manual_seed(1)
    x2 = x.repeat(2, 1, 1, 1)
    logits = model(x2 + noise.sample(x2, gen))
    rows, labels = pixel_rows(logits), y.repeat(2, 1, 1).reshape(-1)
    ce = F.cross_entropy(rows[labels != 255], labels[labels != 255])
    reg, _ = _regularizer(rows.view(2, -1, 3), method.lbd, method.eta, method.variant)
    assert torch.allclose(out["loss"], ce + reg, atol=1e-6)
    clean, noisy = pixel_rows(model(x)), pixel_rows(model(x + 0.1))
    assert torch.allclose(stability_loss(model(x + 0.1), model(x)),
                          stability_loss(noisy, clean), atol=1e-6)
