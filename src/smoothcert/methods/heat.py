"""HeatSmoothing: label-free fine-tuning towards the Gaussian average of a pretrained classifier."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

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
from ..registry import option
from .base import TrainingMethod, register_method

DISTANCES = ("softmax_mse", "logit_mse", "kl")
"""How v(x̃) is compared with the frozen f(x); see :func:`heat_distance`."""

NOISE_SCHEDULES = ("linear", "constant")
"""The standard deviation of x̃'s noise at each time step; see :func:`noise_scale`."""

IMAGENET_GAMMA = 1.0 * 6 / 1000
"""0.006: the weight of ‖∇ₓv‖²_F in the authors' ImageNet run, γ_a·κ/N_c with their ``--gamma``
γ_a = 1 on a sum of κ = 6 projections of N_c = 1000 logits (see :class:`HeatSmoothing`)."""


@register_method("heat")
class HeatSmoothing(TrainingMethod):
    r"""Campbell, Finlay & Oberman, "Adversarial Boot Camp: label free certified robustness in one
    epoch" (arXiv 2010.02508; code: github.com/ryancampbell514/HeatSmoothing): fine-tune a
    pretrained classifier v against a frozen copy f of itself so that v approaches the Gaussian
    average of f, one implicit step of the heat equation at a time (App. A, eqs. 11–15).

    Loss. For a batch x (labels are ignored: the method is label-free; the trainer uses y only to
    log training accuracy), the batch mean of the paper's eq. 10 with the time step h = 1/n_T of
    eq. 15, a weight γ and the gradient norm estimated as in App. B (eqs. 16–18):

        d(v(x̃), f(x)) + γ·h·(σ²/2)·(N_c/κ)·Σ_{j=1..κ} D_j²,
        D_j = (w_j·v(x̃ + δĝ_j) − w_j·v(x̃)) / δ,

    where v and f output N_c logits, d = ½‖softmax v(x̃) − softmax f(x)‖² (eq. 10; ``distance``),
    w_j ~ N(0, I/N_c) are fresh Johnson–Lindenstrauss projections of the logits (eq. 17 with
    K = N_c; one per example and j), and ĝ_j = ∇ₓ(w_j·v)(x̃)/‖∇ₓ(w_j·v)(x̃)‖ (eq. 18; 0 where the
    gradient vanishes) is detached. Gradients reach v through both terms of each D_j.

    Noise. x̃ = x + η on round(p·B) examples of the batch, a random subset drawn from the
    generator (p = ``noise_fraction``), and x̃ = x on the rest; η ~ N(0, s²I) in pixel units with
    s = σ·t/n_T at time step t = 1..n_T (``noise_schedule="linear"``) or s = σ (``"constant"``:
    eq. 10 as printed, and this method's noise up to this version). At n_T = 1 both give s = σ.
    The frozen f always sees the clean x.

    Scale of the gradient term (verified on the paper and the scripts). For a Jacobian
    J = ∇ₓv (N_c × d) and w ~ N(0, I/N_c), E‖Jᵀw‖² = ‖J‖²_F/N_c, and D_j → ‖Jᵀw_j‖ as δ → 0
    (exactly for a linear v): the eq.-16 sum Σ_j D_j² estimates (κ/N_c)·‖J‖²_F, not the ‖∇ₓv‖²
    it stands for; the two agree only for κ = N_c (App. B: "δ = 0.1, κ = 10, and K = Nc",
    i.e. CIFAR-10). The factor N_c/κ above makes the penalty γ·h·(σ²/2)·‖∇ₓv‖²_F in expectation for
    any κ and N_c: γ = 1 is eq. 10/15 as printed, and κ only sets the estimate's variance and
    cost. The scripts put their ``--gamma`` γ_a on the raw sum, so their weight of ‖J‖²_F is
    γ = γ_a·κ/N_c: ImageNet γ_a = 1, κ = 6, N_c = 1000 → γ = 0.006 (:data:`IMAGENET_GAMMA`, the
    ImageNet-equivalent scale at any N_c); CIFAR-10 γ_a = 5, κ = N_c = 10 → γ = 5, 833× that.
    Up to this version ``gamma`` multiplied the raw sum: for κ = N_c (every recipe: κ = 10 on 10
    classes) the loss is unchanged; an older run with κ ≠ N_c is this one with γ = γ_old·κ/N_c.

    Time steps: the run's epochs are split evenly into n_T = ``num_steps`` steps (step of epoch e
    = ⌊e·n_T/E⌋ for E epochs; E ≥ n_T). At the start of each step the current v is deep-copied
    into the frozen f (eval mode, no gradients), so step k trains against the result of step k−1
    and the first step against the starting weights, given with ``init_checkpoint`` (CLI
    ``--init-from``): the method is a fine-tuning of a pretrained classifier. The frozen f is part
    of :meth:`state_dict`, so a run resumed inside a step trains against the same f.

    Defaults: the authors' final ImageNet script, commit 38522bc ("updated ImageNet training"; its
    loss is unchanged through HEAD a67b3d8), ``imagenet/train_ours.py``: the softmax-L2 distance
    (L181–184), δ = ``dt = 0.01`` (L210), noise in pixel units (L171, L176) on each example with
    probability p = 0.5 (L172–175) of std ``args.std*(timestep/args.num_timesteps)`` (L174;
    ``timestep`` = 1..n_T, L90), f on the clean x (L179), W = N(0, I)/√1000 (L190, L196),
    κ = ``num_reps = 6`` (L192), weight ``gamma*0.5*(1/num_timesteps)*std**2`` on the raw sum
    (L221); ``imagenet/run_ours.sh`` as of 246b7db: ``--std 0.25 --num-timesteps 1 --gamma 1.0``
    (L32–34; 246b7db also sets train_ours.py's ``--num-timesteps`` default to 1, L58). Hence
    ``num_steps=1``, ``gamma=0.006``, ``fd_step=0.01``, ``noise_fraction=0.5``,
    ``distance="softmax_mse"``, ``noise_schedule="linear"``; ``num_projections=10`` is the
    paper's κ (App. B; Alg. 1: "default = 10"), not the script's 6. The paper's ImageNet run
    (§4.1) is one epoch of SGD at a fixed lr 0.01, σ = 0.25, from a ResNet-50 "trained on clean
    images for 29 epochs with the cross-entropy loss" (``epochs=1, lr=0.01,
    lr_schedule=constant`` and a clean-trained ``init_checkpoint``).

    Earlier scripts, selectable here: ``imagenet/train_ours.py`` before 38522bc (e.g. a8a1855)
    used KL(softmax f ‖ softmax v) (L201; ``distance="kl"``), δ = 0.1 (L234), no noise
    (``noise_fraction=0``), n_T = 5 (L54), ``run_ours.sh --gamma 100`` (L31; γ = 0.6 here) and a
    random v at every time step (L127–131). The CIFAR-10 script ``cifar10/train_ours.py`` (HEAD)
    compares logits, ½‖v − f‖² (L181; ``"logit_mse"``), adds no noise, and has κ = 10 (L189),
    W/√10 (L197–198), δ = 0.1 (L213), γ_a = 5 (L29), n_T = 5 steps of 200 epochs (L73–74), each
    from a random v (L275–289): App. E's CIFAR-10 run.

    Other differences from the scripts:

    - Exactly round(p·B) examples are noisy (the paper: "half of the training images"); the final
      script draws a Bernoulli(p) mask per example (L173), so their number varies.
    - ĝ = 0 where the gradient vanishes (eq. 18); the ImageNet script divides by the norm (L208).
    - v carries on from step to step under the run's one optimizer and schedule; the final
      ImageNet script also continues from v but builds a new optimizer and schedule at each step
      (L103–121), which is the same at n_T = 1.
    - The κ shifted inputs go through the model as one batch of κ·B rows (the scripts loop over
      j); with BatchNorm in train mode their batch statistics are pooled.

    Measured on digits (digits_cnn, σ = 0.25, a gaussian-trained base at 0.82 noisy test
    accuracy; one epoch, CPU): the defaults (γ = 0.006, κ = 10, δ = 0.01, n_T = 1) at the
    paper's lr 0.01 keep it (0.82 → 0.83, tests/methods/test_heat.py). Before this version (δ = 0.1,
    κ = 2, old γ 1 and 5, i.e. γ = 0.2 and 1 on this scale): lr 0.001 with γ = 0.2 kept it
    (0.83); at lr 0.01, γ = 0.2 fell to 0.62 and γ = 1 to chance. ``logit_mse`` diverges even
    with γ = 0 (its curvature in the last layer is large).

    Draws from the generator, in order: the permutation choosing the noisy examples (none when
    round(p·B) = 0), their noise, then the projections w (κ, B, N_c). ``"logits"`` are v(x̃).
    """

    noises = ("gaussian",)  # it is the Gaussian heat equation

    @dataclass(frozen=True)
    class Options:
        num_steps: int = option(1, "n_T: time steps (h = 1/n_T), each from a new frozen f")
        gamma: float = option(IMAGENET_GAMMA, "γ: weight of the estimate of ‖∇ₓv‖²_F")
        num_projections: int = option(10, "κ: random projections of the Jacobian")
        fd_step: float = option(0.01, "δ: finite-difference step, pixel units")
        noise_fraction: float = option(0.5, "p: fraction of the batch that gets noise, in [0, 1]")
        distance: str = option("softmax_mse", "how v(x̃) is compared with f(x)",
                               choices=DISTANCES)
        noise_schedule: str = option("linear", "σ of x̃'s noise per time step",
                                     choices=NOISE_SCHEDULES)

        def __post_init__(self):
            check_count("num_steps", self.num_steps), check_nonnegative("gamma", self.gamma)
            check_count("num_projections", self.num_projections)
            check_positive_finite("fd_step", self.fd_step)
            check_in_range("noise_fraction", self.noise_fraction, 0, 1)
            _check_choice("distance", self.distance, DISTANCES)
            _check_choice("noise_schedule", self.noise_schedule, NOISE_SCHEDULES)

    def setup(self):
        self.teacher: nn.Module | None = None  # the frozen f
        self._step: int | None = None  # the time step (0-based) the teacher belongs to
        self._saved: dict | None = None  # teacher weights restored by load_state_dict

    def loss(self, model, x, y, noise, generator):
        teacher = self._require_teacher()
        with torch.no_grad():
            target = teacher(x)  # f(x) on the clean batch
        scale = noise_scale(self._step, self.num_steps, self.noise_schedule)
        x_tilde = noisy_subset(x, noise, self.noise_fraction, scale, generator)
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

    loss = mean_i [ d(v(x̃_i), f(x_i)) + penalty_weight · Ĵ_i ], with d from
    :func:`heat_distance` and Ĵ = (N_c/κ)·Σ_j D_j² the estimate of ‖∇ₓv(x̃_i)‖²_F of
    :func:`jacobian_sq_norm` (D from :func:`finite_differences`). Returns ``"loss"``,
    ``"logits"`` v(x̃), and the batch means of ``"distance"`` and of the weighted ``"penalty"``
    (detached).
    """
    x_tilde = x_tilde.detach().requires_grad_(True)
    logits = model(x_tilde)
    dist = heat_distance(logits, teacher_logits, distance)
    if penalty_weight == 0:  # γ = 0: no gradient penalty, skip its κ backward passes
        penalty = torch.zeros_like(dist)
    else:
        fd = finite_differences(model, x_tilde, logits, projections, fd_step)
        penalty = penalty_weight * jacobian_sq_norm(fd, projections.shape[-1])
    loss = (dist + penalty).mean()
    return {
        "loss": loss,
        "logits": logits,
        "distance": dist.mean().detach(),
        "penalty": penalty.mean().detach(),
    }


def jacobian_sq_norm(fd: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Ĵ (B,) = (N_c/κ)·Σ_j D_j² for finite differences ``fd`` D (κ, B) along projections
    w ~ N(0, I/N_c) of ``num_classes`` = N_c outputs: an estimate of ‖∇ₓv‖²_F.

    E_w[‖Jᵀw‖²] = ‖J‖²_F/N_c for a fixed Jacobian J, and D_j = ‖Jᵀw_j‖ for a linear v (to O(δ)
    otherwise), so E[Ĵ] = ‖J‖²_F: the raw sum of the paper's eq. 16 is (κ/N_c)·Ĵ."""
    kappa = fd.shape[0]
    return fd.pow(2).sum(dim=0) * (num_classes / kappa)


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
    ``softmax_mse`` ½‖softmax v − softmax f‖² (paper eq. 10; the authors' final ImageNet
    script), ``logit_mse`` ½‖v − f‖² (eq. 15; their CIFAR-10 script), ``kl``
    KL(softmax f ‖ softmax v) (their ImageNet script before commit 38522bc)."""
    if distance == "softmax_mse":
        return 0.5 * (logits.softmax(dim=1) - teacher_logits.softmax(dim=1)).pow(2).sum(dim=1)
    if distance == "logit_mse":
        return 0.5 * (logits - teacher_logits).pow(2).sum(dim=1)
    if distance == "kl":
        log_p = F.log_softmax(teacher_logits, dim=1)
        return (log_p.exp() * (log_p - F.log_softmax(logits, dim=1))).sum(dim=1)
    raise SmoothcertError(f"distance must be one of {', '.join(DISTANCES)}, got {distance!r}")


def noise_scale(step: int, num_steps: int, schedule: str) -> float:
    """s/σ, the noise std of time step ``step`` (0-based) of ``num_steps`` relative to σ:
    ``linear`` (step+1)/n_T, i.e. σ·t/n_T for t = 1..n_T (the authors' final ImageNet script);
    ``constant`` 1 (the paper's eq. 10)."""
    if schedule == "linear":
        return (step + 1) / num_steps
    if schedule == "constant":
        return 1.0
    raise SmoothcertError(
        f"noise_schedule must be one of {', '.join(NOISE_SCHEDULES)}, got {schedule!r}"
    )


def noisy_subset(
    x: torch.Tensor, noise, fraction: float, scale: float, generator: torch.Generator
) -> torch.Tensor:
    """x̃: the batch ``x`` (B, ...) with ``scale``·``noise`` added to round(``fraction``·B)
    examples (round half up) and the others unchanged. Which examples: the first of a random
    permutation of the batch drawn from ``generator``; then their noise, in that order."""
    k = int(fraction * len(x) + 0.5)
    if k == 0:
        return x
    rows = torch.randperm(len(x), generator=generator, device=x.device)[:k]
    x_tilde = x.clone()
    x_tilde[rows] = x[rows] + scale * noise.sample(x[rows], generator)
    return x_tilde


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


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise SmoothcertError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _unit_rows(g: torch.Tensor) -> torch.Tensor:
    norm = g.flatten(1).norm(dim=1)
    scale = torch.where(norm > 0, norm.reciprocal(), torch.zeros_like(norm))
    return g * scale.view((-1,) + (1,) * (g.dim() - 1))
