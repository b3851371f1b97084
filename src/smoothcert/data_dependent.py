"""Data-dependent randomized smoothing: a σ per input, and a memory that keeps it sound.

Alfarra, Bibi, Torr & Ghanem, "Data Dependent Randomized Smoothing" (arXiv:2012.04351), and
the authors' code, github.com/MotasemAlfarra/Data_Dependent_Randomized_Smoothing (files
``optimize_sigma.py``, ``CIFAR10/train_*.py``, ``post_processing_memory_based.py``).

* :func:`optimize_sigma` is the paper's Algorithm 1 (OptimizeSigma): per input x, stochastic
  gradient ascent over σ on the soft certified radius, with reparameterized noise.
* :class:`Memory` is the paper's Algorithm 3 (Section 3.5 and Appendix C): it post-processes the
  Monte Carlo certificates of the data-dependent classifier so that no two certified balls of
  different classes ever intersect, which is what makes the certificates sound.
* :class:`PerExampleSigma` is the paper's Algorithm 2 (training): every training example keeps
  its σ across epochs, moved by OptimizeSigma before each step (``TrainConfig.sigma_mode``).

The uniform-noise / L1 variant replaces the Gaussian soft radius σ/2·(Φ⁻¹(ψ_A) − Φ⁻¹(ψ_B)) by
λ·(ψ_A − ψ_B), λ = √3·σ (Yang et al. 2020; the L1 certificate of the authors' follow-up
library ``ddsmoothing/certificate.py``). σ is always the noise's standard deviation.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .errors import SmoothcertError, check_count, unknown_name
from .noise import NOISES, Gaussian
from .sampling import eval_mode, model_device

# Defaults of Algorithm 1, from the code that produced the paper's certification numbers.
NUM_STEPS = 100
"""K: ``--iter_sig_after 100`` (σ optimization of the test set after training) in the authors'
``CIFAR10/train_macer.py`` and ``CIFAR10/train_smooth_adv.py``; the paper's K = 100 (its
Appendix B budget, and the first row of each K ablation in its appendix tables)."""
STEP_SIZE = 1e-4
"""α_σ, in pixel units of σ per unit of radius gradient: ``--lr_sig 0.0001`` in all of the
authors' training scripts (CIFAR10 and ImageNet)."""
NUM_SAMPLES = 1
"""n, noise draws per input and step: one draw in ``CIFAR10/train_smooth_adv.py`` (``get_sigma``)
and ``--gaussian_num_ds 1`` in ``ImageNet/train_rs.py``; the paper's Appendix B counts
K = 100, n = 1 as 200 forward/backward evaluations per input. (``CIFAR10/train_macer.py``
uses 64.)"""
CLAMP = (0.02, 0.98)
"""ψ is clamped to [0.02, 0.98] before Φ⁻¹: ``clamp_(0.02, 0.98)`` in ``optimize_sigma.py``
and every ``get_sigma`` of the authors' scripts. (Their later ``ddsmoothing`` library uses
[0.001, 0.999].) Outside the interval the clamp has zero gradient, as in their code."""
MIN_SIGMA = 1e-3
"""Floor that keeps σ_x positive (pixel units, a quarter of one uint8 grey level). Not in the
authors' code, which takes plain steps and never needed it at α_σ = 1e-4."""


# --------------------------------------------------------------------------- Algorithm 1
def optimize_sigma(
    model: nn.Module,
    x: torch.Tensor,
    sigma0,
    *,
    num_steps: int = NUM_STEPS,
    step_size: float = STEP_SIZE,
    num_samples: int = NUM_SAMPLES,
    generator: torch.Generator | None,
    noise: str = "gaussian",
    clamp: tuple[float, float] = CLAMP,
    min_sigma: float = MIN_SIGMA,
) -> torch.Tensor:
    """OptimizeSigma (Alfarra et al., Algorithm 1): σ_x maximizing the soft certified radius.

    ``x`` (B, C, H, W) in [0, 1]; ``sigma0`` a float or a (B,) tensor (the training σ, or in
    training the σ_x of the previous epoch). Each of the ``num_steps`` steps draws fresh unit
    noise ε (n = ``num_samples`` per input, from ``generator``), forms ψ = mean softmax of
    f(x + σ·ε) (the reparameterization trick: ε does not depend on σ), and takes the ascent step
    σ ← max(σ + α_σ·∂R/∂σ, ``min_sigma``) on

    * Gaussian noise: R(σ) = σ/2·(Φ⁻¹(ψ_A) − Φ⁻¹(ψ_B)), ψ clamped to ``clamp``;
    * uniform noise:  R(σ) = λ·(ψ_A − ψ_B), λ = √3·σ (no clamp: there is no Φ⁻¹);

    where ψ_A, ψ_B are the top two entries of ψ (no label is used: at certification there is
    none, and the authors' code takes ``topk(ψ, 2)``). The B inputs are optimized together but
    independently. The model is put in eval mode (its previous mode is restored) and gets no
    parameter gradients. Returns σ_x, shape (B,), detached, on the model's device, in x's dtype,
    ≥ ``min_sigma``.

    This is a heuristic: σ_x carries no guarantee by itself. Certificates come from CERTIFY at
    σ_x, made sound for the data-dependent classifier by :class:`Memory`.
    """
    _check_optimize_args(x, num_steps, step_size, num_samples, noise, clamp, min_sigma)
    unit = NOISES[noise](1.0)  # ε with unit standard deviation; the draws are then σ·ε
    # gradients are needed even when the caller runs under no_grad or inference_mode
    with torch.inference_mode(False), torch.enable_grad(), eval_mode(model), _frozen(model):
        x = x.detach().to(model_device(model))
        sigma = _initial_sigma(sigma0, x)
        x_rep = x.repeat_interleave(num_samples, dim=0)  # rows i·n … i·n+n−1 are input i's
        for _ in range(num_steps):
            sigma.requires_grad_(True)
            eps = unit.sample(x_rep, generator)  # fresh draws each step
            psi = _soft_scores(model, x_rep, sigma, eps, num_samples)
            radius = _soft_radius(psi, sigma, noise, clamp)
            (grad,) = torch.autograd.grad(radius.sum(), sigma)
            sigma = (sigma.detach() + step_size * grad).clamp_min(min_sigma)
    return sigma.detach()


@torch.no_grad()
def soft_radius(
    model: nn.Module,
    x: torch.Tensor,
    sigma,
    *,
    num_samples: int,
    generator: torch.Generator | None,
    noise: str = "gaussian",
    clamp: tuple[float, float] = CLAMP,
) -> torch.Tensor:
    """Monte Carlo estimate of the objective R(σ) of :func:`optimize_sigma`, shape (B,).

    Useful to compare σ_x against σ0; it is an estimate of a smooth surrogate, not a certificate.
    """
    _check_optimize_args(x, 0, 0.0, num_samples, noise, clamp, MIN_SIGMA)
    x = x.to(model_device(model))
    sigma = _initial_sigma(sigma, x)
    x_rep = x.repeat_interleave(num_samples, dim=0)
    eps = NOISES[noise](1.0).sample(x_rep, generator)
    with eval_mode(model):
        return _soft_radius(_soft_scores(model, x_rep, sigma, eps, num_samples), sigma, noise,
                            clamp)


def _soft_scores(model, x_rep, sigma, eps, num_samples) -> torch.Tensor:
    """ψ (B, C): the mean softmax of f(x + σ·ε) over each input's ``num_samples`` draws."""
    scale = sigma.repeat_interleave(num_samples).view((-1,) + (1,) * (x_rep.dim() - 1))
    probs = F.softmax(model(x_rep + scale * eps), dim=1)
    return probs.view(sigma.shape[0], num_samples, -1).mean(dim=1)


def _soft_radius(psi: torch.Tensor, sigma: torch.Tensor, noise: str, clamp) -> torch.Tensor:
    top2 = psi.topk(2, dim=1).values
    if noise == "uniform":  # λ·(ψ_A − ψ_B), λ = √3·σ
        return math.sqrt(3.0) * sigma * (top2[:, 0] - top2[:, 1])
    psi_a, psi_b = top2.clamp(*clamp).unbind(dim=1)  # σ/2·(Φ⁻¹(ψ_A) − Φ⁻¹(ψ_B))
    return sigma / 2 * (torch.special.ndtri(psi_a) - torch.special.ndtri(psi_b))


def _initial_sigma(sigma0, x: torch.Tensor) -> torch.Tensor:
    batch = x.shape[0]
    if isinstance(sigma0, torch.Tensor):
        sigma = sigma0.detach().to(device=x.device, dtype=x.dtype).reshape(-1)
        if sigma.numel() == 1:
            sigma = sigma.expand(batch)
    elif isinstance(sigma0, (int, float)) and not isinstance(sigma0, bool):
        sigma = torch.full((batch,), float(sigma0), device=x.device, dtype=x.dtype)
    else:
        raise SmoothcertError(f"σ0 must be a number or a (B,) tensor, got {type(sigma0).__name__}")
    if sigma.shape != (batch,):
        raise SmoothcertError(f"σ0 has {sigma.numel()} entries but x has {batch} inputs")
    if not torch.isfinite(sigma).all() or (sigma <= 0).any():
        raise SmoothcertError("σ0 must be positive and finite for every input")
    return sigma.clone()


def _check_optimize_args(x, num_steps, step_size, num_samples, noise, clamp, min_sigma) -> None:
    if noise not in NOISES:
        raise unknown_name("noise", noise, NOISES)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2:
        raise SmoothcertError("x must be a floating-point batch of shape (B, C, H, W)")
    if not torch.isfinite(x).all():
        raise SmoothcertError("x contains NaN or Inf")
    check_count("num_steps", num_steps, minimum=0), check_count("num_samples", num_samples)
    if not math.isfinite(step_size) or step_size < 0:
        raise SmoothcertError(f"step_size must be a finite number >= 0, got {step_size!r}")
    low, high = clamp
    if not 0.0 < low < high < 1.0:
        raise SmoothcertError(f"clamp must satisfy 0 < low < high < 1, got {clamp!r}")
    if not math.isfinite(min_sigma) or min_sigma <= 0:
        raise SmoothcertError(f"min_sigma must be a positive number, got {min_sigma!r}")


@contextlib.contextmanager
def _frozen(model: nn.Module):
    """No parameter gradients inside the block; each parameter's flag is restored after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


# --------------------------------------------------------------------------- Algorithm 3
@dataclass(frozen=True)
class MemoryCertificate:
    """The memory classifier's answer at x: what Algorithm 3 made of a Monte Carlo certificate.

    ``case`` names the paper's Figure 2: "kept" (left: no ball of another class is met),
    "inside" (middle: x lies in a stored ball of another class, whose class it takes),
    "shrunk" (right: the ball is reduced until it meets no ball of another class). ``adjusted``
    is True when ``prediction`` or ``radius`` differ from the Monte Carlo certificate's.
    ``prediction`` is None for an abstention (which stays one unless x lies in a stored ball).
    """

    prediction: int | None
    radius: float
    adjusted: bool
    case: str


class Memory:
    """Memory-based certification (Alfarra et al., Section 3.5, Appendix C, Algorithm 3).

    The memory holds (x_i, c_i, R_i) for every input certified so far, and keeps the invariant

        ‖x_i − x_j‖ ≥ R_i + R_j   whenever c_i ≠ c_j,

    i.e. the open balls B(x_i, R_i) of different classes are disjoint (``norm`` is "l2", or "l1"
    for uniform noise). A new Monte Carlo certificate (c, R) at x is handled by
    :meth:`certify`:

    1. LargestInSubset: if x lies in a stored ball of another class c_j (‖x − x_j‖ < R_j), the
       memory classifier already predicts c_j there. x takes c_j with the largest ball inside
       both its own ball and B(x_j, R_j): R̃ = min(R, R_j − ‖x − x_j‖) (the max over such j;
       all of them have the same class by the invariant).
    2. LargestOutSubset: otherwise R̃ = min(R, min_j (‖x − x_j‖ − R_j)) over the stored
       entries j of other classes: the largest ball around x meeting none of them.
    3. (x, c̃, R̃) is added to the memory.

    Each certificate then holds for the memory classifier with the probability of its Monte
    Carlo certificate, and every stored ball stays valid forever, since later entries are
    fitted around it. Radii never grow.

    Rules not spelled out by the paper, and how we chose:

    * An abstention (c = None, R = 0) makes no claim, so it is not stored; but if x lies in a
      stored ball it takes that ball's class with radius min(0, …) = 0 (the memory classifier
      does predict c_j at x). The authors' ``post_processing_memory_based.py`` stores −1 as a
      class, so later balls are shrunk away from abstained points; we do not, as nothing was
      certified there.
    * The paper takes min(R, R_j − ‖x − x_j‖) in case 1; the authors' post-processing script
      takes R_j − ‖x − x_j‖ alone, which can exceed R. We follow the paper.
    * A radius shrunk to 0 keeps its class: it still claims the prediction at x itself, and
      is stored, so no later ball of another class may contain x.

    **Order dependence.** The outcome depends on the order of insertion (the paper's
    limitations section says so too): a point certified first keeps its ball, and later
    points are fitted around it. The memory is one global object, so certification must be
    sequential over one ordered index list.
    """

    def __init__(self, norm: str = "l2"):
        if norm not in ("l1", "l2"):
            raise SmoothcertError(f"memory norm must be 'l1' or 'l2', got {norm!r}")
        self.norm = norm
        self._centers = torch.empty((0, 0), dtype=torch.float64)
        self._classes = np.empty(0, dtype=np.int64)
        self._radii = np.empty(0, dtype=np.float64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def classes(self) -> np.ndarray:
        return self._classes[: self._size].copy()

    @property
    def radii(self) -> np.ndarray:
        return self._radii[: self._size].copy()

    @property
    def centers(self) -> torch.Tensor:
        """The stored inputs, flattened: shape (M, D), in float64."""
        return self._centers[: self._size].double()

    def certify(self, x: torch.Tensor, prediction: int | None, radius: float) -> MemoryCertificate:
        """Algorithm 3 for one Monte Carlo certificate, then store the result.

        ``x`` is one input of any shape (it is flattened; all inputs must have the same size);
        ``prediction`` the certified class, or None for an abstention; ``radius`` ≥ 0 its radius
        in ``norm``. Returns the memory classifier's answer; distances are computed in float64.
        """
        radius = float(radius) if prediction is not None else 0.0
        if radius < 0 or not math.isfinite(radius):
            raise SmoothcertError(f"a certified radius must be finite and >= 0, got {radius!r}")
        dist = self.distances(x)
        other = self._classes[: self._size] != (-1 if prediction is None else prediction)
        stored = self._radii[: self._size]
        inside = other & (dist < stored)
        if inside.any():  # Figure 2, middle: x already belongs to a ball of another class
            j = np.flatnonzero(inside)[np.argmax(stored[inside] - dist[inside])]
            new_class = int(self._classes[j])
            new_radius = min(radius, float(stored[j] - dist[j]))
            result = MemoryCertificate(new_class, new_radius, True, "inside")
        elif other.any() and prediction is not None:
            gap = float(np.min(dist[other] - stored[other]))  # Figure 2, right, if gap < R
            new_radius = min(radius, gap)
            case = "shrunk" if new_radius < radius else "kept"
            result = MemoryCertificate(prediction, new_radius, case == "shrunk", case)
        else:  # Figure 2, left: nothing of another class is met
            result = MemoryCertificate(prediction, radius, False, "kept")
        if result.prediction is not None:
            self.add(x, result.prediction, result.radius)
        return result

    def add(self, x: torch.Tensor, prediction: int, radius: float) -> None:
        """Store an entry as is (rebuilding a memory from records that already passed
        :meth:`certify`, in their original order)."""
        point = x.detach().reshape(-1).cpu()
        if self._size and point.numel() != self._centers.shape[1]:
            raise SmoothcertError(
                f"input has {point.numel()} values; the memory holds {self._centers.shape[1]}"
            )
        if self._size == self._centers.shape[0]:
            self._grow(point)
        self._centers[self._size] = point
        self._classes[self._size] = int(prediction)
        self._radii[self._size] = float(radius)
        self._size += 1

    def distances(self, x: torch.Tensor) -> np.ndarray:
        """‖x − x_j‖ (in ``norm``) to every stored x_j, computed in float64, shape (M,)."""
        if self._size == 0:
            return np.empty(0, dtype=np.float64)
        point = _flat(x)
        order = 1 if self.norm == "l1" else 2
        chunks = [
            torch.linalg.vector_norm(rows.double() - point, ord=order, dim=1)
            for rows in self._centers[: self._size].split(_CHUNK)
        ]
        return torch.cat(chunks).numpy()

    def _grow(self, point: torch.Tensor) -> None:
        """Double the capacity. Centers keep the inputs' own dtype (float32 images are stored
        exactly in half the memory of float64); distances are float64 all the same."""
        capacity = max(16, 2 * self._centers.shape[0])
        dtype = self._centers.dtype if self._size else point.dtype
        centers = torch.empty((capacity, point.numel()), dtype=dtype)
        if self._size:
            centers[: self._size] = self._centers[: self._size]
        self._centers = centers
        self._classes = np.resize(self._classes, capacity)
        self._radii = np.resize(self._radii, capacity)


_CHUNK = 4096  # rows per float64 distance batch: bounds the temporary memory


def _flat(x: torch.Tensor) -> torch.Tensor:
    """x as a flat float64 CPU vector (the memory's distances are computed in float64)."""
    return x.detach().reshape(-1).to(device="cpu", dtype=torch.float64)


# --------------------------------------------------------------------------- training (Alg. 2)
class FixedSigma:
    """``sigma_mode="fixed"``: every example is trained at the run's σ."""

    def __init__(self, config, num_examples: int, device: torch.device):
        self.noise = Gaussian(config.sigma)

    def noise_for(self, model, x, idx, generator, epoch: int) -> Gaussian:
        """The noise to train the batch ``x`` (training-set indices ``idx``) with."""
        return self.noise

    def log_columns(self) -> dict[str, float]:
        return {}

    def state(self) -> torch.Tensor | None:
        return None

    def load_state(self, state) -> None:
        return None


class PerExampleSigma:
    """``sigma_mode="data_dependent"``: Alfarra et al. 2022, Algorithm 2.

    ``sigmas`` (N,) holds one σ per training example (float32, on the training device),
    initialised to ``config.sigma``. From epoch ``dd_start_epoch`` on, each batch first runs
    OptimizeSigma on its examples, starting from their stored σ (``dd_steps`` ascent steps of size
    ``dd_step_size`` on the soft certified radius, ``dd_num_samples`` draws per step, from the
    run's training generator), stores the result back, and is trained with
    ``Gaussian(sigmas[idx])``: example i at its own σ_i. So every example's σ moves ``dd_steps``
    steps per epoch and each epoch starts from the σ of the previous one ("we initialize σ at each
    epoch with σ computed at the previous epoch", §3.6).

    As in the authors' scripts (``train`` in ``ImageNet/train_rs.py``, ``CIFAR10/train_macer.py``)
    σ is optimised per batch right before that batch's step, on the same (augmented) inputs the
    step trains on, not in a separate pass before or after the epoch. One deviation:
    :func:`~smoothcert.data_dependent.optimize_sigma` runs the model in eval mode (BatchNorm
    with its running statistics, which the extra forward passes leave untouched), where the
    authors' training scripts leave it in train mode. Indices repeated within one batch get one
    of their optimised values. The test-accuracy column keeps using ``config.sigma`` (the authors'
    default ``--iter_sig_ts 0`` leaves the test σ at its initial value during training).
    """

    def __init__(self, config, num_examples: int, device: torch.device):
        self.config = config
        self.fixed = Gaussian(config.sigma)
        self.sigmas = torch.full((num_examples,), config.sigma, device=device)

    def noise_for(self, model, x, idx, generator, epoch: int) -> Gaussian:
        c = self.config
        if epoch < c.dd_start_epoch:
            return self.fixed
        sigma = optimize_sigma(
            model, x, self.sigmas[idx], num_steps=c.dd_steps, step_size=c.dd_step_size,
            num_samples=c.dd_num_samples, generator=generator,
        ).to(self.sigmas)
        self.sigmas[idx] = sigma
        return Gaussian(sigma)

    def log_columns(self) -> dict[str, float]:
        """Mean, min and max σ over the training set (one host synchronisation per epoch)."""
        s = self.sigmas
        return {"sigma_mean": s.mean().item(), "sigma_min": s.min().item(),
                "sigma_max": s.max().item()}

    def state(self) -> torch.Tensor:
        return self.sigmas.detach().cpu().clone()

    def load_state(self, state) -> None:
        ok = isinstance(state, torch.Tensor) and state.shape == self.sigmas.shape
        if not ok:
            raise SmoothcertError(
                f"the checkpoint holds no per-example σ of shape {tuple(self.sigmas.shape)} "
                f"(got {state!r:.80}); it was not written by this data-dependent run"
            )
        self.sigmas.copy_(state)


SIGMA_MODES: dict[str, Callable[..., FixedSigma | PerExampleSigma]] = {
    "fixed": FixedSigma,
    "data_dependent": PerExampleSigma,
}
"""How the σ of each training example is chosen, by ``TrainConfig.sigma_mode``."""
