"""σ modes of training: how the σ of each training example is chosen (``TrainConfig.sigma_mode``).

* ``fixed``: every example at the run's σ;
* ``data_dependent``: Alfarra et al., "Data Dependent Randomized Smoothing", Algorithm 2 — every
  example keeps its own σ across epochs, moved by OptimizeSigma
  (:func:`smoothcert.smoothing.sigma_optimization.optimize_sigma`) before each step.

A σ mode is built as a training method is: its parameters (``TrainConfig.sigma_mode_params``,
``--sigma-param KEY=VALUE``) are one frozen dataclass, its nested ``Options``, checked by
:func:`smoothcert.registry.parse_options` (:func:`build_sigma_mode` names the valid ones).
The config asks :meth:`SigmaMode.check_noise` whether the mode can train with the run's noise;
the trainer then calls :meth:`SigmaMode.start` once with the run's noise and training-set size, and
:meth:`SigmaMode.noise_for` before every step.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import SmoothcertError, check_count, check_positive_finite
from ..noise.base import NOISES, with_soft_radius
from ..registry import Configurable, Registry, option, option_defaults
from ..smoothing import sigma_optimization

SIGMA_MODES: Registry = Registry("sigma mode")
"""``TrainConfig.sigma_mode`` -> :class:`SigmaMode` subclass (built by :func:`build_sigma_mode`)."""


def build_sigma_mode(name: str, **params: Any) -> SigmaMode:
    """The registered σ mode ``name`` with the given parameters (the rest at their defaults).

    Raises :class:`SmoothcertError` for an unknown name, an unknown parameter or an invalid
    value, naming the valid choices.
    """
    return SIGMA_MODES[name](**params)


class SigmaMode(Configurable, abc.ABC):
    """How the σ of each training example is chosen.

    Subclasses declare their parameters as a nested frozen dataclass ``Options`` (typed fields
    with defaults and one-line docs, checked in its ``__post_init__`` raising
    :class:`SmoothcertError`), read them as attributes of the same name, and implement
    :meth:`start` and :meth:`noise_for`.
    """

    plugin_kind = "sigma mode"
    option_word = "parameter"

    per_sample: bool = False
    """True if examples are trained at their own σ (a (B,) tensor): the config then refuses a
    method whose ``supports_per_sample_sigma`` is False."""

    @classmethod
    def param_names(cls) -> list[str]:
        """The parameters' names, in declaration order."""
        return list(option_defaults(cls.Options))

    def params(self) -> dict[str, Any]:
        """Parameters as plain Python values (stored in configs and checkpoints)."""
        return self.option_values()

    def check_epochs(self, epochs: int) -> None:
        """Raise :class:`SmoothcertError` if a run of ``epochs`` epochs cannot use this mode."""
        return None

    def check_noise(self, noise: str) -> None:
        """Raise :class:`SmoothcertError` if this mode cannot train with the registered noise
        ``noise`` (by default it can train with any)."""
        return None

    @abc.abstractmethod
    def start(self, noise: str, sigma: float, num_examples: int, device: torch.device) -> None:
        """Prepare for a run whose noise is ``NOISES[noise](sigma)`` and whose training set has
        ``num_examples`` examples; per-example state lives on ``device``."""

    @abc.abstractmethod
    def noise_for(self, model, x, idx, generator, epoch: int):
        """The noise to train the batch ``x`` (training-set indices ``idx``) with in ``epoch``;
        any draw comes from ``generator``."""

    def log_columns(self) -> dict[str, float]:
        """Scalars for the epoch's log row (none by default)."""
        return {}

    def state(self) -> torch.Tensor | None:
        """What a checkpoint must keep to resume (None: nothing)."""
        return None

    def load_state(self, state) -> None:
        """Restore what :meth:`state` returned."""
        return None


@SIGMA_MODES.register("fixed")
class FixedSigma(SigmaMode):
    """Every example is trained at the run's σ."""

    def start(self, noise: str, sigma: float | None, num_examples: int,
              device: torch.device) -> None:
        """σ None: a method that trains without noise, whose loss gets ``noise=None``."""
        self.noise = None if sigma is None else NOISES[noise](sigma)

    def noise_for(self, model, x, idx, generator, epoch: int):
        return self.noise


@SIGMA_MODES.register("data_dependent")
class PerExampleSigma(SigmaMode):
    """Every example keeps its own σ, moved by OptimizeSigma before its steps (Alfarra et al.
    2022, Algorithm 2).

    ``sigmas`` (N,) holds one σ per training example (float32, on the training device),
    initialised to the run's σ. From epoch ``start_epoch`` on, each batch first runs
    OptimizeSigma on its examples, starting from their stored σ (``num_steps`` ascent steps of
    size ``step_size`` on the soft certified radius of the run's noise, ``num_samples`` draws per
    step, from the run's training generator), stores the result back, and is trained with the
    run's noise at ``sigmas[idx]``: example i at its own σ_i. So every example's σ moves
    ``num_steps`` steps per epoch and each epoch starts from the σ of the previous one ("we
    initialize σ at each epoch with σ computed at the previous epoch", §3.6).

    The parameters default to the authors' training scripts
    (MotasemAlfarra/Data_Dependent_Randomized_Smoothing, ``ImageNet/train_rs.py``,
    ``ImageNet/train_macer.py``), which the paper's training runs follow:

    - ``num_steps`` = 1: K, gradient-ascent steps on σ per visit of an example, i.e. per epoch
      (``--iter_sig_tr`` default 1; the CIFAR-10 ``train_macer.py`` default is 10);
    - ``step_size`` = 1e-4: α_σ, the step on σ per unit gradient of the soft radius, in pixel
      units (``--lr_sig`` default in every script; the paper's α = 0.0001);
    - ``num_samples`` = 1: n, noise draws per step (``--gaussian_num_ds`` default 1; paper,
      App. H.3: n = 1 "for ease of computation" in training, n = 8 as an ablation);
    - ``start_epoch`` = 0: epochs trained at the fixed σ before σ_x is optimised
      (``--epoch-switch`` default 0; the paper's CIFAR-10 Cohen runs use 50 of 200 epochs).

    Configs written before ``sigma_mode_params`` existed call them ``dd_steps``,
    ``dd_step_size``, ``dd_num_samples`` and ``dd_start_epoch``
    (:data:`smoothcert.upgrade.OLD_SIGMA_PARAMS`).

    As in the authors' scripts (``train`` in ``ImageNet/train_rs.py``, ``CIFAR10/train_macer.py``)
    σ is optimised per batch right before that batch's step, on the same (augmented) inputs the
    step trains on, not in a separate pass before or after the epoch. One deviation:
    :func:`~smoothcert.smoothing.sigma_optimization.optimize_sigma` runs the model in eval mode
    (BatchNorm
    with its running statistics, which the extra forward passes leave untouched), where the
    authors' training scripts leave it in train mode. Indices repeated within one batch get one
    of their optimised values. The test-accuracy column keeps using the run's σ (the authors'
    default ``--iter_sig_ts 0`` leaves the test σ at its initial value during training).
    """

    per_sample = True

    @dataclass(frozen=True)
    class Options:
        num_steps: int = option(1, "K: ascent steps on σ per visit of an example")
        step_size: float = option(1e-4, "α_σ: step on σ per unit gradient, pixel units")
        num_samples: int = option(1, "n: noise draws per ascent step")
        start_epoch: int = option(0, "epochs trained at the fixed σ before σ_x is optimised")

        def __post_init__(self):
            check_count("num_steps", self.num_steps)
            check_positive_finite("step_size", self.step_size)
            check_count("num_samples", self.num_samples)
            check_count("start_epoch", self.start_epoch, minimum=0)

    def check_noise(self, noise: str) -> None:
        """OptimizeSigma ascends the noise's soft radius: a noise without one is refused (it
        is never optimized with another noise's formula)."""
        with_soft_radius(noise, "sigma mode data_dependent")

    def check_epochs(self, epochs: int) -> None:
        if self.start_epoch >= epochs:
            raise SmoothcertError(
                f"start_epoch ({self.start_epoch}) of sigma mode data_dependent must be below "
                f"epochs ({epochs}), or no epoch trains with data-dependent σ"
            )

    def start(self, noise: str, sigma: float, num_examples: int, device: torch.device) -> None:
        self.check_noise(noise)  # the config checked it; a Trainer built by hand is checked here
        self.noise_name, self.noise_type = noise, NOISES[noise]
        self.fixed = self.noise_type(sigma)
        self.sigmas = torch.full((num_examples,), sigma, device=device)

    def noise_for(self, model, x, idx, generator, epoch: int):
        if epoch < self.start_epoch:
            return self.fixed
        sigma = sigma_optimization.optimize_sigma(  # looked up per call: tests stand it in
            model, x, self.sigmas[idx], num_steps=self.num_steps, step_size=self.step_size,
            num_samples=self.num_samples, generator=generator, noise=self.noise_name,
        ).to(self.sigmas)
        self.sigmas[idx] = sigma
        return self.noise_type(sigma)

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
