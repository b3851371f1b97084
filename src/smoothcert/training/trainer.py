"""The trainer of one run: :class:`Trainer` and the helpers of its epochs and steps.

A :class:`Trainer` holds the model, optimiser, schedule, method, noise, σ mode and the seeded
generators of one run on one device (one rank of a data-parallel run); it trains one epoch at a
time and says what a checkpoint must store to resume it exactly. The run folder around it
(config, log, checkpoints, resuming) is :func:`smoothcert.training.loop.train`.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import statistics
import sys
import time
from typing import Any

import torch

try:
    import resource  # peak RSS on POSIX
except ImportError:  # Windows
    resource = None

from ..data.datasets import ImageDataset
from ..data.transforms import augment
from ..errors import SmoothcertError, check_count
from ..methods import METHODS, EpochContext, build_method
from ..methods.base import nan_columns
from ..models import build_model
from ..models.archs import model_role
from ..models.checkpoint import checkpoint_meta, checkpoint_role, load_checkpoint, load_weights
from ..noise.base import NOISES
from ..rng import derived_seed
from ..runs.inputs import default_workers
from ..runs.progress import progress_meter
from .config import TrainConfig
from .distributed import World, merge_rows
from .labels import evaluation_split, labelled_split, labels_meta, sized_split
from .optim import OPTIMIZERS, SCHEDULES
from .sigma_modes import build_sigma_mode

log = logging.getLogger(__name__)

# Stream tags for derived_seed(config.seed, tag): far from dataset example indices.
_INIT, _SHUFFLE, _NOISE, _EVAL, _HOOK = (0x7EA1_0000 + k for k in range(5))


class Trainer:
    """Model, optimiser, schedule, method, noise and generators of one run, on one device.

    :meth:`train_epoch` runs one epoch and returns its log row; :meth:`meta` and
    :meth:`train_state` are what a checkpoint stores, :meth:`load` restores them. With
    ``config.init_checkpoint`` the model starts from that checkpoint's weights (unless
    ``load_init`` is false: a resumed run gets its weights from its own checkpoint).

    ``world`` (default: one process) is this process's place in data-parallel training
    (:mod:`smoothcert.training.distributed`); with K > 1 processes ``config.batch_size`` is the
    global
    batch, of which this rank trains its 1/K part, and ``train_model`` is ``model`` wrapped in
    ``DistributedDataParallel``. See :func:`train` for what differs from one process.
    """

    def __init__(self, config: TrainConfig, device="cpu", load_init: bool = True,
                 world: World | None = None, workers: int | None = None):
        self.config, self.device = config, torch.device(device)
        self.world = world if world is not None else World(device=self.device)
        self.world.check_batch(config.batch_size)
        self.train_data = _training_split(config).to(self.device)
        test = evaluation_split(config)  # None: a selection model without test records
        self.test_data = None if test is None else test.to(self.device)
        _check_same_classes(self.train_data, self.test_data)
        self.workers = default_workers(self.train_data) if workers is None else \
            check_count("workers", workers, minimum=0)
        self.model = _initial_model(config, self.train_data.spec).to(self.device)
        if load_init and config.init_checkpoint is not None:
            _load_initial_weights(self.model, config)
        self.train_model = self.world.wrap(self.model)  # what the method's loss runs
        self.method = build_method(config.method, **config.method_params)
        spec = self.train_data.spec
        self.method.set_task(spec.task, spec.ignore_index)  # its loss and accuracy
        self.method.prepare(config, self.device)  # e.g. a frozen classifier, checked here
        # the run's σ (test columns, epoch hooks); None for a method that trains without noise
        self.noise = None if config.sigma is None else NOISES[config.noise](config.sigma)
        self.per_example_sigma = build_sigma_mode(config.sigma_mode, **config.sigma_mode_params)
        self.per_example_sigma.start(config.noise, config.sigma, len(self.train_data), self.device)
        self.optimizer = OPTIMIZERS[config.optimizer](self.model.parameters(), config)
        self.scheduler = SCHEDULES[config.lr_schedule](self.optimizer, config)
        self.shuffle_gen = torch.Generator().manual_seed(derived_seed(config.seed, _SHUFFLE))
        self.noise_gen = _generator(self.device, self._noise_seed())
        self.epoch = 0  # completed epochs

    def _noise_seed(self, *more: int) -> int:
        """The seed of this process's augmentation and noise stream: (seed, tag) alone, or
        (seed, tag, rank) for each of K > 1 processes, so the ranks draw different noise."""
        rank = (self.world.rank,) if self.world.distributed else ()
        return derived_seed(self.config.seed, _NOISE, *rank, *more)

    def train_epoch(self, progress=False) -> dict[str, float]:
        """One pass over the epoch's examples (see :meth:`_batches`); returns its log row.

        ``progress`` (``runs.progress.MODES``): False, True or ``"bar"`` (a bar on stderr),
        ``"lines"`` (a plain line on stderr every 30 s within the epoch, with the running loss
        and accuracy: a log file shows a long epoch is alive).

        The epoch's ``seconds`` and ``peak_mem_mb`` include the method's epoch hook (e.g. an
        estimate of p̂A over the training set), not the test-accuracy evaluation. With K > 1
        processes the losses and the training accuracy are means over all ranks' examples (as
        one process would log them for the same global batches), ``seconds`` and
        ``peak_mem_mb`` are this rank's, and only rank 0 measures ``test_acc`` (NaN elsewhere).
        """
        _reset_peak_memory(self.device)
        lr, start, meter = self.optimizer.param_groups[0]["lr"], time.perf_counter(), \
            _Meter(self.method.judge)
        self.method.on_epoch_start(self.epoch, self._context())
        batches = self._batches()
        bar = progress_meter(progress, len(batches), 0,
                             f"epoch {self.epoch + 1}/{self.config.epochs}", "batch", ends=False)
        with bar:
            for i, (batch, xy) in enumerate(zip(batches, self._decoded(batches))):
                meter.update(*self._step(batch, xy))
                if progress and (i % 10 == 9 or i == len(batches) - 1):  # syncs: not per batch
                    bar.set_postfix(loss=f"{meter.mean('loss'):.3f}", acc=f"{meter.accuracy():.3f}")
                bar.update()
        _synchronize(self.device)  # count the queued kernels in the epoch's time
        meter = meter.reduced(self.world)
        self._merge_per_example_sigma(batches)
        cost = {"seconds": time.perf_counter() - start, "peak_mem_mb": _peak_memory_mb(self.device)}
        self.scheduler.step()
        self.epoch += 1
        return self._row(lr, meter, cost)

    def time_steps(self, num_steps: int, warmup: int = 2) -> dict[str, float]:
        """Cost of this run's method per optimizer step, for benchmarks: the median seconds of
        ``num_steps`` individually timed steps after ``warmup`` untimed ones (the median resists
        other load on the machine), peak memory (as in the log) and steps per epoch. Runs the
        method's epoch hook first; the steps do change the model."""
        self.method.on_epoch_start(self.epoch, self._context())
        batches = self._batches()
        steps = [batches[i % len(batches)] for i in range(warmup + num_steps)]
        for idx in steps[:warmup]:
            self._step(idx)
        _reset_peak_memory(self.device)
        seconds = [self._timed_step(idx) for idx in steps[warmup:]]
        return {"seconds_per_step": statistics.median(seconds), "steps_per_epoch": len(batches),
                "peak_mem_mb": _peak_memory_mb(self.device)}

    def _timed_step(self, idx: torch.Tensor) -> float:
        _synchronize(self.device)
        start = time.perf_counter()
        self._step(idx)
        _synchronize(self.device)
        return time.perf_counter() - start

    def _step(self, batch: torch.Tensor, xy=None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One optimizer step on the global ``batch`` (indices); this rank trains on its part,
        whose pixels and labels ``xy`` are given when a loader decoded them ahead. Returns the
        method's output and the labels of the part."""
        idx = self.world.part(batch)
        x, y = self._epoch_data().batch(idx) if xy is None else (t.to(self.device) for t in xy)
        x = augment(self.train_data.spec.augmentation, x, self.noise_gen)
        noise = self.per_example_sigma.noise_for(self.model, x, idx, self.noise_gen, self.epoch)
        self.train_model.train()
        extra = {"idx": idx} if self.method.needs_indices else {}  # e.g. CAT-RS's ŷ table
        out = self.method.loss(self.train_model, x, y, noise, self.noise_gen, **extra)
        loss, scale = out["loss"], self.world.loss_scale(len(idx), len(batch))
        self.optimizer.zero_grad(set_to_none=True)
        (loss if scale == 1 else loss * scale).backward()  # DDP averages the ranks' gradients
        if self.method.max_grad_norm is not None:  # after DDP's average: the same on every rank
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.method.max_grad_norm)
        self.optimizer.step()
        return out, y

    def _decoded(self, batches: list[torch.Tensor]):
        """Per batch, this rank's (x, y) decoded ahead by ``workers`` DataLoader processes (an
        image folder), or None: the step reads them itself (data in memory, no workers)."""
        if self.workers == 0:
            return itertools.repeat(None)
        parts = [self.world.part(batch).tolist() for batch in batches]
        return torch.utils.data.DataLoader(self._epoch_data(), batch_sampler=parts,
                                           num_workers=self.workers)

    def _epoch_data(self):
        """The training examples as this epoch reads them: an image folder decodes each image
        with the training transform of (seed, epoch, idx); data in memory are augmented on
        the device after batching (:func:`smoothcert.data.transforms.augment`)."""
        if hasattr(self.train_data, "augmented"):
            return self.train_data.augmented(self.config.seed, self.epoch)
        return self.train_data

    def _batches(self) -> list[torch.Tensor]:
        """This epoch's global index batches: the method's order (:meth:`epoch_indices`) or a
        shuffle of the whole training set (with K > 1 processes rank 0's order, broadcast), cut
        into batches of ``config.batch_size``; a last batch with fewer than two examples per
        process joins the previous one (BatchNorm cannot normalise a single example)."""
        n, k = len(self.train_data), self.world.size
        order = self.method.epoch_indices(self.epoch, n, self.shuffle_gen)
        if order is None:
            order = torch.randperm(n, generator=self.shuffle_gen)
        else:
            _check_indices(order, n, self.method.name)
        order = self.world.broadcast_order(order)
        if len(order) < 2 * k:
            raise SmoothcertError(
                f"the epoch visits {len(order)} examples, fewer than two for each of {k} "
                "processes; use fewer processes"
            )
        batches = list(order.to(self.device).split(self.config.batch_size))
        if len(batches) > 1 and len(batches[-1]) < 2 * k:
            batches[-2:] = [torch.cat(batches[-2:])]
        return batches

    def _merge_per_example_sigma(self, batches: list[torch.Tensor]) -> None:
        """With K > 1 processes each rank optimised the σ of its own examples only; give every
        rank all of them (an example is visited once per epoch, so this is exact)."""
        sigmas = self.per_example_sigma.state()  # None for a fixed σ
        if not self.world.distributed or sigmas is None:
            return
        mine = torch.zeros(len(sigmas), dtype=torch.bool)
        for batch in batches:
            mine[self.world.part(batch).cpu()] = True
        self.per_example_sigma.load_state(merge_rows(self.world, sigmas, mine))

    def _row(self, lr: float, meter: _Meter, cost: dict[str, float]) -> dict[str, float]:
        means = meter.means()
        if not math.isfinite(means["loss"]):
            raise SmoothcertError(
                f"the training loss became {means['loss']} in epoch {self.epoch}; "
                "lower the learning rate (nothing was written for this epoch)"
            )
        head = {"epoch": self.epoch, "lr": lr, "loss": means.pop("loss")}
        sigmas = self.per_example_sigma.log_columns()  # none for a fixed σ
        test = self.test_columns() if self.world.is_main else nan_columns(self.method)
        return {**head, "train_acc": meter.accuracy(), **test, **cost, **sigmas, **means}

    def test_columns(self) -> dict[str, float]:
        """The method's test columns (:meth:`~smoothcert.methods.TrainingMethod.evaluate`; by
        default ``test_acc``, the accuracy under one noise draw per test image, clean for a
        method without noise). The draws are the same every epoch (a generator re-seeded from
        the run seed), so the columns are comparable across epochs."""
        if self.test_data is None:  # a selection model without test records: not measured
            return nan_columns(self.method)
        gen = _generator(self.device, derived_seed(self.config.seed, _EVAL))
        return self.method.evaluate(self.model, self.test_data, self.noise, gen,
                                    self.config.batch_size)

    def _context(self) -> EpochContext:
        """What the method's epoch hook sees. Its generator is the training stream with one
        process; with K > 1 it is one seeded from (seed, epoch), the same on every rank, so the
        hook's draws (and the method state they decide) agree across the ranks."""
        generator = self.noise_gen
        if self.world.distributed:
            generator = _generator(self.device, derived_seed(self.config.seed, _HOOK, self.epoch))
        return EpochContext(
            self.config.epochs,
            self.model,
            self.train_data,
            self.noise,
            generator=generator,
            device=self.device,
            config=self.config,
        )

    def meta(self) -> dict[str, Any]:
        """The checkpoint's self-description (plain Python values only); besides the standard
        keys it records ``num_hparams``, the method's number of hyperparameters (a cost of the
        method: each one is a knob to tune), and ``method["variant"]`` for a named variant
        that departs from the method's paper (``TrainingMethod.named_variant``)."""
        spec, c = self.train_data.spec, self.config
        method = {"name": c.method, "hparams": self.method.hparams()}
        variant = self.method.named_variant()  # e.g. catrs target=self: not the paper's
        if variant is not None:
            method["variant"] = variant
        meta = checkpoint_meta(
            arch=c.arch, dataset=c.dataset, num_classes=spec.num_classes,
            input_shape=spec.input_shape, mean=spec.mean, std=spec.std,
            noise=None if c.sigma is None else {"name": c.noise, "sigma": c.sigma},
            method=method, epoch=self.epoch,
            config=c.to_dict(),
            arch_kwargs=c.arch_kwargs,
            classes=getattr(self.train_data, "classes", None),
            role=self.method.trains,
            input_encoding=self.method.input_encoding,  # e.g. ablation's (x, 1 − x) layer
            task=spec.task if self.method.trains == "classifier" else "classification",
        )
        return {**meta, "num_hparams": len(self.method.hparams()),
                **labels_meta(c, self.train_data)}  # a selection model's label provenance

    def train_state(self) -> dict[str, Any]:
        """Everything besides the weights that an exact resume needs. With K > 1 processes
        every rank must call it (it gathers the ranks' noise generators): the state is rank 0's,
        plus ``rank_noise_generators``, the noise generator of each rank."""
        state = {
            "epoch": self.epoch,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": _plain_scheduler_state(self.scheduler.state_dict()),
            "shuffle_generator": self.shuffle_gen.get_state(),
            "noise_generator": self.noise_gen.get_state(),
            "method": self.method.state_dict(),
            "per_example_sigma": self.per_example_sigma.state(),  # (N,) float32; None: fixed σ
        }
        if self.world.distributed:
            state["rank_noise_generators"] = self.world.gather(self.noise_gen.get_state())
        return state

    def load(self, checkpoint) -> None:
        """Restore weights and training state from a loaded checkpoint of the same config."""
        state = checkpoint.train_state
        if not state:
            raise SmoothcertError("the checkpoint has no training state to resume from")
        self.model.load_state_dict(checkpoint.state_dict)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(_scheduler_state(state["scheduler"]))
        self.shuffle_gen.set_state(state["shuffle_generator"])
        self.method.load_state_dict(state["method"])
        self.per_example_sigma.load_state(state.get("per_example_sigma"))
        self.epoch = int(state["epoch"])
        self._load_noise_generator(state)

    def _load_noise_generator(self, state: dict[str, Any]) -> None:
        """This rank's noise stream where the checkpoint has it (saved by as many processes as
        now); else, with K > 1 processes, a new stream per rank from (seed, rank, epoch)."""
        saved = state.get("rank_noise_generators") or [state["noise_generator"]]
        if len(saved) == self.world.size:
            self.noise_gen.set_state(saved[self.world.rank])
            return
        if self.world.size == 1:
            self.noise_gen.set_state(state["noise_generator"])  # rank 0's stream
        else:
            self.noise_gen.manual_seed(self._noise_seed(self.epoch))
        if self.world.is_main:
            log.warning(
                "resuming a run saved by %d process(es) with %d: weights, optimizer, schedule, "
                "epoch order and method state continue exactly, the noise streams are new",
                len(saved), self.world.size,
            )


def _training_split(config: TrainConfig) -> ImageDataset:
    """The examples the run trains on: the whole training split, or its fixed class-balanced
    subset of ``config.train_size`` examples; a selection model's labelled examples."""
    if config.label_records is not None:
        return labelled_split(config, "train")
    return sized_split(config, "train", config.train_size)


def _check_same_classes(train, test) -> None:
    """An image folder's train/ and val/ must name the same classes in the same order."""
    a, b = getattr(train, "classes", None), getattr(test, "classes", None)
    if a is not None and test is not None and list(a) != list(b):
        only = sorted(set(a) ^ set(b))[:5]
        raise SmoothcertError(f"the train and evaluation folders have different classes "
                              f"({len(a)} vs {len(b)}; only in one: {', '.join(only) or 'none'}); "
                              "give both the same class folders")


def _initial_model(config: TrainConfig, spec) -> torch.nn.Module:
    """The architecture initialised from the run seed, without touching the global RNG state,
    behind the input encoding the method asks for (``TrainingMethod.input_encoding``)."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(derived_seed(config.seed, _INIT))
        return build_model(config.arch, spec.num_classes, spec.input_shape, spec.mean, spec.std,
                           config.arch_kwargs, METHODS[config.method].input_encoding)


def _load_initial_weights(model: torch.nn.Module, config: TrainConfig) -> None:
    """Copy the weights of ``config.init_checkpoint`` into ``model``; the checkpoint must hold the
    same architecture trained on the same dataset."""
    path = config.init_checkpoint
    checkpoint = load_checkpoint(path)
    arch, dataset = checkpoint.meta.get("arch"), checkpoint.meta.get("dataset")
    role, wanted = checkpoint_role(checkpoint.meta), model_role(config.arch)
    if role != wanted:
        raise SmoothcertError(f"init checkpoint {path} holds a {role} ({arch}), but this run "
                              f"trains a {wanted} ({config.arch}); start from a {wanted} "
                              "checkpoint of the same arch and dataset")
    encoding, wanted = checkpoint.meta.get("input_encoding"), METHODS[config.method].input_encoding
    if encoding != wanted:
        raise SmoothcertError(f"init checkpoint {path} holds a model with input encoding "
                              f"{encoding or 'none'}, but method {config.method} trains one with "
                              f"{wanted or 'none'}; start from a checkpoint of such a model")
    if (arch, dataset) != (config.arch, config.dataset):
        raise SmoothcertError(
            f"init checkpoint {path} holds a {arch} trained on {dataset}, but this run trains a "
            f"{config.arch} on {config.dataset}; start from a checkpoint of the same arch and "
            "dataset"
        )
    load_weights(model, checkpoint.state_dict, f"init checkpoint {path}",
                 f"this run's {config.arch}")


def _check_indices(order, n: int, method: str) -> None:
    """A method's epoch order must be a non-empty 1-D int64 tensor of indices in [0, n)."""
    ok = isinstance(order, torch.Tensor) and order.dtype == torch.int64 and order.dim() == 1
    if not ok or len(order) == 0 or int(order.min()) < 0 or int(order.max()) >= n:
        raise RuntimeError(
            f"method {method!r}: epoch_indices must return a non-empty 1-D int64 tensor of "
            f"indices in [0, {n}), got {order!r:.200}"
        )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory_mb(device: torch.device) -> float:
    """Peak memory in MiB: CUDA memory allocated by tensors since the last reset (once per epoch)
    on a GPU; elsewhere the process's peak resident set size, which never decreases over the
    process (so on CPU it bounds the epoch's peak from above), NaN where unavailable."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if resource is None:
        return math.nan
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes / KiB


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _plain_scheduler_state(state: dict) -> dict:
    """MultiStepLR keeps its milestones in a Counter; store a dict (older torch refuses Counters
    under weights_only loading)."""
    if isinstance(state.get("milestones"), collections.Counter):
        state = {**state, "milestones": dict(state["milestones"])}
    return state


def _scheduler_state(state: dict) -> dict:
    if isinstance(state.get("milestones"), dict):
        state = {**state, "milestones": collections.Counter(state["milestones"])}
    return state


class _Meter:
    """Epoch sums of the method's scalars (weighted by batch size) and of correct predictions,
    kept on the device so that logging costs no host synchronisation per batch."""

    def __init__(self, judge=None):
        self.sums: dict[str, torch.Tensor] = {}
        self.correct, self.count, self.judged = 0, 0, 0  # judged: examples (pixels) with logits
        self.judge = judge  # (correct, judged) of a batch: the method's task (TrainingMethod)

    def update(self, out: dict[str, torch.Tensor], y: torch.Tensor) -> None:
        b = len(y)
        for key, value in out.items():
            if key != "logits":
                self.sums[key] = self.sums.get(key, 0) + value.detach().float() * b
        if "logits" in out:  # a denoiser's MSE or a diffusion loss has none
            right, seen = self.judge(out["logits"], y)
            self.correct, self.judged = self.correct + right, self.judged + seen
        self.count += b

    def mean(self, key: str) -> float:
        return float(self.sums[key]) / self.count

    def means(self) -> dict[str, float]:
        return {key: self.mean(key) for key in self.sums}

    def accuracy(self) -> float:
        """Training accuracy; NaN for a method that returns no logits."""
        judged = float(self.judged)
        return float(self.correct) / judged if judged else math.nan

    def reduced(self, world: World) -> _Meter:
        """The meter of all ranks together: sums of sums (float64), of correct, count and
        judged."""
        if not world.distributed:
            return self
        keys, device = list(self.sums), world.device
        local = [self.sums[k].double() for k in keys]
        local += [torch.as_tensor(self.correct, device=device).double()]
        local += [torch.tensor(float(n), dtype=torch.float64, device=device)
                  for n in (self.count, self.judged)]
        total = world.all_reduce_sum(torch.stack(local))
        meter = _Meter()
        meter.sums = dict(zip(keys, total[: len(keys)]))
        meter.correct, meter.count, meter.judged = total[-3], int(total[-2]), int(total[-1])
        meter.judge = self.judge
        return meter
