"""Gaussian data augmentation."""

from __future__ import annotations

from dataclasses import dataclass

from ..data.registry import TASKS
from ..errors import check_count
from ..registry import option
from ..tensors import copies
from .base import TrainingMethod, noise_for_copies, register_method


@register_method("gaussian")
class GaussianAugmentation(TrainingMethod):
    """Cohen, Rosenfeld & Kolter, "Certified Adversarial Robustness via Randomized Smoothing",
    ICML 2019: train the base classifier with cross-entropy on noisy inputs x + δ, δ ~ N(0, σ²I).

    With ``num_noise`` = m > 1 each input is repeated m times with independent noise and the
    cross-entropy is averaged over all B·m noisy inputs (the multi-noise variant of Salman et al.
    2019, §4; m = 1 is Cohen's recipe). Noise is added in pixel space; σ comes from ``noise``.

    The noise copies are laid out copy-major, ``x.repeat(m, 1, 1, 1)``: the first copy of every
    input is drawn first, so the first B draws do not depend on m. ``"logits"`` are those of the
    first copy (for the trainer's noisy training accuracy).

    A per-sample σ (a (B,) tensor, data-dependent training) is repeated the same way, so every
    copy of input i is noised at σ_i.

    For a segmentation or regression dataset the loss is that task's (:func:`.base.task_loss`:
    per-pixel cross-entropy; smooth-L1), the noise augmentation the same: the base model of
    Fischer et al. 2021 and of Chiang et al. 2020 is trained so.
    """

    supports_per_sample_sigma = True
    tasks = TASKS

    @dataclass(frozen=True)
    class Options:
        num_noise: int = option(1, "m: noise copies per input (1: Cohen et al.)")

        def __post_init__(self):
            check_count("num_noise", self.num_noise)

    def loss(self, model, x, y, noise, generator):
        m = self.num_noise
        x_rep = copies(x, m)  # (m·B, C, H, W), copy-major
        logits = model(x_rep + noise_for_copies(noise, m).sample(x_rep, generator))
        ce = self.criterion(logits, copies(y, m))  # mean over all B·m noisy inputs
        key = "smooth_l1" if self.task == "regression" else "ce"  # the log's name of the loss
        return {"loss": ce, "logits": logits[: x.shape[0]], key: ce.detach()}
