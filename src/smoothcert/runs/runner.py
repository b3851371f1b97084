"""Run PREDICT, CERTIFY or any registered certifier over a dataset; one record per example.

:func:`certify_dataset` is the one entry point, for Python users (any pixel-space module, any
map-style dataset) and for the CLI (a checkpoint and a registered dataset, through
:func:`run_dataset`). The runner owns everything around the algorithm: loading the model and
the examples (``inputs.py``), checking they fit, the global index list and this shard's part of
it, per-example generators seeded from (seed, idx), resuming, timing and the progress bar. A
:class:`Task` owns the algorithm: it maps one input to one row. New certifiers (sequential,
data-dependent, ...) register a Task.
"""

from __future__ import annotations

import contextlib
import dataclasses
import platform
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data import load_dataset
from ..errors import (
    SmoothcertError,
    check_count,
    check_positive_finite,
    check_probability,
)
from ..models.checkpoint import versions
from ..noise import Gaussian, Uniform
from .records import Records, global_indices, open_records, read_records, shard_indices, shard_path
from ..registry import Registry
from ..rng import example_generator
from ..sampling import BatchedVotes
from ..tensors import eval_mode
from ..smoothing import Certificate, Smoothed
from .inputs import (
    Examples,
    ModelSource,
    as_examples,
    file_sha256,  # noqa: F401  (re-exported for the CLI and the demo)
    load_source,
)


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines the rows of a run; it is the manifest's identity.

    ``task`` names the certifier (:data:`TASKS`); ``options`` are its own settings, completed
    with the task's defaults, so that equal runs have equal identities.
    """

    task: str
    checkpoint_sha256: str
    dataset: str
    split: str
    sigma: float
    n: int
    alpha: float
    batch: int
    seed: int
    skip: int = 1
    max_count: int | None = None
    n0: int | None = None  # CERTIFY's selection draws; PREDICT has none
    device_type: str = "cpu"  # noise streams differ between CPU and CUDA generators
    options: dict = field(default_factory=dict)
    # The engine's non-default accelerations (``BatchedVotes.settings``); empty = float32 eager,
    # so the identity of a plain run is the same as before these settings existed.
    engine: dict = field(default_factory=dict)
    # An explicit list of dataset indices instead of skip/max (``certify_dataset(indices=...)``).
    indices: tuple[int, ...] | None = None

    def __post_init__(self):
        task = TASKS[self.task]
        check_positive_finite("sigma", self.sigma), check_count("n", self.n)
        check_probability("alpha", self.alpha), check_count("batch", self.batch)
        check_count("skip", self.skip), check_count("seed", self.seed, minimum=0)
        if self.max_count is not None:
            check_count("max", self.max_count)
        if task.needs_n0:
            check_count("n0", self.n0 if self.n0 is not None else 0)
        if self.split not in ("train", "test"):
            raise SmoothcertError(f"split must be 'train' or 'test', got {self.split!r}")
        object.__setattr__(self, "options", _resolved_options(self.task, task, self.options))
        if task.validate is not None:
            task.validate(self.options)
        object.__setattr__(self, "engine", _resolved_engine(self.engine))
        if self.indices is not None:
            object.__setattr__(self, "indices", _checked_indices(self.indices))

    def run_indices(self, dataset_size: int) -> list[int]:
        """The run's global index list (before sharding): the explicit indices, or every
        ``skip``-th index, at most ``max_count`` of them."""
        if self.indices is None:
            return global_indices(dataset_size, self.skip, self.max_count)
        outside = [i for i in self.indices if i >= dataset_size]
        if outside:
            raise SmoothcertError(f"indices {outside[:5]} lie outside the dataset of "
                                  f"{dataset_size} examples")
        return list(self.indices)


def _checked_indices(indices) -> tuple[int, ...]:
    values = tuple(indices)
    if not values or not all(type(i) is int and i >= 0 for i in values):
        raise SmoothcertError("indices must be a non-empty list of integers >= 0")
    if len(set(values)) != len(values):
        raise SmoothcertError("indices must not repeat an index")
    return values


def _resolved_engine(given: dict) -> dict:
    """The engine settings that differ from the defaults, checked by building an engine."""
    defaults = BatchedVotes().settings()
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise SmoothcertError(f"unknown engine setting {', '.join(unknown)}; "
                              f"valid: {', '.join(defaults)}")
    settings = {key: _typed(key, value, defaults[key]) for key, value in given.items()}
    BatchedVotes(**settings)
    return {key: value for key, value in settings.items() if value != defaults[key]}


def _resolved_options(name: str, task: Task, given: dict) -> dict:
    unknown = sorted(set(given) - set(task.options))
    if unknown:
        valid = ", ".join(task.options) or "(none)"
        raise SmoothcertError(f"certifier {name!r} has no option {', '.join(unknown)}; "
                              f"valid: {valid}")
    return {key: _typed(key, given.get(key, default), default)
            for key, default in task.options.items()}


def _typed(key: str, value, default):
    """``value`` as the type of the option's default (an int is accepted for a float)."""
    kind = type(default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if default is not None and not isinstance(value, kind):
        raise SmoothcertError(f"option {key} must be of type {kind.__name__}, got {value!r}")
    return value


@dataclass(frozen=True)
class RunContext:
    """What a certifier may use across a run: rows already written (when resuming) included."""

    config: RunConfig
    smoothed: Smoothed
    dataset: Examples  # example(idx) -> (x, label)
    done: Records
    device: torch.device


@dataclass(frozen=True)
class Task:
    """A certifier: ``make(run: RunContext)`` returns ``one(x, label, idx, generator) -> row``.

    With ``batched``, ``one(...)`` is instead an engine program (a generator that yields
    ``sampling.Draws`` and returns the row), and the runner drives many examples at once so
    that forward batches are filled across inputs.
    The row holds the task's own columns; the runner adds idx, label, time and seed. ``make``
    is called once per run, so a certifier may keep state across examples (and rebuild it
    from ``run.done`` when a run resumes). ``options`` maps each of the certifier's own
    settings to its default; ``validate(options)`` raises SmoothcertError for bad values and
    ``shardable(options)`` says whether examples may be split across shards. Both run before
    any file is written.
    """

    columns: tuple
    make: Callable[[RunContext], Callable]
    needs_n0: bool = False
    options: dict = field(default_factory=dict)
    validate: Callable[[dict], None] | None = None
    shardable: Callable[[dict], bool] | None = None
    batched: bool = False


TASKS: Registry = Registry("certifier")


def register_task(name: str, task: Task) -> Task:
    return TASKS.register(name)(task)


def certificate_row(c: Certificate, label: int) -> dict:
    """The columns of a CERTIFY record from a :class:`Certificate`."""
    predict = -1 if c.abstained else c.prediction
    return {"predict": predict, "radius": c.radius, "correct": int(predict == label),
            "p_lower": c.p_lower, "nA": c.count, "n0": c.n0, "n": c.n, "alpha": c.alpha,
            "sigma": c.sigma}


CERTIFY_COLUMNS = ("idx", "label", "predict", "radius", "correct", "time",
                   "p_lower", "nA", "n0", "n", "alpha", "sigma", "seed")


def _certify(run: RunContext) -> Callable:
    cfg, smoothed = run.config, run.smoothed

    def program(x, label, idx, gen):
        c = yield from smoothed.certify_program(x, cfg.n0, cfg.n, cfg.alpha, gen)
        return certificate_row(c, label)

    return program


def _predict(run: RunContext) -> Callable:
    cfg, smoothed = run.config, run.smoothed

    def program(x, label, idx, gen):
        p = yield from smoothed.predict_program(x, cfg.n, cfg.alpha, gen)
        predict = -1 if p.abstained else p.prediction
        return {"predict": predict, "correct": int(predict == label), "count": p.count,
                "runner_up": p.runner_up_count, "pvalue": p.pvalue, "n": p.n,
                "alpha": p.alpha, "sigma": cfg.sigma}

    return program


register_task("certify", Task(CERTIFY_COLUMNS, _certify, needs_n0=True, batched=True))
register_task("predict", Task(
    ("idx", "label", "predict", "correct", "time",
     "count", "runner_up", "pvalue", "n", "alpha", "sigma", "seed"), _predict, batched=True))


def certify_dataset(
    model,
    dataset,
    *,
    sigma=None,
    n0: int = 100,
    n: int = 100_000,
    alpha: float = 0.001,
    batch: int = 1000,
    seed: int = 0,
    skip: int = 1,
    max_count: int | None = None,
    indices=None,
    certifier: str = "certify",
    options: dict | None = None,
    out=None,
    shard: tuple[int, int] = (0, 1),
    num_classes: int | None = None,
    device=None,
    workers: int | None = None,
    engine: dict | None = None,
    progress: bool = False,
) -> list[dict]:
    """Certify (or run any registered certifier on) every selected example of ``dataset``.

    ``model`` is a smoothcert checkpoint path or any ``nn.Module`` that maps pixels in [0, 1]
    (B, C, H, W) to logits (its normalization inside); ``dataset`` any map-style dataset of
    ``(x (C, H, W) float in [0, 1], y int)``. ``sigma`` is the noise level (a float, a
    ``Gaussian``, or a ``Uniform`` noise, which selects the uniform variant of the certifier);
    default: the checkpoint's. The examples are every ``skip``-th index, at most ``max_count``
    (or the explicit ``indices``), then every K-th of them from k for ``shard`` = (k, K).
    Example ``idx`` draws its noise from a generator seeded from (``seed``, idx), so the rows
    depend on neither ``batch``, nor sharding, nor resuming.

    With ``out``, the rows go to the record file (shard K > 1: ``out``'s shard name) with its
    manifest, exactly as ``smoothcert certify`` writes them; rerunning resumes after the rows
    already there, and a different configuration is refused. Returns the rows: the record
    file's (resumed ones included), or those computed here when ``out`` is None. For the
    default certifier each row's certificate holds with probability ≥ 1 − ``alpha``
    (Cohen et al., Thm. 1): ``predict`` −1 is an abstention.
    """
    source = load_source(model, device, num_classes)
    data = as_examples(dataset)
    task, sigma = _task_and_sigma(certifier, sigma, source.meta)
    cfg = RunConfig(
        task=task, checkpoint_sha256=source.sha256, dataset=data.name, split=data.split,
        sigma=sigma, n=n, alpha=alpha, batch=batch, seed=seed, skip=skip, max_count=max_count,
        n0=n0 if TASKS[task].needs_n0 else None, device_type=source.device.type,
        options=dict(options or {}), engine=dict(engine or {}),
        indices=tuple(indices) if indices is not None else None,
    )
    return execute(cfg, source, data, out, shard=_checked_shard(shard), workers=workers,
                   progress=progress)


# certify_dataset(sigma=Uniform(...)) runs the uniform-noise variant of these certifiers.
_UNIFORM_VARIANTS = {"certify": "uniform", "data-dependent": "data-dependent-uniform",
                     "uniform": "uniform", "data-dependent-uniform": "data-dependent-uniform"}


def _task_and_sigma(certifier: str, sigma, meta: dict) -> tuple[str, float]:
    TASKS[certifier]  # an unknown name raises with the list of known ones
    if sigma is None:
        if "noise" not in meta:
            raise SmoothcertError("pass sigma: a module carries no noise level")
        return certifier, float(meta["noise"]["sigma"])
    if isinstance(sigma, Uniform):
        if certifier not in _UNIFORM_VARIANTS:
            raise SmoothcertError(f"certifier {certifier!r} has no uniform-noise variant")
        return _UNIFORM_VARIANTS[certifier], sigma.scalar_sigma()
    if isinstance(sigma, Gaussian):
        return certifier, sigma.scalar_sigma()
    return certifier, check_positive_finite("sigma", sigma)


def _checked_shard(shard) -> tuple[int, int]:
    index, count = shard if isinstance(shard, (tuple, list)) and len(shard) == 2 else (-1, -1)
    if type(count) is not int or type(index) is not int or count < 1 or not 0 <= index < count:
        raise SmoothcertError(f"shard must be (index, count) with 0 <= index < count, got {shard}")
    return index, count


def run_dataset(
    cfg: RunConfig, checkpoint, out, *, shard=(0, 1), device="cpu", data_root=None,
    progress=True, workers: int | None = None, image_size: int | None = None,
) -> Path:
    """Run ``cfg`` on this shard of ``cfg.dataset``'s split with the model of ``checkpoint``,
    appending to (or resuming) its record file; returns that file's path (``out`` itself, or its
    shard name when there are shards). See :func:`smoothcert.certify_dataset`."""
    source = load_source(checkpoint, device)
    dataset = load_dataset(cfg.dataset, cfg.split, data_root=data_root, image_size=image_size)
    execute(cfg, source, as_examples(dataset), out, shard=shard, workers=workers,
            progress=progress)
    return shard_path(out, *shard)


def execute(cfg: RunConfig, source: ModelSource, data: Examples, out, *, shard=(0, 1),
            workers: int | None = None, progress: bool = False) -> list[dict]:
    """The rows of ``cfg`` on this shard's examples of ``data``; with ``out`` each row is also
    appended (fsynced) to the shard's record file, resuming after the rows already there, and
    the rows returned are the file's. Everything is checked before the file is opened."""
    _check_compatible(source, data)
    if workers is not None:
        check_count("workers", workers, minimum=0)
    mine = shard_indices(cfg.run_indices(len(data)), *shard)
    _check_shardable(cfg, shard)
    path = shard_path(out, *shard) if out is not None else None
    writer, done = _open(path, cfg, source, shard, len(data))
    smoothed = Smoothed(source.model, Gaussian(cfg.sigma), source.num_classes,
                        BatchedVotes(**cfg.engine))
    previous = read_records(path) if path is not None else _no_records(TASKS[cfg.task].columns)
    run = RunContext(cfg, smoothed, data, previous, source.device)
    task = TASKS[cfg.task]
    todo = [i for i in mine if i not in done]
    rows = _run_batched if task.batched else _run_each
    name = path.name if path is not None else data.name
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), disable=not progress,
               desc=f"{cfg.task} {name}", unit="img", dynamic_ncols=True)
    stream = data.stream(todo, workers)
    produced = []
    with writer, bar, eval_mode(source.model):
        for row in rows(task.make(run), smoothed, stream, cfg, source.device):
            writer.write(row)
            produced.append(row)
            bar.update()
    return read_records(path).rows() if path is not None else produced


def _open(path, cfg: RunConfig, source: ModelSource, shard, dataset_size: int):
    """The record writer and the indices already done; a writer that keeps nothing without a
    file."""
    if path is None:
        return _NoFile(), set()
    manifest = _manifest(cfg, source, shard, dataset_size)
    return open_records(path, TASKS[cfg.task].columns, manifest)


def _no_records(columns) -> Records:
    return Records("", tuple(columns), {c: np.array([]) for c in columns})


class _NoFile(contextlib.nullcontext):
    """The writer of a run without a record file: rows are only returned."""

    def write(self, row: dict) -> None:
        pass


def _run_each(certify_one: Callable, smoothed, stream, cfg: RunConfig, device):
    for idx, x, label in stream:
        generator = example_generator(cfg.seed, idx, device)
        start = time.perf_counter()
        row = certify_one(x, label, idx, generator)
        elapsed = time.perf_counter() - start
        yield {"idx": idx, "label": label, "time": elapsed, "seed": cfg.seed, **row}


def _run_batched(program: Callable, smoothed: Smoothed, stream, cfg: RunConfig, device):
    """Rows in the order their programs finish; ``time`` is each example's share of the wall
    time (``sampling.Finished.seconds``), so the column still adds up to the run's cost."""
    def example(idx, x, label):
        row = yield from program(x, label, idx, example_generator(cfg.seed, idx, device))
        return {"idx": idx, "label": label, "seed": cfg.seed, **row}

    programs = ((idx, example(idx, x, label)) for idx, x, label in stream)
    for done in smoothed.run(programs, cfg.batch):
        yield {**done.result, "time": done.seconds}


def _check_shardable(cfg: RunConfig, shard) -> None:
    shardable = TASKS[cfg.task].shardable
    if shard[1] > 1 and shardable is not None and not shardable(cfg.options):
        raise SmoothcertError(
            f"certifier {cfg.task!r} with options {cfg.options} needs every input in one run "
            "and order; run it without --num-shards"
        )


def _check_compatible(source: ModelSource, data: Examples) -> None:
    """The model's classes and input shape against the dataset's, where both are known."""
    meta = source.meta
    if data.num_classes is not None and source.num_classes != data.num_classes:
        raise SmoothcertError(
            f"num_classes mismatch: the model has {source.num_classes} classes, "
            f"dataset {data.name!r} has {data.num_classes}"
        )
    shape = meta.get("input_shape") or getattr(source.model, "input_shape", None)
    if shape is not None and data.input_shape is not None and \
            tuple(shape) != tuple(data.input_shape):
        raise SmoothcertError(
            f"the model expects inputs of shape {tuple(shape)}, "
            f"dataset {data.name!r} has {tuple(data.input_shape)}"
        )
    classes = meta.get("classes")
    if classes is not None and data.classes is not None and list(classes) != list(data.classes):
        differ = sorted(set(classes) ^ set(data.classes))[:5]
        detail = f"names only in one: {', '.join(differ)}" if differ else "same names, other order"
        raise SmoothcertError(
            f"the checkpoint's {len(classes)} classes differ from the {len(data.classes)} class "
            f"folders of {data.name!r} ({detail}); certify on the folder the model was trained on"
        )


def _identity(cfg: RunConfig) -> dict:
    """The run's identity; the engine's settings only when some differ from the defaults, so
    that plain runs keep the identity they had before the settings existed (and resume); the
    same for an explicit index list."""
    identity = dataclasses.asdict(cfg)
    for key in ("engine", "indices"):  # absent when default: older files keep resuming
        if not identity[key]:
            del identity[key]
    if "indices" in identity:
        identity["indices"] = list(identity["indices"])  # as JSON reads it back
    return identity


def _manifest(cfg: RunConfig, source: ModelSource, shard, dataset_size: int) -> dict:
    indices = {"dataset_size": dataset_size, "skip": cfg.skip, "max_count": cfg.max_count}
    if cfg.indices is not None:
        indices["explicit"] = list(cfg.indices)
    return {
        "kind": cfg.task,
        "identity": _identity(cfg),
        "shard": {"index": shard[0], "count": shard[1]},
        "indices": indices,
        "provenance": {
            "checkpoint": source.label,
            "device": str(source.device),
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "versions": versions(),
            "git_sha": git_sha(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    }


def git_sha() -> str | None:
    """The commit of the smoothcert source tree, when it is a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
