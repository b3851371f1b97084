"""Training for transformation-specific smoothing: cross-entropy on transformed inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SmoothcertError
from ..registry import option
from ..transforms import Transformation, build_transformation, canonical_text
from ..transforms.base import how_to_name
from .base import PerturbWith, TrainingMethod, dataset_shape, register_method


@register_method("transform")
class TransformTraining(TrainingMethod):
    """Li et al., CCS 2021 (TSS): cross-entropy of the classifier on inputs transformed with
    parameters drawn from the smoothing distribution (data augmentation), no pixel noise.

    The paper: "TSS: Transformation-Specific Smoothing for Robustness Certification" (CCS 2021;
    AI-secure/semantic-randomized-smoothing, ``semantic/train.py``). Each example of each step
    is transformed by its own draw of ``transform`` (the same text ``certify --transform``
    takes, stored canonically in the checkpoint), from the trainer's generator, so the base
    classifier learns the distribution that ``certify --certifier tss`` smooths over. The
    authors' script adds Jeong & Shin's consistency term over ``--num-noise-vec`` copies
    (λ = 20); with their default of one copy its KL part vanishes and what remains is their
    entropy-like term of the one softmax. This method is the plain augmentation (cross-entropy,
    one draw per example), not their regularized loss; the optimizer defaults are Cohen et
    al.'s (SGD, lr 0.1, weight decay 1e-4, lr × 0.1 every 30 epochs). The log's ``test_acc``
    is the accuracy on test images each transformed once.
    """

    uses_noise = False

    @dataclass(frozen=True)
    class Options:
        transform: str = option("", "the transformation and its smoothing parameters, "
                                    "NAME:KEY=VALUE,... as certify --transform takes it "
                                    "(e.g. brightness:sigma_b=0.2); required",
                                convert=canonical_text)

        def __post_init__(self):
            if self.transform is None:
                raise SmoothcertError(f"no transformation given: {how_to_name()}")

    def setup(self) -> None:
        self.transformation = build_transformation(self.transform) if self.transform else None

    def required(self) -> Transformation:
        """The transformation, or one SmoothcertError line saying how to name one."""
        if self.transformation is None:
            raise SmoothcertError("method 'transform' needs a transformation: --param "
                                  f"transform=NAME:KEY=VALUE,...; {how_to_name()}")
        return self.transformation

    def prepare(self, config, device: torch.device) -> None:
        """Refuse, before the run writes anything, a missing transformation and one that does
        not fit the dataset's images (a shift's σ larger than them)."""
        self.required().check_shape(dataset_shape(config))

    def loss(self, model, x, y, noise, generator):
        logits = model(self.required().transform(x, generator))
        return {"loss": self.criterion(logits, y), "logits": logits}

    def evaluate(self, model, data, noise, generator, batch_size) -> dict[str, float]:
        """``test_acc``: the accuracy on the test images, each transformed by one draw from
        ``generator`` (the same every epoch). Not a certified accuracy."""
        return super().evaluate(model, data, PerturbWith(self.required().transform), generator,
                                batch_size)

