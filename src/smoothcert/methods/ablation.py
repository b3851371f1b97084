"""Ablation training: the base classifier of (de)randomized ablation smoothing."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import check_count
from ..registry import option
from ..smoothing.ablation import MODES, Ablation, ablate_
from .base import PerturbWith, TrainingMethod, dataset_shape, register_method


@register_method("ablation")
class AblationTraining(TrainingMethod):
    """Levine & Feizi, NeurIPS 2020 (column, block) and AAAI 2020 (pixels): cross-entropy of the
    base classifier on ablated inputs, no noise.

    The papers: "(De)Randomized Smoothing for Certifiable Defense against Patch Attacks"
    (NeurIPS 2020, alevine0/patchSmoothing: ``column``, ``block``) and "Robustness Certificates
    for Sparse Adversarial Attacks by Randomized Ablation" (AAAI 2020: ``pixels``).

    Each example of each step keeps one band of ``size`` columns or one ``size``×``size`` block
    at a uniformly random position (both wrap around the image's edges), or ``keep`` pixels
    drawn uniformly without replacement; every other pixel is ablated (NaN in pixel space,
    :mod:`smoothcert.smoothing.ablation`). The draws come from the trainer's generator. The
    model is built with the authors' encoding as its first layer (``input_encoding``:
    :class:`~smoothcert.models.encodings.AblationEncoding`, kept x → (x, 1 − x), ablated →
    (0, 0)), whatever ``--arch`` is, and the checkpoint records it.

    The authors' ``train_mnist_band.py`` / ``train_mnist_block.py`` draw one position per
    batch (``random_mask_batch_one_sample(..., reuse_noise=True)``); here each example draws
    its own. Both are unbiased estimates of the same objective, E over positions of the
    cross-entropy (the distribution the certificate counts over); per-example draws do not tie
    a batch's examples to one position. The optimizer defaults are theirs: SGD, lr 0.01,
    momentum 0.9, weight decay 5e-4, constant lr (their README then resumes at lr 0.001:
    ``configs/fashion-mnist/ablation_*.yaml``).
    """

    uses_noise = False
    input_encoding = "ablation"
    defaults = {"lr": 0.01, "weight_decay": 5e-4, "lr_schedule": "constant"}

    @dataclass(frozen=True)
    class Options:
        mode: str = option("column", "what is kept: column (a band of size columns), block "
                                     "(a size×size block) or pixels (keep random pixels)",
                           choices=MODES)
        size: int = option(4, "b: band width or block side in pixels, column and block (the "
                              "authors' train_mnist_*.py default)")
        keep: int = option(45, "k: pixels kept, pixels mode (Levine & Feizi, AAAI 2020: 45 on "
                               "MNIST)")

        def __post_init__(self):
            check_count("size", self.size)
            check_count("keep", self.keep)

    def setup(self) -> None:
        self.scheme = Ablation(self.mode, self.size, self.keep)

    def prepare(self, config, device: torch.device) -> None:
        """Refuse, before the run writes anything, a band wider than the dataset's images, a
        block larger than them or more pixels kept than they have."""
        self.scheme.check(dataset_shape(config))

    def ablate(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """A copy of the batch ``x`` (B, C, H, W) with each example ablated at its own random
        position (or pixel set) drawn from ``generator``: NaN outside what is kept."""
        self.scheme.check(x.shape[-3:])
        masks = self.scheme.random_masks(x.shape[0], x.shape[-3:], generator, x.device)
        return ablate_(torch.empty_like(x), x, masks)

    def loss(self, model, x, y, noise, generator):
        logits = model(self.ablate(x, generator))
        return {"loss": F.cross_entropy(logits, y), "logits": logits}

    def evaluate(self, model, data, noise, generator, batch_size) -> dict[str, float]:
        """``test_acc``: the base classifier's accuracy on the test images, each ablated once at
        a random position (or pixel set) from ``generator`` (the same every epoch). Not a
        certified accuracy: ``certify --certifier ablation`` counts every position."""
        return super().evaluate(model, data, PerturbWith(self.ablate), generator, batch_size)

