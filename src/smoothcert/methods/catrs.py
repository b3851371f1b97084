"""CAT-RS: confidence-aware training of smoothed classifiers."""

from __future__ import annotations

import logging
import math
import os
import time
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
from ..noise.base import NOISES
from ..registry import option
from ..rng import derived_seed, example_generator
from ..smoothing.attacks import draw_noises, noisy_logits
from ..smoothing.smoothed import Smoothed
from ..tensors import copies, eval_mode, model_device
from .base import TrainingMethod, register_method
from .consistency import entropy

log = logging.getLogger(__name__)

TARGETS = ("teacher", "self")
"""Where the smoothed prediction ŷ(x) of L^high and the attack comes from (:class:`CATRS`)."""
MAX_TEACHER_DRAWS = 2**15 - 1
"""The ŷ table stores vote counts as int16: at most this many teacher votes per image."""
_TABLE_STREAM = 0x7EA1_CA75  # derived_seed(run seed, this, idx): the table's draws of image idx


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

    ŷ(x), the "smoothed prediction" (``target``):

    - ``"teacher"`` (default; the paper's): the vote frequencies of a separately trained
      Gaussian teacher f_T at σ_T = ``teacher_sigma`` (0.25 for every training σ, as the
      authors' ``datasets.py`` reads ``model_conf_0.25_train.npy`` for all of them):
      ŷ(x_i) = counts_i / N_T, counts_i the class counts of argmax f_T(x_i + δ) over N_T =
      ``teacher_draws`` noisy copies (their ``smooth_prediction.py`` with ``--N=10000``: soft
      frequencies, not the argmax, no abstention; ``core.Smooth.confidence_top2`` returns
      ``counts / n``). The table of counts is built ONCE per run, by :meth:`on_epoch_start` of
      the first epoch (:func:`teacher_vote_table`), on the *un-augmented* training images,
      each image's draws from its own generator seeded from (run seed, a fixed tag, its index),
      so the table depends on neither batching nor device count; it is kept as int16 (N, C)
      counts in :meth:`state_dict`, hence in the checkpoint's training state, and a resumed
      run reads it back instead of recomputing it (nor needs the teacher file). ImageNet-size:
      1.28 M × 1000 × 2 bytes = 2.6 GB on the host, looked up per batch by the training-set
      indices the trainer passes (:attr:`needs_indices`). Cost: N·N_T teacher forward passes
      (Fashion-MNIST with N_T = 10,000: 6·10⁸ LeNet passes, minutes on a GPU, hours on 2 CPU
      cores). The teacher must be a classifier checkpoint of the run's dataset trained with
      noise at σ_T (train it with ``gaussian``: ``configs/<dataset>/gaussian_teacher_s025.yaml``,
      the authors' 150-epoch schedule). Departures: the authors' CIFAR/ImageNet ``train``
      split applies the training augmentation, so their table saw one random crop/flip per
      image drawn when it was made; ours sees the image itself (a centre crop for image
      folders). Under data-parallel training every rank builds the same full table.
    - ``"self"`` (a named variant, not the paper's; checkpoints record it as
      ``meta["method"]["variant"] = "target=self"``): ŷ(x) = the mean softmax p̄ = (1/m) Σ_j
      softmax f(x+δ_j) of the model's own m noisy copies, detached: the smoothed prediction of
      the soft smoothed classifier, a fixed target within the step (the consistency target of
      Jeong & Shin 2020 without its gradient). For runs without a teacher.

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
    one more × 0.1 at epoch 85 (``--lr_drop 85``, a schedule matter: ``lr_milestones``). Their
    StepLR is stepped as ``scheduler.step(epoch)`` after epoch ``epoch``, which puts every decay
    one epoch late (0-based epochs 51 and 101 of 150, where their logs' training loss drops):
    the recipes (``configs/*/catrs_s*.yaml`` and the teachers' ``gaussian_teacher_s025.yaml``)
    use those milestones, [51, 101]. All
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

    Draws from the generator, in order: the m noises (one ``noise.sample(x)`` each), then the
    B×m uniforms of K' (the ŷ table draws from its own per-image generators). ``"logits"`` are
    those of the first clean noisy copy f(x+δ_1). Logged: ``"low"`` (batch mean of L^low),
    ``"high"`` (batch mean of 1[K = m]·L^high, so loss = low + λ·high), ``"high_fraction"``
    (fraction of inputs with K = m) and ``"epsilon"`` (the current attack radius).
    """

    supports_per_sample_sigma = True  # every step acts on noise rows; draws take a (B,) σ
    needs_indices = True  # ŷ is looked up per training example

    @dataclass(frozen=True)
    class Options:
        num_noise: int = option(4, "m: noises per input")
        epsilon: float = option(1.0, "ε: L2 radius of the noise attack, pixel units")
        num_steps: int = option(4, "T: attack steps (0: no attack)")
        lbd: float = option(1.0, "λ: weight of L^high")
        confidence_mask: bool = option(False, "p̂ = ŷ_y(x) instead of the noisy accuracy")
        double_epsilon_epoch: int | None = option(None, "attack with 2ε from this epoch (null: "
                                                  "never)")
        target: str = option("teacher", "where ŷ(x) comes from: the teacher's votes (the "
                             "paper) or the model's own mean softmax (variant)", choices=TARGETS)
        teacher_checkpoint: str | None = option(None, "the Gaussian-trained teacher (target "
                                                "teacher)")
        teacher_sigma: float = option(0.25, "σ_T: the teacher's noise level, pixel units")
        teacher_draws: int = option(10_000, "N_T: the teacher's noisy votes per training image "
                                    "(the authors' --N 10000)")

        def __post_init__(self):
            check_count("num_noise", self.num_noise), check_nonnegative("epsilon", self.epsilon)
            check_count("num_steps", self.num_steps, minimum=0)
            check_nonnegative("lbd", self.lbd)
            check_bool("confidence_mask", self.confidence_mask)
            _optional_epoch(self.double_epsilon_epoch)
            _check_teacher(_check_target(self.target), self.teacher_checkpoint)
            check_positive_finite("teacher_sigma", self.teacher_sigma)
            check_count("teacher_draws", self.teacher_draws, maximum=MAX_TEACHER_DRAWS)

    def setup(self):
        self._current_epsilon = self.epsilon
        self._votes: torch.Tensor | None = None  # (N, C) int16 teacher vote counts, on the host
        self._teacher: tuple[nn.Module, object] | None = None  # (f_T, its noise), until the table
        self._table_batch = 1000  # forward rows when counting votes; prepare() sets the run's

    def named_variant(self) -> str | None:
        return "target=self" if self.target == "self" else None

    def epsilon_at(self, epoch: int) -> float:
        """The attack radius of epoch ``epoch`` (0-based): 2ε from ``double_epsilon_epoch``."""
        late = self.double_epsilon_epoch is not None and epoch >= self.double_epsilon_epoch
        return 2.0 * self.epsilon if late else self.epsilon

    @property
    def current_epsilon(self) -> float:
        return self._current_epsilon

    @property
    def teacher_votes(self) -> torch.Tensor | None:
        """The ŷ table: (N, C) int16 counts of the teacher's votes per training image (ŷ =
        counts / ``teacher_draws``), or None before it is built (or with ``target="self"``)."""
        return self._votes

    def prepare(self, config, device):
        # 4·m·B rows without gradients cost about what a training step's m·B rows with them do
        self._table_batch = 4 * self.num_noise * config.batch_size
        if self.target == "teacher" and os.path.isfile(self.teacher_checkpoint):
            # checked before anything is written; a resumed run reads its table from the
            # checkpoint and needs no teacher file
            self._teacher = load_teacher(self.teacher_checkpoint, self.teacher_sigma,
                                         config.dataset, device)

    def on_epoch_start(self, epoch, context):
        self._current_epsilon = self.epsilon_at(epoch)
        if self.target == "teacher":
            self._ensure_votes(context)

    def _ensure_votes(self, context) -> None:
        """Build the ŷ table once (first epoch of a fresh run); check a restored one."""
        n = len(context.train_data)
        if self._votes is not None:  # restored by a resume: the teacher is not needed
            self._teacher = None
            if self._votes.shape[0] != n:
                raise SmoothcertError(
                    f"catrs: the saved ŷ table has {self._votes.shape[0]} rows but the training "
                    f"split has {n} examples; resume with the run's own data and train_size")
            return
        config = context.config
        teacher, noise = self._teacher or load_teacher(
            self.teacher_checkpoint, self.teacher_sigma,
            getattr(config, "dataset", None), context.device or "cpu")
        seed = derived_seed(getattr(config, "seed", 0), _TABLE_STREAM)
        started = time.perf_counter()
        self._votes = teacher_vote_table(teacher, context.train_data, noise, self.teacher_draws,
                                         seed, self._table_batch)
        self._teacher = None  # not needed any more: free its memory
        log.info("catrs: ŷ table of %d images × %d teacher votes in %.1f s", n,
                 self.teacher_draws, time.perf_counter() - started)

    def smoothed_prediction(self, idx: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """ŷ of the training examples ``idx`` (B,): their table rows / ``teacher_draws``, (B, C)
        in ``like``'s dtype and device."""
        if self._votes is None:
            raise SmoothcertError(
                "catrs with target='teacher' has no ŷ table yet: call on_epoch_start(epoch, "
                "context) first (the trainer does)")
        if idx is None:
            raise SmoothcertError(
                "catrs with target='teacher' needs the batch's training-set indices: call "
                "loss(..., idx=INDICES) (the trainer does)")
        counts = self._votes[idx.cpu()]
        return counts.to(device=like.device, dtype=like.dtype) / self.teacher_draws

    def loss(self, model, x, y, noise, generator, idx=None):
        m, b = self.num_noise, x.shape[0]
        noises = draw_noises(noise, x, m, generator)  # (m, B, ...), copy by copy
        target = None if self.target == "self" else self.smoothed_prediction(idx, x)
        uniforms = torch.rand((b, m), generator=generator, device=x.device, dtype=x.dtype)
        out = catrs_loss(
            model, x, y, noises, uniforms, target=target, epsilon=self._current_epsilon,
            num_steps=self.num_steps, lbd=self.lbd, confidence_mask=self.confidence_mask,
        )
        out["epsilon"] = torch.tensor(self._current_epsilon, device=x.device)
        return out

    def state_dict(self):
        return {} if self._votes is None else {"teacher_votes": self._votes}

    def load_state_dict(self, state):
        votes = state.get("teacher_votes")
        if votes is not None and (not isinstance(votes, torch.Tensor) or votes.dim() != 2
                                  or votes.is_floating_point()):
            raise SmoothcertError("catrs: the checkpoint's ŷ table is not an (N, C) tensor of "
                                  "vote counts; the checkpoint is corrupt")
        self._votes = None if votes is None else votes.cpu()


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


def teacher_vote_table(teacher: nn.Module, data, noise, draws: int, seed: int,
                       batch_size: int = 1000) -> torch.Tensor:
    """The ŷ table of :class:`CATRS`: (N, C) counts, int16 on the host, row i the class counts
    of argmax ``teacher``(x_i + δ) over ``draws`` noisy copies of training image i (``data``'s
    un-augmented pixels, ``data.batch``), δ from ``noise``.

    Image i's draws come from its own generator, seeded from (``seed``, i) on the teacher's
    device, through the Monte Carlo engine that certification uses (canonical chunks): the
    table does not depend on ``batch_size`` (rows per forward pass and images per round), on
    the order of the images or on how many processes build it. Each row sums to ``draws``.
    """
    check_count("draws", draws, maximum=MAX_TEACHER_DRAWS)
    device = model_device(teacher)
    smoothed = Smoothed(teacher, noise, data.spec.num_classes)
    table = torch.zeros((len(data), data.spec.num_classes), dtype=torch.int16)
    for chunk in torch.arange(len(data), device=device).split(batch_size):
        x, _ = data.batch(chunk)
        programs = ((i, smoothed.votes_program(xi, draws, example_generator(seed, i, device)))
                    for i, xi in zip(chunk.tolist(), x.to(device)))
        for done in smoothed.run(programs, batch_size):
            table[done.key] = torch.from_numpy(done.result).to(torch.int16)
    return table


def load_teacher(path: str, sigma: float, dataset: str | None,
                 device) -> tuple[nn.Module, object]:
    """(f_T, its noise at ``sigma``): the frozen classifier of smoothcert checkpoint ``path``
    on ``device`` (any architecture), which must have been trained on ``dataset`` (when given)
    with noise at σ = ``sigma``; one SmoothcertError otherwise."""
    from ..models.checkpoint import checkpoint_role, model_from_checkpoint

    if not os.path.exists(path):
        raise SmoothcertError(f"the catrs teacher {path} does not exist; " + _HOW_TO_TEACH)
    model, meta = model_from_checkpoint(path, device)
    if checkpoint_role(meta) != "classifier":
        raise SmoothcertError(f"the catrs teacher {path} holds a {checkpoint_role(meta)}, not a "
                              "classifier; " + _HOW_TO_TEACH)
    if dataset is not None and meta.get("dataset") != dataset:
        raise SmoothcertError(f"the catrs teacher {path} was trained on {meta.get('dataset')}, "
                              f"but this run trains on {dataset}; " + _HOW_TO_TEACH)
    trained = meta.get("noise") or {}
    if trained.get("sigma") is None or not math.isclose(float(trained["sigma"]), sigma):
        raise SmoothcertError(
            f"the catrs teacher {path} was trained at σ = {trained.get('sigma')}, not at "
            f"teacher_sigma = {sigma}; set teacher_sigma to its σ or " + _HOW_TO_TEACH)
    noise = NOISES[trained.get("name", "gaussian")](sigma)
    return model.eval().requires_grad_(False), noise


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


_HOW_TO_TEACH = (
    "train the teacher with the gaussian method at σ_T (e.g. smoothcert train --config "
    "configs/<dataset>/gaussian_teacher_s025.yaml --out runs/teacher), or choose the named "
    "variant --param target=self (the model's own mean softmax; not the paper's method)")


def _check_teacher(target: str, path) -> str | None:
    if path is not None and (not isinstance(path, str) or not path):
        raise SmoothcertError(f"teacher_checkpoint must be a path or null, got {path!r}")
    if target == "teacher" and path is None:
        raise SmoothcertError(
            "catrs trains toward the smoothed prediction of a Gaussian-trained teacher and "
            "needs --param teacher_checkpoint=PATH (in Python or a recipe, the "
            "hyperparameter teacher_checkpoint): " + _HOW_TO_TEACH)
    if target == "self" and path is not None:
        raise SmoothcertError(
            "teacher_checkpoint is only read with target='teacher'; drop it or set that target"
        )
    return path


def _optional_epoch(value) -> int | None:
    if value is None:
        return None
    return check_count("double_epsilon_epoch", value, minimum=0)
