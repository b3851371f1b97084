"""Denoiser training for denoised smoothing: the MSE and the stability objective."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SmoothcertError
from ..tensors import eval_mode
from .base import TrainingMethod, eval_batches, register_method


def freeze(classifier: nn.Module) -> nn.Module:
    """``classifier`` in eval mode with no parameter requiring a gradient: the frozen f of the
    denoiser objectives (its BatchNorm uses its running statistics, as Salman et al.'s
    ``classifier.eval()``). Gradients still flow through it to its input."""
    classifier.eval()
    classifier.requires_grad_(False)
    return classifier


def load_classifier(path: str, dataset: str, device: torch.device) -> nn.Module:
    """The frozen classifier of checkpoint ``path`` on ``device``; it must hold a classifier
    trained on ``dataset`` (one SmoothcertError otherwise)."""
    from ..models.checkpoint import checkpoint_role, model_from_checkpoint

    model, meta = model_from_checkpoint(path, device)
    role = checkpoint_role(meta)
    if role != "classifier":
        raise SmoothcertError(f"--classifier {path} holds a {role} ({meta['arch']}), not a "
                              "classifier; give a classifier checkpoint")
    if meta.get("dataset") != dataset:
        raise SmoothcertError(f"--classifier {path} was trained on {meta.get('dataset')}, but "
                              f"this run trains on {dataset}; give a classifier of {dataset}")
    return freeze(model)


class DenoiserMethod(TrainingMethod):
    """What both objectives of Salman et al. share: a denoiser D (pixels to pixels) trained on
    x + δ, an optional or required frozen classifier f (:meth:`prepare` loads it from the run's
    ``classifier``; it is never trained, never in the optimizer and never saved with D), the
    authors' optimizer (``code/train_denoiser.py``: Adam, lr 1e-3, weight decay 1e-4, lr × 0.1
    every 30 epochs; batch 256 and 90 epochs in the recipes), and the test columns ``test_mse``
    (the mean squared error of D(x + δ) against x per pixel over the test split, one fixed draw
    per image) and ``test_acc`` (the accuracy of f(D(x + δ)) on it; NaN without f).
    """

    trains = "denoiser"
    defaults = {"optimizer": "adam", "lr": 1e-3}  # weight decay 1e-4, StepLR(30, 0.1): the base's
    test_columns = ("test_mse", "test_acc")

    def setup(self) -> None:
        self.classifier: nn.Module | None = None

    def prepare(self, config, device: torch.device) -> None:
        if config.classifier is not None:
            self.classifier = load_classifier(config.classifier, config.dataset, device)

    def evaluate(self, model, data, noise, generator, batch_size) -> dict[str, float]:
        device = generator.device
        squares = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.long, device=device)
        with eval_mode(model), torch.inference_mode():
            for x, y in eval_batches(data, batch_size, device):
                denoised = model(noise.perturb(x, generator))
                squares += F.mse_loss(denoised, x, reduction="sum").double()
                if self.classifier is not None:
                    correct += (self.classifier(denoised).argmax(dim=1) == y).sum()
        n = len(data)
        acc = correct.item() / n if self.classifier is not None else math.nan
        return {"test_mse": squares.item() / (n * math.prod(data.input_shape)), "test_acc": acc}


@register_method("denoiser-mse")
class DenoiserMSE(DenoiserMethod):
    """Salman, Sun, Yang, Kapoor & Kolter, "Denoised Smoothing: A Provable Defense for
    Pretrained Classifiers", NeurIPS 2020: train a denoiser D with the MSE objective

        L = mean ‖D(x + δ) − x‖²,   δ ~ N(0, σ²I),

    the mean over the batch's pixels (``torch.nn.MSELoss(reduction="mean")`` of the authors'
    ``code/train_denoiser.py``, ``--objective denoising``). No classifier is needed; with
    ``--classifier`` the log's ``test_acc`` is that classifier's accuracy on the denoised noisy
    test images. No logits: the log's ``train_acc`` is NaN.
    """

    frozen_classifier = "optional"

    def loss(self, model, x, y, noise, generator):
        return {"loss": F.mse_loss(model(noise.perturb(x, generator)), x)}


@register_method("denoiser-stability")
class DenoiserStability(DenoiserMethod):
    """Salman, Sun, Yang, Kapoor & Kolter, "Denoised Smoothing: A Provable Defense for
    Pretrained Classifiers", NeurIPS 2020: train a denoiser D against a frozen classifier f
    (``--classifier``, their "full-access" setting) with the stability objective

        L = CE(f(D(x + δ)), argmax f(x)),   δ ~ N(0, σ²I),

    the batch mean, where the target is f's own prediction on the clean x, not the label
    (``code/train_denoiser.py``, ``--objective stability``). f stays in eval mode and gets no
    parameter gradient; the gradient reaches D through f. The authors start it from an
    MSE-trained denoiser (``--pretrained-denoiser``; here ``--init-from MSE_RUN/checkpoint.pt``).
    ``"logits"`` are f(D(x + δ)): the log's ``train_acc`` is f's accuracy on the denoised noisy
    inputs against the labels.
    """

    frozen_classifier = "required"

    def loss(self, model, x, y, noise, generator):
        if self.classifier is None:
            raise SmoothcertError("denoiser-stability has no classifier: the trainer gives it "
                                  "--classifier (or set method.classifier to a frozen one)")
        with torch.no_grad():
            target = self.classifier(x).argmax(dim=1)
        logits = self.classifier(model(noise.perturb(x, generator)))
        return {"loss": F.cross_entropy(logits, target), "logits": logits}
