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
