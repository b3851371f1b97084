"""HeatSmoothing: label-free fine-tuning towards the Gaussian average of a pretrained classifier."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import (
    SmoothcertError,
    check_count,
    check_in_range,
    check_nonnegative,
    check_positive_finite,
)
from .base import TrainingMethod, register_method

DISTANCES = ("softmax_mse", "logit_mse", "kl")
"""How v(x̃) is compared with the frozen f(x); see :func:`heat_distance`."""


@register_method("heat")
class HeatSmoothing(TrainingMethod):
    r"""Campbell, Finlay & Oberman, "Adversarial Boot Camp: label free certified robustness in one
    epoch" (arXiv 2010.02508; code: github.com/ryancampbell514/HeatSmoothing): fine-tune a
    pretrained classifier v against a frozen copy f of itself so that v approaches the Gaussian
    average of f, one implicit step of the heat equation at a time (App. A, eq. 15).

    For a batch x (labels are ignored: the method is label-free; the trainer uses y only to log
    training accuracy), with x̃ = x + N(0, σ²I) on a fraction p of the batch and x̃ = x on the rest,
    the loss is the batch mean of

        ½‖softmax v(x̃) − softmax f(x)‖² + γ·h·(σ²/2)·Σ_{j=1..κ} ((w_j·v(x̃ + δĝ_j) − w_j·v(x̃))/δ)²

    where h = 1/n_T, v and f output logits, w_j ~ N(0, I/N_c) are fresh Johnson–Lindenstrauss
    projections of the logits (one per example and j), and ĝ_j = ∇ₓ(w_j·v)(x̃)/‖∇ₓ(w_j·v)(x̃)‖
    (0 where the gradient vanishes) is detached: the sum is a finite-difference estimate of
    ‖∇ₓ v(x̃)‖² (App. B, eq. 16; Alg. 1). Gradients reach v through both terms of each difference.

    Time steps: the run's epochs are split evenly into n_T = ``num_steps`` steps (step of epoch e
    = ⌊e·n_T/E⌋ for E epochs; E ≥ n_T). At the start of each step the current v is deep-copied
    into the frozen f (eval mode, no gradients), so step k trains against the result of step k−1
    and step 0 against the starting weights — give them with ``init_checkpoint`` (CLI
    ``--init-from``): the method is a fine-tuning of a pretrained classifier. The frozen f is part
    of :meth:`state_dict`, so a run resumed inside a step trains against the same f.

    Defaults follow the authors' CIFAR-10 code (``cifar10/train_ours.py``: ``--gamma 5``,
    ``--num-timesteps 5``, ``num_reps = 10``, ``dt = 0.1``; App. B: "δ = 0.1, κ = 10"),
    with p = ½ from the paper (§4.1: noise "to half of the training images"). Their ImageNet recipe
    (``imagenet/run_ours.sh``: ``--num-timesteps 1 --gamma 1.0``; ``train_ours.py``:
    ``num_reps = 6``; §4.1: one epoch of SGD at a fixed learning rate 0.01, σ = 0.25) is
    ``num_steps=1, gamma=1, num_projections=6`` with ``epochs=1, lr=0.01,
    lr_schedule=constant``, and δ = 0.01 according to our issue; the versions of
    ``imagenet/train_ours.py`` we could read use ``dt = 0.1``.

    Where the paper and the authors' scripts differ:

    - The projections act on the logits, as in both scripts (``output * W``); the paper's
      eq. 16 leaves v's output unspecified.
    - The distance term follows the paper's eq. 10 (``distance="softmax_mse"``). The CIFAR-10
      script compares raw logits, ½‖v(x) − f(x)‖² (``"logit_mse"``); their ImageNet script uses
      KL(softmax f(x) ‖ softmax v(x)) (``"kl"``).
    - Noise follows the paper (half of the batch). The CIFAR-10 script adds none
      (``noise_fraction=0``), nor does the ImageNet script version we read.
    - The scripts restart v from random weights at every time step and train it from scratch
      with a fresh optimizer and schedule (CIFAR-10: 200 epochs per step). Here, as in the paper's
      text (§3–4, "retraining a model ... for one epoch"), v carries on from the previous step
      under the run's one optimizer and schedule.
    - The κ shifted inputs x̃ + δĝ_j go through the model as one batch of κ·B rows (the scripts
      loop over j); with BatchNorm in train mode their batch statistics are pooled.

    Measured on digits (digits_cnn, σ = 0.25, a gaussian-trained base at 0.82 noisy test
    accuracy; one epoch, κ = 2, CPU): lr 0.001 with γ·h = 1 keeps it (0.83); at lr 0.01 it falls
    to 0.62, with γ·h = 5 to chance, and ``logit_mse`` diverges even with γ = 0 (its curvature in
    the last layer is large). The fixed lr 0.01 of the ImageNet recipe is not a general choice.

    Draws from the generator, in order: the noise of the first round(p·B) examples of the batch
    (the trainer's batches are shuffled, so they are a random subset), then the projections
    w (κ, B, N_c). ``"logits"`` are v(x̃).
    """

    noises = ("gaussian",)  # it is the Gaussian heat equation

    def __init__(self, *, num_steps: int = 5, gamma: float = 5.0, num_projections: int = 10,
                 fd_step: float = 0.1, noise_fraction: float = 0.5,
                 distance: str = "softmax_mse"):
        self.num_steps = check_count("num_steps", num_steps)  # n_T time steps; h = 1/n_T
        self.gamma = check_nonnegative("gamma", gamma)  # γ: weight of the gradient penalty
        self.num_projections = check_count("num_projections", num_projections)  # κ
        self.fd_step = check_positive_finite("fd_step", fd_step)  # δ, pixel units
        self.noise_fraction = check_in_range("noise_fraction", noise_fraction, 0, 1)  # p
        if distance not in DISTANCES:
            raise SmoothcertError(
                f"distance must be one of {', '.join(DISTANCES)}, got {distance!r}"
            )
        self.distance = distance
        self.teacher: nn.Module | None = None  # the frozen f
        self._step: int | None = None  # the time step the teacher belongs to
        self._saved: dict | None = None  # teacher weights restored by load_state_dict

    def loss(self, model, x, y, noise, generator):
        teacher = self._require_teacher()
        with torch.no_grad():
            target = teacher(x)  # f(x) on the clean batch
        k = int(self.noise_fraction * len(x) + 0.5)  # round half up
        x_tilde = torch.cat([x[:k] + noise.sample(x[:k], generator), x[k:]]) if k else x
        c = target.shape[1]
        shape = (self.num_projections, len(x), c)
        w = torch.randn(shape, generator=generator, device=x.device, dtype=x.dtype) / math.sqrt(c)
        weight = self.gamma * noise.scalar_sigma() ** 2 / (2 * self.num_steps)  # γ·h·σ²/2
        return heat_loss(
            model,
            x_tilde,
            target,
            w,
            fd_step=self.fd_step,
            penalty_weight=weight,
            distance=self.distance,
        )

    def on_epoch_start(self, epoch, context):
        config = context.config
        if epoch == 0 and config is not None and config.init_checkpoint is None:
            raise SmoothcertError(
                "heat fine-tunes a pretrained classifier: give its checkpoint with --init-from "
                "(init_checkpoint)"
            )
        step = time_step(epoch, context.num_epochs, self.num_steps)
        if step == self._step and self._saved is not None:  # resumed inside a step
            self.teacher = frozen_copy(context.model, self._saved)
        elif step != self._step or self.teacher is None:  # a new step: v becomes the frozen f
            self.teacher = frozen_copy(context.model)
        self._step, self._saved = step, None

    def state_dict(self):
        if self.teacher is not None:
            weights = {k: v.detach().cpu().clone() for k, v in self.teacher.state_dict().items()}
        else:
            weights = self._saved
        return {"step": -1 if self._step is None else self._step, "teacher": weights}

    def load_state_dict(self, state):
        self._step = None if state["step"] < 0 else int(state["step"])
        self._saved, self.teacher = state["teacher"], None

    def _require_teacher(self) -> nn.Module:
        if self.teacher is None:
            raise SmoothcertError(
                "heat has no frozen teacher yet: call on_epoch_start(epoch, context) first "
                "(the trainer does)"
            )
        return self.teacher


def heat_loss(
    model: nn.Module,
    x_tilde: torch.Tensor,
    teacher_logits: torch.Tensor,
    projections: torch.Tensor,
    *,
    fd_step: float,
    penalty_weight: float,
    distance: str = "softmax_mse",
) -> dict[str, torch.Tensor]:
    """The HeatSmoothing loss of ``model`` (v) at inputs ``x_tilde`` (B, C, H, W) against the
    frozen ``teacher_logits`` f(x) (B, N_c), with JL ``projections`` w (κ, B, N_c).

    loss = mean_i [ d(v(x̃_i), f(x_i)) + penalty_weight · Σ_j D_ij² ], D from
    :func:`finite_differences`, d from :func:`heat_distance`. Returns ``"loss"``, ``"logits"``
    v(x̃), and the batch means of ``"distance"`` and of the weighted ``"penalty"`` (detached).
    """
    x_tilde = x_tilde.detach().requires_grad_(True)
    logits = model(x_tilde)
    dist = heat_distance(logits, teacher_logits, distance)
    if penalty_weight == 0:  # γ = 0: no gradient penalty, skip its κ backward passes
        penalty = torch.zeros_like(dist)
    else:
        fd = finite_differences(model, x_tilde, logits, projections, fd_step)
        penalty = penalty_weight * fd.pow(2).sum(dim=0)
    loss = (dist + penalty).mean()
    return {
        "loss": loss,
        "logits": logits,
        "distance": dist.mean().detach(),
        "penalty": penalty.mean().detach(),
    }


def finite_differences(
    model: nn.Module,
    x: torch.Tensor,
    logits: torch.Tensor,
    projections: torch.Tensor,
    fd_step: float,
) -> torch.Tensor:
    """D (κ, B): D_ij = (w_ij·v(x_i + δĝ_ij) − w_ij·v(x_i)) / δ, a finite-difference estimate of
    ‖∇ₓ(w_ij·v)(x_i)‖ along the detached unit gradient ĝ_ij (0 where the gradient vanishes).

    ``x`` (B, ...) must require grad and ``logits`` = model(x) must be its graph (kept alive:
    one backward pass per projection, ``retain_graph``). Differentiable in the parameters.
    """
    kappa, b = projections.shape[:2]
    wv = (projections * logits.unsqueeze(0)).sum(dim=-1)  # (κ, B): w_j · v(x)
    directions = torch.stack(
        [
            _unit_rows(torch.autograd.grad(wv[j].sum(), x, retain_graph=True)[0])
            for j in range(kappa)
        ]
    )  # (κ, B, ...), detached
    shifted = x.detach().unsqueeze(0) + fd_step * directions
    out = model(shifted.flatten(0, 1)).view(kappa, b, -1)  # v(x + δĝ_j), one batch of κ·B rows
    return ((projections * out).sum(dim=-1) - wv) / fd_step


def heat_distance(
    logits: torch.Tensor, teacher_logits: torch.Tensor, distance: str
) -> torch.Tensor:
    """Per-example distance (B,) between v's ``logits`` and the teacher's:
    ``softmax_mse`` ½‖softmax v − softmax f‖² (paper eq. 10), ``logit_mse`` ½‖v − f‖² (the
    authors' CIFAR-10 script), ``kl`` KL(softmax f ‖ softmax v) (their ImageNet script)."""
    if distance == "softmax_mse":
        return 0.5 * (logits.softmax(dim=1) - teacher_logits.softmax(dim=1)).pow(2).sum(dim=1)
    if distance == "logit_mse":
        return 0.5 * (logits - teacher_logits).pow(2).sum(dim=1)
    if distance == "kl":
        log_p = F.log_softmax(teacher_logits, dim=1)
        return (log_p.exp() * (log_p - F.log_softmax(logits, dim=1))).sum(dim=1)
    raise SmoothcertError(f"distance must be one of {', '.join(DISTANCES)}, got {distance!r}")


def time_step(epoch: int, num_epochs: int, num_steps: int) -> int:
    """The heat-equation time step (0-based) that epoch ``epoch`` of ``num_epochs`` belongs to
    when the run is split evenly into ``num_steps`` steps: ⌊epoch·num_steps/num_epochs⌋."""
    if num_epochs < num_steps:
        raise SmoothcertError(
            f"heat with num_steps={num_steps} needs at least {num_steps} epochs (one or more per "
            f"time step); the run has {num_epochs}: raise epochs or lower num_steps"
        )
    return epoch * num_steps // num_epochs


def frozen_copy(model: nn.Module, state: dict | None = None) -> nn.Module:
    """A deep copy of ``model`` (with weights ``state`` if given) in eval mode, without grads."""
    teacher = copy.deepcopy(model)
    if state is not None:
        teacher.load_state_dict(state)
    for p in teacher.parameters():
        p.grad = None
    return teacher.eval().requires_grad_(False)


def _unit_rows(g: torch.Tensor) -> torch.Tensor:
    norm = g.flatten(1).norm(dim=1)
    scale = torch.where(norm > 0, norm.reciprocal(), torch.zeros_like(norm))
    return g * scale.view((-1,) + (1,) * (g.dim() - 1))
