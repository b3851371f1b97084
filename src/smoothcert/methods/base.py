"""Training methods: one loss per paper, registered by name.

A method turns a batch into a dict of losses; the one trainer loop (``train.py``) minimises
``"loss"``, measures accuracy from ``"logits"`` and logs every other scalar entry without knowing
which method produced it. A method's hyperparameters are one frozen dataclass, its nested
``Options`` (fields declared with :func:`smoothcert.registry.option`); :func:`build_method`,
like any constructor call, checks them through :func:`smoothcert.registry.parse_options`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..registry import Configurable, Registry, option_defaults
from ..tensors import copies

METHODS: Registry = Registry("method")


def register_method(name: str) -> Callable[[type[TrainingMethod]], type[TrainingMethod]]:
    """Class decorator: make a :class:`TrainingMethod` buildable as ``build_method(name)``."""

    def register(cls: type[TrainingMethod]) -> type[TrainingMethod]:
        cls.name = name
        return METHODS.register(name)(cls)

    return register


def build_method(name: str, **hparams: Any) -> TrainingMethod:
    """The registered method ``name`` with the given hyperparameters (the rest at their defaults;
    typed values or ``KEY=VALUE`` text).

    Raises :class:`SmoothcertError` for an unknown name, an unknown hyperparameter or an invalid
    value, naming the valid choices.
    """
    return METHODS[name](**hparams)


@dataclass(frozen=True)
class EpochContext:
    """What :meth:`TrainingMethod.on_epoch_start` may look at: the run as it stands.

    ``generator`` is the run's training generator on ``device`` (the one :meth:`TrainingMethod.loss`
    draws from); a method that samples at the start of an epoch (e.g. estimating p̂A of every
    training example) draws from it, so its draws are part of the run's reproducible stream and
    survive resuming. In data-parallel training (K > 1 processes) it is instead a generator seeded
    from (run seed, epoch), the same on every rank, so that every rank's hook draws the same
    numbers and the method's state (which rank 0 saves) agrees across the ranks; ``model`` is
    then the bare model, not its ``DistributedDataParallel`` wrapper. ``config`` is the run's
    ``TrainConfig`` (None outside the trainer). The last three fields default to None so that
    tests may build a context from the first four alone.
    """

    num_epochs: int
    model: nn.Module
    train_data: Any  # smoothcert.data.ImageDataset, already on the training device
    noise: Any  # the noise strategy (smoothcert.Gaussian)
    generator: torch.Generator | None = None
    device: torch.device | None = None
    config: Any = None  # smoothcert.training.TrainConfig


class TrainingMethod(Configurable, abc.ABC):
    """A training objective for the base classifier of a smoothed classifier.

    Subclasses declare their hyperparameters as a nested frozen dataclass ``Options`` (typed
    fields with defaults and one-line docs, ranges checked in its ``__post_init__`` raising
    :class:`SmoothcertError`), read them as attributes of the same name (``self.lbd``), put
    state derived from them in :meth:`setup`, and implement :meth:`loss`. Built as
    ``Method(**hparams)`` or ``Method(Method.Options(...))``.
    """

    plugin_kind = "method"
    option_word = "hyperparameter"

    noises: tuple | None = None
    """The noise names (``smoothcert.noise.NOISES``) the loss is written for; None: any noise.
    The training configuration refuses the others."""

    supports_per_sample_sigma: bool = False
    """True if :meth:`loss` trains each example at its own σ when ``noise.sigma`` is a (B,)
    tensor (data-dependent training, Alfarra et al. Alg. 2): the trainer refuses
    ``sigma_mode="data_dependent"`` for a method that leaves this False."""

    @classmethod
    def hparam_names(cls) -> list[str]:
        """The hyperparameters' names, in declaration order."""
        return list(option_defaults(cls.Options))

    def hparams(self) -> dict[str, Any]:
        """Hyperparameters as plain Python values (stored in checkpoints and configs)."""
        return self.option_values()

    @abc.abstractmethod
    def loss(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        noise,
        generator: torch.Generator,
    ) -> dict[str, torch.Tensor]:
        """Losses for a clean batch ``x`` (B, C, H, W) in [0, 1] with labels ``y`` (B,) int64.

        ``model`` is in train mode; every random draw comes from ``generator`` (on x's device).
        Returns at least ``"loss"`` (scalar to minimise) and ``"logits"`` (B, num_classes) from
        which the trainer counts training accuracy; every other entry must be a scalar tensor
        and is logged (as its epoch mean) under its key. Return the same keys on every call.

        In data-parallel training ``model`` is wrapped in ``DistributedDataParallel`` and the
        batch is this rank's part of the global batch. What keeps every method correct there:
        ``"loss"`` is a mean over the batch's examples (the trainer weighs the ranks' losses so
        that DDP's average of their gradients is the gradient of the global mean), and the
        parameters get their gradients only from the trainer's one ``loss.backward()``: the model
        may be called several times, and differentiated with respect to its *inputs*
        (``torch.autograd.grad``, as the attacks do), but never backpropagated into its
        parameters inside the method.
        """

    def on_epoch_start(self, epoch: int, context: EpochContext) -> None:
        """Called before epoch ``epoch`` (0-based: the number of epochs already completed).

        Also called first thing after a resume, for the epoch the run continues with: anything
        it derives from ``epoch`` alone must be recomputed here, anything else must come from
        :meth:`state_dict`.
        """
        return None  # most methods need no schedule

    def epoch_indices(
        self, epoch: int, num_examples: int, generator: torch.Generator
    ) -> torch.Tensor | None:
        """The training-set indices that epoch ``epoch`` visits, in order, or None.

        None (the default) means the trainer's own shuffle: a random permutation of all
        ``num_examples`` examples. A method that reweighs or drops examples returns a 1-D int64
        tensor of indices in ``[0, num_examples)`` (repeats allowed); the trainer batches it as
        it is. Random choices must come from ``generator`` (the trainer's CPU shuffle generator,
        saved with checkpoints). Called after :meth:`on_epoch_start` of the same epoch.
        """
        return None

    def state_dict(self) -> dict[str, Any]:
        """Method state that changes during training (saved with checkpoints); none by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned when resuming."""
        return None


def noise_for_copies(noise, m: int):
    """The noise for ``x.repeat(m, 1, 1, 1)``: the same kind of noise with a per-sample σ (B,)
    repeated copy-major to (m·B,), so row j·B + i of the copies gets σ_i; a scalar σ (or a tensor
    with one entry, which broadcasts) is returned unchanged.
    """
    sigma = noise.sigma
    if not isinstance(sigma, torch.Tensor) or sigma.numel() == 1 or m == 1:
        return noise
    return type(noise)(copies(sigma, m))
