"""Gaussian training amplified on easy examples: discard, reweigh, attack on the noise sphere."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import norm
from torch import nn

from ..errors import SmoothcertError, check_bool, check_count, check_in_range, check_positive_finite
from ..registry import option
from ..stats import clopper_pearson_lower
from ..tensors import copies, eval_mode
from .base import TrainingMethod, register_method

# Fixed by the paper ("All other parameters are fixed to their default values", App. A.1; §5.2):
DISCARD_DRAWS = 100  # noise draws per example for p̂ at the discard epoch
REWEIGH_DRAWS = 16  # noise draws per example for the sampling weights
REWEIGH_EVERY = 10  # epochs between weight updates, counted from the start epoch
REWEIGH_P_MIN = 0.75  # p_min: p̂ is clipped to [p_min, 1] before the bound (smallest p with r > 0)
REWEIGH_ALPHA = 0.1  # one-sided level of the Clopper–Pearson bound of the weights
EVAL_ROWS = 8192  # noisy inputs per forward pass when estimating p̂ (the authors' batch_constant)


@register_method("easy_focus")
class EasyFocus(TrainingMethod):
    """Sun, Mao, Müller & Vechev, "Average Certified Radius is a Poor Metric for Randomized
    Smoothing" (code: github.com/eth-sri/acr-weakness, ``code/train.py``), §5:
    Gaussian training with m noise copies (CE averaged over the B·m noisy inputs, as ``gaussian``),
    plus three parts that each can be switched off (all on in the paper's method; Table 3
    ablates every combination):

    (a) ``discard``: at the start of epoch E_t (0-based: after E_t epochs) estimate p̂ of every
        training example from 100 noise draws and drop, for the rest of the run, the examples
        with p̂ < p_t.
    (b) ``reweigh``: at the start epoch and every 10 epochs after it, estimate p̂ of every kept
        example from 16 draws and give it the sampling weight
        w = Φ⁻¹(CP_α(k, 16)), k = ⌊clip(p̂, 0.75, 1)·16⌋, α = 0.1
        (CP_α: one-sided Clopper–Pearson lower bound, :func:`reweigh_weights`). Each epoch then
        draws as many examples as the full training set has, with replacement, from the kept
        set by these weights, so the number of steps per epoch does not change.
    (c) ``attack``: from the start epoch on, each noise δ of each copy is moved on its sphere
        ‖δ'‖ = ‖δ‖ by up to T normalized-gradient ascent steps of size ε on the cross-entropy,
        stopping at the first noise the model misclassifies (:func:`sphere_attack`; Alg. 1),
        with the model in eval mode.

    The start epoch is E_t when ``discard`` is on, else 0 (without discarding, the authors'
    ``train.py`` starts reweighing and the attack at epoch 0). When only
    ``discard`` is on, epochs after E_t sample the kept set uniformly with replacement (their
    ``RandomSampler(replacement=True)``).

    Defaults are the paper's CIFAR-10 values for σ = 0.25 (Table 4; ``script/cifar10/
    train_0.25.sh``): E_t = 60, p_t = 0.5, T = 3, ε = 0.25, with m = 4 (§6, App. A.1). The other
    noise levels of Table 4: σ = 0.5 → (E_t, p_t, T, ε) = (70, 0.4, 6, 0.25); σ = 1.0 → (60, 0.4,
    4, 0.5), with 150 epochs, lr 0.1 × 0.1 every 50 epochs. The numbers of draws (100, 16), the
    10-epoch period, p_min = 0.75 and α = 0.1 are fixed (module constants), as in the paper.

    Where the authors' code differs from the paper, the code is followed:

    - p̂ is the fraction of noisy draws classified as the example's *label* (their
      ``p_correct``), not the top-class frequency p̂A of the certification.
    - The weight is w above, not the paper's max(1, Φ⁻¹(p̂)/Φ⁻¹(p_min)) (§5.2): k is clipped
      before the bound, and the bound is their ``proportion_confint(k, 16, alpha=2·0.1,
      method="beta")[0]``, the one-sided α = 0.1 bound.

    Other differences: p̂ is estimated on the un-augmented training images (their loader applies
    the training augmentation), drawing from the run's training generator. Their loop splits each
    loaded batch of 256 into m chunks of 256/m examples, each trained with m noises (256 noisy
    inputs per SGD step); here a batch of B examples gives B·m noisy inputs, so their recipe is
    ``batch_size=64`` with m = 4.

    Logged: ``ce`` and ``kept_fraction`` (kept examples / training-set size; 1 before discarding).
    """

    noises = ("gaussian",)  # its p̂A threshold, radius weights and sphere attack are Gaussian

    @dataclass(frozen=True)
    class Options:
        num_noise: int = option(4, "m: noise copies per input")
        discard: bool = option(True, "(a) drop the examples with p̂ < p_t at epoch E_t")
        reweigh: bool = option(True, "(b) sample examples by their certified-radius weights")
        attack: bool = option(True, "(c) move each noise on its sphere by an adaptive attack")
        discard_epoch: int = option(60, "E_t: the epoch of (a), 0-based")
        discard_threshold: float = option(0.5, "p_t: threshold of (a), in [0, 1]")
        attack_steps: int = option(3, "T: steps of (c)")
        attack_step_size: float = option(0.25, "ε: step of (c), pixel units")

        def __post_init__(self):
            check_count("num_noise", self.num_noise)
            for name in ("discard", "reweigh", "attack"):
                check_bool(name, getattr(self, name))
            check_count("discard_epoch", self.discard_epoch, minimum=0)
            check_in_range("discard_threshold", self.discard_threshold, 0, 1)
            check_count("attack_steps", self.attack_steps)
            check_positive_finite("attack_step_size", self.attack_step_size)

    def setup(self):
        self.kept: torch.Tensor | None = None  # (K,) int64 dataset indices; None: all
        self.weights: torch.Tensor | None = None  # (K,) float64 sampling weights of the kept
        self._attack_active = False
        self._kept_fraction = 1.0

    @property
    def start_epoch(self) -> int:
        """The epoch from which reweighing and the attack apply (E_t, or 0 without discard)."""
        return self.discard_epoch if self.discard else 0

    def on_epoch_start(self, epoch, context):
        start = self.start_epoch
        self._attack_active = self.attack and epoch >= start
        if self.discard and epoch == start:
            self._discard(context)
        if self.reweigh and epoch >= start and (epoch - start) % REWEIGH_EVERY == 0:
            self._reweigh(context)
        if self.kept is not None:
            self._kept_fraction = len(self.kept) / len(context.train_data)

    def epoch_indices(self, epoch, num_examples, generator):
        if epoch < self.start_epoch or not (self.discard or self.reweigh):
            return None
        pool = torch.arange(num_examples) if self.kept is None else self.kept
        if self.weights is None:  # discard only: uniform with replacement over the kept
            pick = torch.randint(len(pool), (num_examples,), generator=generator)
        else:
            pick = torch.multinomial(self.weights, num_examples, True, generator=generator)
        return pool[pick]

    def loss(self, model, x, y, noise, generator):
        m = self.num_noise
        x_rep = copies(x, m)  # (m·B, C, H, W), copy-major
        y_rep = copies(y, m)
        delta = noise.sample(x_rep, generator)
        if self._attack_active:
            with eval_mode(model):
                delta = sphere_attack(
                    model, x_rep, y_rep, delta, self.attack_steps, self.attack_step_size
                )
        logits = model(x_rep + delta)
        ce = F.cross_entropy(logits, y_rep)  # mean over all B·m noisy inputs
        kept = torch.tensor(self._kept_fraction, device=x.device)
        return {"loss": ce, "logits": logits[: len(x)], "ce": ce.detach(), "kept_fraction": kept}

    def state_dict(self):
        return {"kept": self.kept, "weights": self.weights}

    def load_state_dict(self, state):
        self.kept, self.weights = state["kept"], state["weights"]

    def _discard(self, context) -> None:
        every = torch.arange(len(context.train_data))
        counts = noisy_correct_counts(
            context.model,
            context.train_data,
            every,
            context.noise,
            DISCARD_DRAWS,
            _generator(context),
        ).cpu()
        kept = every[counts.double() / DISCARD_DRAWS >= self.discard_threshold]
        if len(kept) == 0:
            raise SmoothcertError(
                f"easy_focus discarded every training example at epoch {self.discard_epoch} "
                f"(no p̂ >= {self.discard_threshold}); lower discard_threshold or discard later"
            )
        self.kept, self.weights = kept, None

    def _reweigh(self, context) -> None:
        pool = torch.arange(len(context.train_data)) if self.kept is None else self.kept
        counts = noisy_correct_counts(
            context.model,
            context.train_data,
            pool,
            context.noise,
            REWEIGH_DRAWS,
            _generator(context),
        )
        self.weights = torch.from_numpy(reweigh_weights(counts.cpu().numpy(), REWEIGH_DRAWS))


def reweigh_weights(
    counts, num_draws: int, p_min: float = REWEIGH_P_MIN, alpha: float = REWEIGH_ALPHA
) -> np.ndarray:
    """Sampling weights (float64, > 0 for the defaults) from correct counts out of ``num_draws``:
    w = Φ⁻¹(CP_α(k, n)) with k = ⌊clip(count/n, p_min, 1)·n⌋ and CP_α the one-sided (1−α)
    Clopper–Pearson lower bound (the authors' ``train.py``). For n = 16, p_min = 0.75, α = 0.1,
    w rises from Φ⁻¹(CP(12, 16)) ≈ 0.154 to Φ⁻¹(0.1^(1/16)) ≈ 1.11."""
    p = np.asarray(counts, dtype=np.float64) / num_draws
    k = np.floor(np.clip(p, p_min, 1.0) * num_draws)
    return np.asarray(norm.ppf(clopper_pearson_lower(k, num_draws, alpha)), dtype=np.float64)


def noisy_correct_counts(
    model: nn.Module,
    data,
    indices: torch.Tensor,
    noise,
    num_draws: int,
    generator: torch.Generator,
    rows: int = EVAL_ROWS,
) -> torch.Tensor:
    """How many of ``num_draws`` noisy copies x + δ of each example ``data`` [``indices``] the
    model classifies as its label: int64 (len(indices),) on the data's device.

    Batched over examples (about ``rows`` noisy inputs per forward pass, copy-major), in eval
    mode under ``inference_mode``; the noise comes from ``generator``.
    """
    chunk = max(1, rows // num_draws)
    counts = []
    with eval_mode(model), torch.inference_mode():
        for part in indices.split(chunk):
            x, y = data.batch(part)
            x_rep = copies(x, num_draws)
            pred = model(noise.perturb(x_rep, generator)).argmax(dim=1).view(num_draws, -1)
            counts.append((pred == y).sum(dim=0))
    return torch.cat(counts) if counts else torch.zeros(0, dtype=torch.long)


def sphere_attack(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    noise: torch.Tensor,
    steps: int,
    step_size: float,
) -> torch.Tensor:
    """The adaptive attack on the noise sphere (Sun et al., Alg. 1 and App. A.2): for each row i
    of the noise (N, ...) δ_i, up to ``steps`` times: stop if f(x_i + δ_i) ≠ y_i, else
    δ_i ← δ_i + ε·∇/‖∇‖ (∇: gradient of the cross-entropy in δ_i) rescaled to the original norm
    ‖δ_i‖. Rows are independent (call with the model in eval mode); a noise that is
    misclassified from the start is returned unchanged. Returns the new noise (detached), each
    row with its original L2 norm (to float rounding).
    """
    radius = _row_norms(noise)
    delta = noise.detach()
    active = torch.ones(len(x), dtype=torch.bool, device=x.device)
    for _ in range(steps):
        delta = delta.detach().requires_grad_(True)
        logits = model(x + delta)
        active = active & (logits.argmax(dim=1) == y)  # still correctly classified: keep going
        (grad,) = torch.autograd.grad(F.cross_entropy(logits, y, reduction="sum"), delta)
        moved = delta.detach() + step_size * grad / (_row_norms(grad) + 1e-8)
        moved = moved / (_row_norms(moved) + 1e-8) * radius  # back onto the sphere
        delta = torch.where(active.view((-1,) + (1,) * (x.dim() - 1)), moved, delta.detach())
    return delta.detach()


def _row_norms(t: torch.Tensor) -> torch.Tensor:
    return t.flatten(1).norm(dim=1).view((-1,) + (1,) * (t.dim() - 1))


def _generator(context) -> torch.Generator:
    if context.generator is None:
        raise SmoothcertError("easy_focus estimates p̂ with the context's generator; none was given")
    return context.generator


