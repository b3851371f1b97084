"""Training methods: one loss per paper, registered by name.

A method turns a batch into a dict of losses; the one trainer loop
(:mod:`smoothcert.training.trainer`) minimises ``"loss"``, measures accuracy from ``"logits"``
(where the method returns them) and logs every other scalar entry without knowing which method
produced it. A method's hyperparameters are one frozen dataclass, its nested ``Options`` (fields
declared with :func:`smoothcert.registry.option`); :func:`build_method`, like any constructor
call, checks them through :func:`smoothcert.registry.parse_options`.

Besides its loss a method declares what it trains (``trains``: the model role the run's
``--arch`` must have), whether it trains with noise (``uses_noise``), whether it needs a frozen
classifier (``frozen_classifier``), and the optimizer settings its authors use
(:meth:`TrainingMethod.training_defaults`); it may hook the start of the run (:meth:`prepare`),
choose the log's test columns (:meth:`evaluate`) and write an extra export after each checkpoint
(:meth:`export`).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..registry import Configurable, Registry, option_defaults
from ..tensors import copies, eval_mode

METHODS: Registry = Registry("method")

TRAINING_DEFAULTS: Mapping[str, Any] = {"optimizer": "sgd", "lr": 0.1, "weight_decay": 1e-4,
                                        "lr_schedule": "step"}
"""The optimizer settings of a run that leaves them unset, unless its method's authors use others
(:attr:`TrainingMethod.defaults`): Cohen et al. 2019 (SGD at lr 0.1, weight decay 1e-4, lr × 0.1
every 30 epochs), which every noise-training method here follows."""


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

    trains: ClassVar[str] = "classifier"
    """The role of the model the method trains (:func:`smoothcert.models.archs.model_role`):
    "classifier" (pixels -> logits), "denoiser" (pixels -> pixels) or "diffusion" (a
    ``DiffusionModel``); the training configuration refuses an ``--arch`` of another role."""

    uses_noise: ClassVar[bool] = True
    """False if the loss draws no smoothing noise: the run then takes no σ (``sigma`` None),
    :meth:`loss` gets ``noise=None`` and the checkpoint's ``noise`` is None."""

    input_encoding: ClassVar[str | None] = None
    """The input encoding the trained classifier needs as its first layer (a name in
    ``smoothcert.models.encodings.ENCODINGS``: "ablation" for a loss that feeds NaN-ablated
    inputs), or None: the trainer builds the model with it and the checkpoint records it, so
    the user's ``--arch`` is any classifier."""

    frozen_classifier: ClassVar[str] = "none"
    """Whether the run's ``classifier`` (a frozen classifier checkpoint) is "required",
    "optional" or refused ("none")."""

    defaults: ClassVar[Mapping[str, Any]] = {}
    """The optimizer settings of the method's authors where they differ from
    :data:`TRAINING_DEFAULTS`; see :meth:`training_defaults`."""

    max_grad_norm: ClassVar[float | None] = None
    """If set, the trainer clips the gradients' global L2 norm to it before each step."""

    test_columns: ClassVar[tuple[str, ...]] = ("test_acc",)
    """The keys :meth:`evaluate` returns (the log's test columns)."""

    supports_per_sample_sigma: bool = False
    """True if :meth:`loss` trains each example at its own σ when ``noise.sigma`` is a (B,)
    tensor (data-dependent training, Alfarra et al. Alg. 2): the trainer refuses
    ``sigma_mode="data_dependent"`` for a method that leaves this False."""

    tasks: ClassVar[tuple[str, ...]] = ("classification",)
    """The tasks (:data:`smoothcert.data.registry.TASKS`) the loss is written for; the training
    configuration refuses a dataset of another. A method that lists several computes its loss
    with :meth:`criterion`, which the trainer sets to the dataset's task (:meth:`set_task`)."""

    task: str = "classification"
    ignore_index: int | None = None

    needs_indices: ClassVar[bool] = False
    """True if :meth:`loss` takes the batch's training-set indices as ``idx=`` (B,) int64 (e.g. to
    look up a per-example table built at the start of the run); the trainer passes them only to
    such a method, so the other methods' ``loss`` keeps the five-argument signature."""

    @classmethod
    def training_defaults(cls) -> dict[str, Any]:
        """What a training config left unset (None) becomes for this method: ``optimizer``,
        ``lr``, ``weight_decay`` and ``lr_schedule``."""
        return {**TRAINING_DEFAULTS, **cls.defaults}

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
        Returns at least ``"loss"`` (scalar to minimise) and, for a method that has them,
        ``"logits"`` (B, num_classes) from which the trainer counts training accuracy (NaN in
        the log without them); every other entry must be a scalar tensor and is logged (as its
        epoch mean) under its key. Return the same keys on every call. ``noise`` is None for a
        method whose :attr:`uses_noise` is False; ``x`` and ``y`` come from the training split
        whatever the model's role (a denoiser's target is ``x`` itself). A method that sets
        :attr:`needs_indices` also gets ``idx=``, the batch's indices into the training split.

        In data-parallel training ``model`` is wrapped in ``DistributedDataParallel`` and the
        batch is this rank's part of the global batch. What keeps every method correct there:
        ``"loss"`` is a mean over the batch's examples (the trainer weighs the ranks' losses so
        that DDP's average of their gradients is the gradient of the global mean), and the
        parameters get their gradients only from the trainer's one ``loss.backward()``: the model
        may be called several times, and differentiated with respect to its *inputs*
        (``torch.autograd.grad``, as the attacks do), but never backpropagated into its
        parameters inside the method.
        """

    def set_task(self, task: str, ignore_index: int | None = None) -> None:
        """The task of the run's dataset (and a segmentation set's unlabelled pixel value)."""
        self.task, self.ignore_index = task, ignore_index

    def criterion(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The task's loss, a mean over the batch (:func:`task_loss`)."""
        return task_loss(self.task, outputs, y, self.ignore_index)

    def judge(self, outputs: torch.Tensor, y: torch.Tensor):
        """(correct, judged) predictions of a batch (:func:`task_correct`)."""
        return task_correct(self.task, outputs, y, self.ignore_index)

    def named_variant(self) -> str | None:
        """A short label of a named variant of the method that departs from its paper (e.g.
        ``"target=self"``), recorded beside the method's name in checkpoints (``meta["method"]
        ["variant"]``) so that records and reports say so; None (the default) for the paper's
        method."""
        return None

    def prepare(self, config, device: torch.device) -> None:
        """Called once by the trainer before the first epoch of a run (fresh or resumed), with
        the run's ``TrainConfig`` and device: load what the loss needs besides the model (e.g. a
        frozen classifier). Raise :class:`SmoothcertError` for unusable inputs; nothing is
        written before this returns."""
        return None

    def evaluate(self, model: nn.Module, data, noise, generator: torch.Generator,
                 batch_size: int) -> dict[str, float]:
        """The log's test columns (:attr:`test_columns`) after an epoch, on the test split
        ``data``; ``generator`` (on the training device, where the batches go) is re-seeded
        identically every epoch, so the columns are comparable across epochs.

        By default ``test_acc``: the accuracy of ``model`` (in eval mode) on the test images,
        each perturbed by one draw of ``noise`` (clean images when ``noise`` is None: a method
        without noise). This is not a certified accuracy.
        """
        correct = torch.zeros((), dtype=torch.long, device=generator.device)
        judged = torch.zeros_like(correct)
        with eval_mode(model), torch.inference_mode():
            for x, y in eval_batches(data, batch_size, generator.device):
                x = x if noise is None else noise.perturb(x, generator)
                right, seen = self.judge(model(x), y)
                correct, judged = correct + right, judged + seen
        return {"test_acc": correct.item() / judged.item() if judged.item() else math.nan}

    def export(self, model: nn.Module, out_dir: Path) -> None:
        """Called by the trainer (rank 0) after each checkpoint is written into the run folder
        ``out_dir``, with the bare model: write another form of it there (e.g. a diffusers
        folder); nothing by default."""
        return None

    def export_is_current(self, out_dir: Path) -> bool:
        """Whether the export in ``out_dir`` comes from the checkpoint beside it; a resumed run
        calls :meth:`export` again when not (an export that failed after its checkpoint was
        written, e.g. on a full disk). True by default: no export."""
        return True

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


def task_loss(task: str, outputs: torch.Tensor, y: torch.Tensor,
              ignore_index: int | None = None) -> torch.Tensor:
    """The training loss of a task: cross-entropy of the logits (B, K) for classification, the
    per-pixel cross-entropy of (B, K, H, W) logits averaged over the labelled pixels (those not
    ``ignore_index``) for segmentation (Fischer et al. 2021 train their base models so), and the
    smooth-L1 loss of the (B, D) outputs (Huber with δ = 1, the usual loss of box regression)
    for regression."""
    if task == "regression":
        return F.smooth_l1_loss(outputs, y.to(outputs.dtype))
    ignore = -100 if ignore_index is None else ignore_index  # torch's default: none such
    return F.cross_entropy(outputs, y, ignore_index=ignore)


def pixel_rows(logits: torch.Tensor) -> torch.Tensor:
    """Per-pixel logits (B, K, H, W) as rows (B·H·W, K), image by image (B-major); class
    logits (B, K) as they are: a loss written for rows of class logits then treats every pixel
    as an input of its own."""
    return logits if logits.dim() == 2 else logits.movedim(1, -1).reshape(-1, logits.shape[1])


def task_correct(task: str, outputs: torch.Tensor, y: torch.Tensor,
                 ignore_index: int | None = None):
    """(correct, judged) for an accuracy: images whose top class is their label; labelled
    pixels whose top class is theirs; and for regression none (0, 0: no accuracy)."""
    if task == "regression":
        zero = torch.zeros((), dtype=torch.long, device=outputs.device)
        return zero, zero
    right = outputs.detach().argmax(dim=1) == y
    if task == "segmentation" and ignore_index is not None:
        labelled = y != ignore_index
        return (right & labelled).sum(), labelled.sum()
    return right.sum(), torch.as_tensor(right.numel(), device=outputs.device)


def noise_for_copies(noise, m: int):
    """The noise for ``x.repeat(m, 1, 1, 1)``: the same kind of noise with a per-sample σ (B,)
    repeated copy-major to (m·B,), so row j·B + i of the copies gets σ_i; a scalar σ (or a tensor
    with one entry, which broadcasts) is returned unchanged.
    """
    sigma = noise.sigma
    if not isinstance(sigma, torch.Tensor) or sigma.numel() == 1 or m == 1:
        return noise
    return type(noise)(copies(sigma, m))


def eval_batches(data, batch_size: int,
                 device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``data``'s examples in order, as (x, y) batches of at most ``batch_size`` on ``device``
    (an image folder decodes on the host; :meth:`batch` moves its batches to the indices')."""
    for idx in torch.arange(len(data), device=device).split(batch_size):
        yield data.batch(idx)


def nan_columns(method: TrainingMethod) -> dict[str, float]:
    """The method's test columns, unmeasured (NaN): a data-parallel rank other than 0."""
    return dict.fromkeys(method.test_columns, math.nan)


class PerturbWith:
    """A stand-in for a noise in :meth:`TrainingMethod.evaluate`: its test batches are
    perturbed by ``fn(x, generator)`` (an ablation, a semantic transformation)."""

    def __init__(self, fn: Callable[[torch.Tensor, torch.Generator], torch.Tensor]):
        self.perturb = fn


def dataset_shape(config) -> tuple[int, int, int]:
    """The (C, H, W) of the run's images: the dataset's, or C×S×S for an image folder read at
    ``image_size`` S."""
    from ..data.registry import DATASETS

    spec = DATASETS[config.dataset]
    c, h, w = spec.input_shape
    size = config.image_size
    return (c, size, size) if spec.streamed and size else (c, h, w)
