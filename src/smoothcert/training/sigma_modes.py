"""σ modes of training: how the σ of each training example is chosen (``TrainConfig.sigma_mode``).

* ``fixed``: every example at the run's σ;
* ``data_dependent``: Alfarra et al., "Data Dependent Randomized Smoothing", Algorithm 2 — every
  example keeps its own σ across epochs, moved by OptimizeSigma
  (:func:`smoothcert.sigma_optimization.optimize_sigma`) before each step.
"""

from __future__ import annotations

import torch

from .. import sigma_optimization
from ..errors import SmoothcertError
from ..noise import Gaussian
from ..registry import Registry

SIGMA_MODES: Registry = Registry("sigma mode")
"""``TrainConfig.sigma_mode`` -> class built as ``cls(config, num_examples, device)``."""


@SIGMA_MODES.register("fixed")
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


@SIGMA_MODES.register("data_dependent")
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
    :func:`~smoothcert.sigma_optimization.optimize_sigma` runs the model in eval mode (BatchNorm
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
        sigma = sigma_optimization.optimize_sigma(  # looked up per call: tests stand it in
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
