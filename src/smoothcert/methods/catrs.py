"""CAT-RS: confidence-aware training of smoothed classifiers."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import (
    SmoothcertError,
    check_bool,
    check_count,
    check_nonnegative,
    check_positive_finite,
)
from ..registry import option
from ..smoothing.attacks import draw_noises, noisy_logits
from ..tensors import copies, eval_mode
from .base import TrainingMethod, register_method
from .consistency import entropy
from .heat import frozen_copy

TARGETS = ("self", "teacher")
"""Where the smoothed prediction ŷ(x) of L^high and the attack comes from (:class:`CATRS`)."""


@register_method("catrs")
class CATRS(TrainingMethod):
    r"""Jeong, Kim & Shin, "Confidence-aware Training of Smoothed Classifiers for Certified
    Robustness", AAAI 2023: train each input on the K easiest of its m noisy copies, K ~
    Binomial(m, its accuracy under noise), plus a worst-case noise term where K = m. Code:
    github.com/alinlab/smoothing-catrs (``code/train_catrs.py``, commit d4bc576).

    Per input x with label y, draw m noises δ_1 … δ_m and let CE_(1) ≤ … ≤ CE_(m) be the sorted
    cross-entropies CE(f(x+δ_j), y). The loss is the batch mean of

        L^CAT-RS = L^low + λ · 1[K = m] · L^high,
        L^low    = (1/m) Σ_{i=1..K} CE_(i)                     (bottom-K Gaussian loss)
        L^high   = max_j KL(ŷ(x) ‖ softmax f(x + δ*_j))        (worst-case Gaussian loss)

    with K = max(1, K'), K' ~ Binomial(m, p̂), p̂ = (1/m) Σ_j 1[argmax f(x+δ_j) = y] the accuracy
    of the m noisy copies ("accuracy under Gaussian noise", the paper's proxy of robustness; with
    ``confidence_mask``, p̂ = ŷ_y(x) instead). Low-confidence inputs (small p̂) thus train on the
    K easiest of their noisy copies only; the worst-case term is switched on only where every
    copy was kept (K = m), i.e. for confident inputs. Note the 1/m, not 1/K: dropped copies
    count as zero, as in the authors' ``(loss * tril[K]).mean(1)``. The paper's §3 names the
    terms L^low, L^high and L^CAT-RS; no copy of the paper is stored in this workspace, so this
    docstring cites the authors' code, not the paper's equation numbers.

    δ*_j is the authors' ``KL_PGD`` (:func:`kl_pgd`): T steps of normalized-gradient ascent of
    (1/m) Σ_j KL(ŷ ‖ softmax f(x+δ_j)) in the noise, step 2ε/T, projected onto the L2 ball of
    radius ε around the drawn δ_j, each step followed by moving every noise row back to the mean
    of its drawn δ_j and rescaling its centred part by the ratio of root mean squares (drawn /
    current), which keeps the row's mean exactly and its norm nearly (a noise row's mean is
    ≈ 0); model in eval mode.

    ŷ(x), the "smoothed prediction": in the authors' code a fixed, precomputed vote distribution
    per training example (``model_conf_0.25_train.npy``: the class frequencies of N = 10,000
    noisy votes of a separately trained Gaussian σ = 0.25 model, ``smooth_prediction.py``; the
    same file for every training σ). ``target`` chooses ours:

    - ``"teacher"``: that recipe. The frozen teacher f_T is the checkpoint ``teacher_checkpoint``
      (same architecture; train it with ``gaussian`` at σ_T = ``teacher_sigma`` = 0.25) and
      ŷ(x) = its vote frequencies over ``teacher_draws`` noisy copies of the batch, drawn anew
      at every step (an unbiased estimate of the authors' ŷ; our trainer does not tell a method
      which training examples a batch holds, so a per-example table cannot be looked up, and the
      votes are taken at the augmented image the step sees rather than at one fixed crop).
    - ``"self"`` (default, no extra model): ŷ(x) = the mean softmax p̄ = (1/m) Σ_j softmax
      f(x+δ_j) of the model's own m noisy copies, detached: the smoothed prediction of the soft
      smoothed classifier, a fixed target within the step as ŷ is in the authors' code (the
      consistency target of Jeong & Shin 2020, here without its gradient). A deviation from
      the authors, for runs without a pretrained model.

    Defaults are the authors' script defaults (``--num-noise-vec 4 --epsilon 256 --num-steps 4
    --lbd 1.0``; ε in their flags counts 1/256ths: 256 → 1.0 in L2 pixel units). Per σ (all with
    m = 4, ε = 1.0, T = 4 unless noted; CIFAR-10 and ImageNet: ``EXPERIMENTS.MD``; MNIST σ =
    0.25: the checkpoint path ``catrs/adv_256.0_4/lbd_1.0/num_4/noise_0.25/lenet`` of its MNIST-C
    command):

    =====  ==============================  ===========  =================================
    σ      MNIST / Fashion-MNIST (LeNet)   CIFAR-10     ImageNet (ResNet-50)
    =====  ==============================  ===========  =================================
    0.25   λ = 1.0                         λ = 0.5      —
    0.50   λ = 1.0 (assumed, see below)    λ = 1.0      —
    1.00   λ = 1.0 (assumed, see below)    λ = 2.0      m = 2, T = 1, λ = 2.0,
                                                        ``confidence_mask``, 2ε from epoch 80
    =====  ==============================  ===========  =================================

    The repository publishes no MNIST λ for σ = 0.5 and 1.0 (its MNIST logs are empty); we use
    the σ = 0.25 value, which is also the script default. Schedules: CIFAR-10 ResNet-110, 150
    epochs, lr 0.1 × 0.1 every 50 epochs; MNIST-family LeNet, 150 epochs, lr 0.01 × 0.1 every
    50 (their ``data/fmnist/*/cat-rs/log.txt``); ImageNet 90 epochs, lr 0.1 × 0.1 every 30 plus
    one more × 0.1 at epoch 85 (``--lr_drop 85``, a schedule matter: ``lr_milestones``). All
    load batches of 256 and split each into m chunks with one SGD step per chunk (256/m
    inputs × m noises per step): to reproduce them set the trainer's batch size to 256/m (64).
    Their ``--pretrained-model`` (starting weights; no published command uses it) is our
    trainer's ``init_checkpoint``. Their ImageNet command spells ``--num_noise_vec``, which
    their parser (``--num-noise-vec``) does not accept; we read it as m = 2.

    ``double_epsilon_epoch`` (their ``--warmup``, default never): from this epoch (0-based) on,
    the attack radius (and with it the step 2ε/T) is 2ε. It is set by :meth:`on_epoch_start`,
    which the trainer also calls after resuming, so it needs no saved state.

    Where the re-implementation of Sun et al. ("ACR is a poor metric", eth-sri/acr-weakness,
    ``code/train_catrs.py``) differs from the authors', we follow the authors: it computes the
    same loss and attack, but reads ŷ from the σ = 0.25 file explicitly (``train_t0.25``; the
    authors' per-σ names all point to that same file), replaces StepLR (stepped with the epoch
    index, which delays each decay by one epoch: 51, 101) by MultiStepLR stepped without it (and
    so drops ``--lr_drop``'s separate branch, appending it to the milestones), seeds every RNG
    from ``--id``, adds options the paper does not have (discarding hard examples, ``--ds_hard``,
    whose code refers to an undefined ``hard_mask``; extra fine-tuning epochs; AdamW), saves
    intermediate checkpoints, and on resuming skips an epoch (it starts at the saved epoch + 1).
    Sun et al. evaluated the authors' released CAT-RS models.

    Other details of the authors' code kept here: K's Binomial uses the hard-vote accuracy p̂
    (not the softmax); L^high's KL sums over classes with 0·log 0 = 0; the attack ignores its
    ``random_start`` and its rescaling divides by root mean squares where standard deviations
    would keep the norm exactly (their ``sigma``); the noisy copies are laid out copy-major
    (one forward pass for all m·B clean, one for all m·B attacked inputs, in train mode).
    K' ~ Binomial(m, p̂) is drawn as the number of m uniforms below p̂ (the same law), from the
    step's generator.

    Draws from the generator, in order: the m noises (one ``noise.sample(x)`` each), the
    teacher's noises (``target="teacher"``), then the B×m uniforms of K'. ``"logits"`` are those
    of the first clean noisy copy f(x+δ_1). Logged: ``"low"`` (batch mean of L^low),
    ``"high"`` (batch mean of 1[K = m]·L^high, so loss = low + λ·high), ``"high_fraction"``
    (fraction of inputs with K = m) and ``"epsilon"`` (the current attack radius).
    """

    supports_per_sample_sigma = True  # every step acts on noise rows; draws take a (B,) σ

    @dataclass(frozen=True)
    class Options:
        num_noise: int = option(4, "m: noises per input")
        epsilon: float = option(1.0, "ε: L2 radius of the noise attack, pixel units")
        num_steps: int = option(4, "T: attack steps (0: no attack)")
        lbd: float = option(1.0, "λ: weight of L^high")
        confidence_mask: bool = option(False, "p̂ = ŷ_y(x) instead of the noisy accuracy")
        double_epsilon_epoch: int | None = option(None, "attack with 2ε from this epoch (null: "
                                                  "never)")
        target: str = option("self", "where ŷ(x) comes from", choices=TARGETS)
        teacher_checkpoint: str | None = option(None, "the frozen teacher (target teacher)")
        teacher_sigma: float = option(0.25, "σ_T: the teacher's noise level, pixel units")
        teacher_draws: int = option(16, "noisy votes of the teacher per input")

        def __post_init__(self):
            check_count("num_noise", self.num_noise), check_nonnegative("epsilon", self.epsilon)
            check_count("num_steps", self.num_steps, minimum=0)
            check_nonnegative("lbd", self.lbd)
            check_bool("confidence_mask", self.confidence_mask)
            _optional_epoch(self.double_epsilon_epoch)
            _check_teacher(_check_target(self.target), self.teacher_checkpoint)
            check_positive_finite("teacher_sigma", self.teacher_sigma)
            check_count("teacher_draws", self.teacher_draws)

    def setup(self):
        self.teacher: nn.Module | None = None
        self._current_epsilon = self.epsilon

    def epsilon_at(self, epoch: int) -> float:
        """The attack radius of epoch ``epoch`` (0-based): 2ε from ``double_epsilon_epoch``."""
        late = self.double_epsilon_epoch is not None and epoch >= self.double_epsilon_epoch
        return 2.0 * self.epsilon if late else self.epsilon

    @property
    def current_epsilon(self) -> float:
        return self._current_epsilon

    def on_epoch_start(self, epoch, context):
        self._current_epsilon = self.epsilon_at(epoch)
        if self.target == "teacher" and self.teacher is None:
            self.teacher = load_teacher(self.teacher_checkpoint, context.model)

    def loss(self, model, x, y, noise, generator):
        m, b = self.num_noise, x.shape[0]
        noises = draw_noises(noise, x, m, generator)  # (m, B, ...), copy by copy
        target = None if self.target == "self" else self._teacher_votes(x, noise, generator)
        uniforms = torch.rand((b, m), generator=generator, device=x.device, dtype=x.dtype)
        out = catrs_loss(
            model, x, y, noises, uniforms, target=target, epsilon=self._current_epsilon,
            num_steps=self.num_steps, lbd=self.lbd, confidence_mask=self.confidence_mask,
        )
        out["epsilon"] = torch.tensor(self._current_epsilon, device=x.device)
        return out

    def _teacher_votes(self, x, noise, generator) -> torch.Tensor:
        if self.teacher is None:
            raise SmoothcertError(
                "catrs with target='teacher' has no teacher yet: call on_epoch_start(epoch, "
                "context) first (the trainer does)"
            )
        teacher_noise = type(noise)(self.teacher_sigma)
        return vote_frequencies(self.teacher, x, teacher_noise, self.teacher_draws, generator)


def catrs_loss(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    noises: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    target: torch.Tensor | None,
    epsilon: float,
    num_steps: int,
    lbd: float,
    confidence_mask: bool = False,
) -> dict[str, torch.Tensor]:
    """The CAT-RS loss of one batch (see :class:`CATRS`): x (B, ...) in [0, 1], labels y (B,),
    drawn noises (m, B, ...), ``uniforms`` (B, m) in [0, 1) that decide K' ~ Binomial(m, p̂),
    and the smoothed prediction ``target`` ŷ (B, C), or None for the detached mean softmax of
    the m clean noisy copies. ``model`` in train mode; it is put in eval mode for the attack.

    Returns ``"loss"``, ``"logits"`` (first clean copy) and the detached batch means ``"low"``,
    ``"high"`` (1[K = m]·L^high) and ``"high_fraction"``.
    """
    m = noises.shape[0]
    clean = noisy_logits(model, x, noises)  # (m, B, C), train mode
    if target is None:
        target = clean.softmax(dim=2).mean(dim=0).detach()
    adv_noises = kl_pgd(model, x, noises, target, epsilon, num_steps)
    adv = noisy_logits(model, x, adv_noises)
    if confidence_mask:
        p_hat = target.gather(1, y.unsqueeze(1)).squeeze(1)
    else:
        p_hat = (clean.argmax(dim=2) == y).to(uniforms.dtype).mean(dim=0)
    k = (uniforms < p_hat.unsqueeze(1)).sum(dim=1).clamp(min=1)  # K = max(1, Binomial(m, p̂))
    low = bottom_k_cross_entropy(clean, y, k)
    high = (k == m) * worst_kl(adv, target)
    return {
        "loss": (low + lbd * high).mean(),
        "logits": clean[0],
        "low": low.mean().detach(),
        "high": high.mean().detach(),
        "high_fraction": (k == m).to(low.dtype).mean(),
    }


def bottom_k_cross_entropy(logits: torch.Tensor, y: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """L^low per input (B,): (1/m) × the sum of the K_i smallest of the m cross-entropies
    CE(logits[j, i], y_i), for logits (m, B, C) and K (B,) in 1 … m."""
    m, b = logits.shape[:2]
    ce = F.cross_entropy(logits.flatten(0, 1), copies(y, m), reduction="none").view(m, b)
    ce_sorted = ce.t().sort(dim=1).values  # (B, m), ascending
    kept = torch.arange(m, device=k.device).unsqueeze(0) < k.unsqueeze(1)
    return (ce_sorted * kept).sum(dim=1) / m


def worst_kl(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """L^high per input (B,): max_j KL(target ‖ softmax logits[j]) for logits (m, B, C)."""
    return kl_to(target, F.log_softmax(logits, dim=2)).max(dim=0).values


def kl_to(target: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) = −H(p) − Σ_c p_c log q_c over the last axis, with 0·log 0 = 0 (the
    authors' ``F.kl_div(log_q, p, reduction='none').sum(1)``); p (B, C), log q (..., B, C)."""
    return -entropy(target) - (target * log_q).sum(dim=-1)


def kl_pgd(
    model: nn.Module,
    x: torch.Tensor,
    noises: torch.Tensor,
    target: torch.Tensor,
    epsilon: float,
    num_steps: int,
) -> torch.Tensor:
    """The worst-case noises δ*_j (m, B, ...) near the drawn ``noises`` (the authors' KL_PGD).

    T = ``num_steps`` times: δ ← δ + (2ε/T)·g/(‖g‖ + 1e-8), g = ∇_δ Σ_i (1/m) Σ_j KL(ŷ_i ‖
    softmax f(x_i + δ_ji)) per noise row; then δ ← δ₀ + renorm(δ − δ₀, ε) (projection onto the
    L2 ball of radius ε around the drawn δ₀, ``torch.renorm``); then δ ← μ₀ + s₀·(δ − μ)/s per
    row, with μ, μ₀ the row means of δ, δ₀ and s, s₀ their root mean squares (the authors'
    ``sigma``): the row mean becomes μ₀ exactly, the norm ‖δ₀‖ up to a term in μ². The model
    runs in eval mode (the authors also freeze its parameters; ``torch.autograd.grad`` w.r.t. δ
    computes no parameter gradient either way); T = 0 returns the drawn noises.
    """
    if num_steps == 0:
        return noises
    m, b = noises.shape[:2]
    x_rep, start = copies(x, m), noises.flatten(0, 1)
    mu0, rms0 = _row_mean(start), _row_rms(start)
    delta, step = start, 2.0 * epsilon / num_steps
    with eval_mode(model), torch.enable_grad():  # gradients w.r.t. the noise only
        for _ in range(num_steps):
            delta = delta.detach().requires_grad_(True)
            log_q = F.log_softmax(model(x_rep + delta), dim=1).view(m, b, -1)
            objective = kl_to(target, log_q).mean(dim=0).sum()
            (grad,) = torch.autograd.grad(objective, delta)
            delta = delta.detach() + step * grad / (_row_norm(grad) + 1e-8)
            delta = start + (delta - start).renorm(p=2, dim=0, maxnorm=epsilon)
            delta = mu0 + (delta - _row_mean(delta)) / _row_rms(delta) * rms0
    return delta.detach().view_as(noises)


def vote_frequencies(
    model: nn.Module, x: torch.Tensor, noise, draws: int, generator: torch.Generator
) -> torch.Tensor:
    """(B, C): the fraction of ``draws`` noisy copies x + δ (δ from ``noise``) that ``model``
    classifies as each class, one forward pass of draws·B rows in eval mode without gradients."""
    x_rep = copies(x, draws)
    with eval_mode(model), torch.no_grad():
        logits = model(x_rep + noise.sample(x_rep, generator))
    votes = F.one_hot(logits.argmax(dim=1), logits.shape[1]).view(draws, len(x), -1)
    return votes.to(x.dtype).mean(dim=0)


def load_teacher(path: str, like: nn.Module) -> nn.Module:
    """A frozen copy of ``like`` (same architecture, device) holding the weights of the
    smoothcert checkpoint at ``path`` (read with ``torch.load(weights_only=True)``)."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, pickle.UnpicklingError) as e:
        raise SmoothcertError(f"cannot read the catrs teacher checkpoint {path}: {e}") from e
    state = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise SmoothcertError(f"{path} is not a smoothcert checkpoint (no state_dict)")
    try:
        return frozen_copy(like, state)
    except RuntimeError as e:
        raise SmoothcertError(
            f"the catrs teacher {path} does not fit the model's architecture: {e}"
        ) from e


def _row_mean(t: torch.Tensor) -> torch.Tensor:
    return t.flatten(1).mean(dim=1).view((-1,) + (1,) * (t.dim() - 1))


def _row_rms(t: torch.Tensor) -> torch.Tensor:
    return t.flatten(1).pow(2).mean(dim=1).sqrt().view((-1,) + (1,) * (t.dim() - 1))


def _row_norm(t: torch.Tensor) -> torch.Tensor:
    return t.flatten(1).norm(dim=1).view((-1,) + (1,) * (t.dim() - 1))


def _check_target(target) -> str:
    if target not in TARGETS:
        raise SmoothcertError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    return target


def _check_teacher(target: str, path) -> str | None:
    if path is not None and (not isinstance(path, str) or not path):
        raise SmoothcertError(f"teacher_checkpoint must be a path or null, got {path!r}")
    if target == "teacher" and path is None:
        raise SmoothcertError(
            "catrs with target='teacher' needs teacher_checkpoint=PATH: a gaussian checkpoint "
            "trained at σ = 0.25 (the authors' smoothed predictions), e.g. from "
            "configs/<dataset>/gaussian_s025.yaml"
        )
    if target == "self" and path is not None:
        raise SmoothcertError(
            "teacher_checkpoint is only read with target='teacher'; drop it or set that target"
        )
    return path


def _optional_epoch(value) -> int | None:
    if value is None:
        return None
    return check_count("double_epsilon_epoch", value, minimum=0)
