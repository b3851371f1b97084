"""Consistency regularization."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import SmoothcertError, check_count, check_nonnegative
from ..registry import option
from ..tensors import copies
from .base import TrainingMethod, noise_for_copies, pixel_rows, register_method

VARIANTS = ("default", "mse", "kl", "xent")


def consistency_loss(
    logits: Sequence[torch.Tensor], lbd: float, eta: float = 0.5, variant: str = "default"
) -> torch.Tensor:
    """Batch mean of the consistency regularizer of Jeong & Shin (2020), without the CE term.

    ``logits`` holds m ≥ 2 tensors of shape (B, C), the logits f(x + δ_j) for i.i.d. noises
    δ_1 … δ_m of the same batch; p_j = softmax(f(x + δ_j)) and p̄ = (1/m) Σ_j p_j. Per input:

    - ``"default"``: λ · (1/m) Σ_j KL(p̄ ‖ p_j) + η · H(p̄)   (eq. (7), (12));
    - ``"kl"``:      λ · (1/m) Σ_j KL(p̄ ‖ p_j)               (eq. (13), = default with η = 0);
    - ``"xent"``:    λ · ((1/m) Σ_j KL(p̄ ‖ p_j) + H(p̄))      (= default with η = λ: the mean
      cross-entropy (1/m) Σ_j CE(p̄, p_j));
    - ``"mse"``:     λ · ‖p_2 − p_1‖²₂                        (eq. (13)); the authors' code uses
      the first two draws only, also when m > 2, and so do we.

    ``eta`` only enters ``"default"``. As in the authors' ``code/consistency.py``, p̄ is not
    detached (the gradient flows through it), KL(p̄ ‖ p_j) is summed over classes and averaged
    over the batch ("batchmean"), and H(p̄) = −Σ_c p̄_c log max(p̄_c, 1e-20).
    Raises :class:`SmoothcertError` for m < 2 or an unknown variant.
    """
    if len(logits) < 2:
        raise SmoothcertError(f"consistency needs m >= 2 noise draws per input, got {len(logits)}")
    return _regularizer(torch.stack(list(logits)), lbd, eta, _check_variant(variant))[0]


def _regularizer(logits: torch.Tensor, lbd: float, eta: float, variant: str):
    """(batch-mean regularizer, batch-mean H(p̄) detached) from stacked logits (m, B, C)."""
    log_p = F.log_softmax(logits, dim=2)  # one kernel per operation for all m draws
    if variant == "mse":
        reg = lbd * (log_p[1].exp() - log_p[0].exp()).pow(2).sum(dim=1).mean()
        return reg, entropy(log_p.exp().mean(dim=0)).mean().detach()
    kl, h = _kl_and_entropy(log_p)
    eta = {"default": eta, "kl": 0.0, "xent": lbd}[variant]
    return (lbd * kl + eta * h).mean(), h.mean().detach()


def _kl_and_entropy(log_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per input, (1/m) Σ_j KL(p̄ ‖ p_j) and H(p̄) from the log-probabilities (m, B, C).

    p̄ is not detached: the authors' code backpropagates through the mean. With
    H(p̄) = −Σ p̄ log p̄, the mean KL is (1/m) Σ_j Σ_c p̄_c (log p̄_c − log p_j,c) = −H(p̄) −
    Σ_c p̄_c · mean_j log p_j,c, so both come from one pass over the m draws.
    """
    p_bar = log_p.exp().mean(dim=0)  # (B, C)
    h = entropy(p_bar)
    cross = -(p_bar * log_p.mean(dim=0)).sum(dim=1)  # (1/m) Σ_j CE(p̄, p_j)
    return cross - h, h


def entropy(p: torch.Tensor) -> torch.Tensor:
    """H(p) = −Σ_c p_c log p_c per row of probabilities p (B, C); the clamp keeps 0·log 0 = 0."""
    return -(p * p.clamp(min=1e-20).log()).sum(dim=1)


def _check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        known = ", ".join(VARIANTS)
        raise SmoothcertError(f"unknown consistency variant {variant!r}; known: {known}")
    return variant


@register_method("consistency")
class ConsistencyRegularization(TrainingMethod):
    """Jeong & Shin, "Consistency Regularization for Certified Robustness of Smoothed
    Classifiers", NeurIPS 2020: Gaussian augmentation with m noise copies plus a penalty on
    the disagreement of the copies' predictions (eq. (12)),

        L = (1/m) Σ_j CE(f(x+δ_j), y) + λ · (1/m) Σ_j KL(p̄ ‖ p_j) + η · H(p̄),

    p_j = softmax f(x+δ_j), p̄ = (1/m) Σ_j p_j; the regularizer and its variants are
    :func:`consistency_loss` (``variant`` = ``"default"``, ``"mse"``, ``"kl"``, ``"xent"``).

    Defaults: m = 2 and η = 0.5 (§4.1: "we use m = 2 and η = 0.5 unless otherwise noted");
    λ = 10, the default of the authors' ``code/train_consistency.py`` and their CIFAR-10 σ = 0.5
    setting (Table 1, Table 3). λ is the one hyperparameter to set per σ; the published models
    (Gaussian + Consistency, m = 2, η = 0.5) use:

    =====  =====================  ==========================  ==================
    σ      MNIST (supp. Table 2)  CIFAR-10 (Table 1)          ImageNet (Table 2)
    =====  =====================  ==========================  ==================
    0.25   λ = 10                 λ = 10; 20 (best ACR)       —
    0.50   λ = 5                  λ = 10                      λ = 5
    1.00   λ = 5                  λ = 5; 10 (best ACR)        λ = 5, η = 0.1
    =====  =====================  ==========================  ==================

    On top of SmoothAdv the published λ are smaller: λ = 1 on MNIST (all σ); on CIFAR-10 λ = 2
    at σ = 0.25 and λ = 1 at σ = 0.5, 1.0 (Table 1; SmoothAdv's m and ε as in supp. Table 1).

    Batching in the authors' code differs from the paper's description: their training loop
    splits every loaded batch of 256 into m chunks of 256/m inputs and takes one SGD step per
    chunk, so each step sees 256/m clean inputs × m noises. To reproduce their runs, set the
    trainer's batch size to 256/m (128 for m = 2).

    Noise copies are laid out copy-major (``x.repeat(m, 1, 1, 1)``, one forward pass over all
    m·B inputs, as in the authors' code); ``"logits"`` are those of the first copy. Logged:
    ``"ce"``, ``"consistency"`` (the whole regularizer) and ``"entropy"`` (H(p̄), batch mean).
    A per-sample σ (a (B,) tensor, data-dependent training) is repeated copy-major with the
    inputs: all m draws of input i have standard deviation σ_i.

    A segmentation model is regularized per pixel: each pixel's m predictions are one input's
    (``base.pixel_rows``), averaged over the pixels, beside the task's per-pixel cross-entropy.
    """

    tasks = ("classification", "segmentation")

    supports_per_sample_sigma = True

    @dataclass(frozen=True)
    class Options:
        num_noise: int = option(2, "m: noise copies per input (>= 2)")
        lbd: float = option(10.0, "λ: weight of the KL (or MSE) term")
        eta: float = option(0.5, "η: weight of the entropy H(p̄), variant default only")
        variant: str = option("default", "the regularizer (see consistency_loss)",
                              choices=VARIANTS)

        def __post_init__(self):
            check_count("num_noise", self.num_noise, minimum=2)
            check_nonnegative("lbd", self.lbd), check_nonnegative("eta", self.eta)
            _check_variant(self.variant)

    def loss(self, model, x, y, noise, generator):
        m, b = self.num_noise, x.shape[0]
        x_rep = copies(x, m)  # (m·B, C, H, W), copy-major
        logits = model(x_rep + noise_for_copies(noise, m).sample(x_rep, generator))
        ce = self.criterion(logits, copies(y, m))  # = (1/m) Σ_j CE_j, each a batch mean
        rows = pixel_rows(logits)  # a segmenter's pixels as inputs of their own
        draws = rows.view(m, -1, rows.shape[1])  # (m, B, C), one row of draws per noise copy
        reg, h = _regularizer(draws, self.lbd, self.eta, self.variant)
        return {
            "loss": ce + reg,
            "logits": logits[:b],
            "ce": ce.detach(),
            "consistency": reg.detach(),
            "entropy": h,
        }
