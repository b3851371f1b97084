"""Standard training: cross-entropy on clean inputs."""

from __future__ import annotations

from ..data.registry import TASKS
from .base import TrainingMethod, register_method


@register_method("standard")
class StandardTraining(TrainingMethod):
    """Standard training: cross-entropy of the classifier on clean inputs, no noise.

    This makes the "off-the-shelf" classifier that denoised smoothing protects (Salman et al.,
    "Denoised Smoothing: A Provable Defense for Pretrained Classifiers", NeurIPS 2020, whose
    ``code/train_classifier.py`` with ``--noise_sd 0`` trains their CIFAR-10 base classifiers),
    and the clean-trained starting point of HeatSmoothing (``--init-from``). The run takes no σ
    (the checkpoint's ``noise`` is None: certification is told σ), its log's ``test_acc`` is the
    clean test accuracy, and the optimizer settings default to Cohen et al.'s (SGD, lr 0.1,
    weight decay 1e-4, lr × 0.1 every 30 epochs; the authors' script uses weight decay 5e-4,
    as ``configs/cifar10/standard.yaml`` does).
    """

    uses_noise = False
    tasks = TASKS  # the task's own loss (base.task_loss): an unsmoothed segmenter or regressor

    def loss(self, model, x, y, noise, generator):
        logits = model(x)
        return {"loss": self.criterion(logits, y), "logits": logits}
