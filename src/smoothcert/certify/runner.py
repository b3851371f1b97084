"""Run PREDICT or CERTIFY over a dataset split and write one record per example.

The runner owns everything around the algorithm: loading the checkpoint and data, checking they
fit, the global index list and this shard's part of it, per-example generators seeded from
(seed, idx), resuming, timing and the progress bar. A :class:`Task` owns the algorithm: it maps
one input to one row. New certifiers (sequential, data-dependent, ...) register a Task.
"""

from __future__ import annotations

import dataclasses
import hashlib
import platform
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..data import load_dataset
from ..errors import (
    SmoothcertError,
    check_count,
    check_positive_finite,
    check_probability,
)
from ..models.checkpoint import model_from_checkpoint, versions
from ..noise import Gaussian
from ..records import Records, global_indices, open_records, read_records, shard_indices, shard_path
from ..registry import Registry
from ..rng import example_generator
from ..sampling import BatchedVotes
from ..smoothing import Certificate, Smoothed


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
    dataset: object  # smoothcert.data.ImageDataset
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


def run_dataset(
    cfg: RunConfig, checkpoint, out, *, shard=(0, 1), device="cpu", data_root=None, progress=True
) -> Path:
    """Run ``cfg.task`` on this shard's examples, appending to (or resuming) its record file.

    Returns the record file's path (``out`` itself, or its shard name when there are shards).
    """
    model, meta = model_from_checkpoint(checkpoint, device=device)
    dataset = load_dataset(cfg.dataset, cfg.split, data_root=data_root)
    _check_compatible(meta, dataset)
    mine = shard_indices(global_indices(len(dataset), cfg.skip, cfg.max_count), *shard)
    _check_shardable(cfg, shard)
    path = shard_path(out, *shard)
    manifest = _manifest(cfg, checkpoint, shard, len(dataset), device)
    writer, done = open_records(path, TASKS[cfg.task].columns, manifest)
    smoothed = Smoothed(model, Gaussian(cfg.sigma), dataset.num_classes,
                        BatchedVotes(**cfg.engine))
    run = RunContext(cfg, smoothed, dataset, read_records(path), torch.device(device))
    task = TASKS[cfg.task]
    todo = [i for i in mine if i not in done]
    rows = _run_batched if task.batched else _run_each
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), disable=not progress,
               desc=f"{cfg.task} {path.name}", unit="img", dynamic_ncols=True)
    with writer, bar:
        for row in rows(task.make(run), smoothed, dataset, todo, cfg, device):
            writer.write(row)
            bar.update()
    return path


def _run_each(certify_one: Callable, smoothed, dataset, todo, cfg: RunConfig, device):
    for idx in todo:
        yield _run_one(certify_one, dataset, idx, cfg, device)


def _run_batched(program: Callable, smoothed: Smoothed, dataset, todo, cfg: RunConfig, device):
    """Rows in the order their programs finish; ``time`` is each example's share of the wall
    time (``sampling.Finished.seconds``), so the column still adds up to the run's cost."""
    def example(idx):
        x, label = dataset.example(idx)
        row = yield from program(x, label, idx, example_generator(cfg.seed, idx, device))
        return {"idx": idx, "label": label, "seed": cfg.seed, **row}

    for done in smoothed.run(((idx, example(idx)) for idx in todo), cfg.batch):
        yield {**done.result, "time": done.seconds}


def _check_shardable(cfg: RunConfig, shard) -> None:
    shardable = TASKS[cfg.task].shardable
    if shard[1] > 1 and shardable is not None and not shardable(cfg.options):
        raise SmoothcertError(
            f"certifier {cfg.task!r} with options {cfg.options} needs every input in one run "
            "and order; run it without --num-shards"
        )


def _run_one(certify_one: Callable, dataset, idx: int, cfg: RunConfig, device) -> dict:
    x, label = dataset.example(idx)
    generator = example_generator(cfg.seed, idx, device)
    start = time.perf_counter()
    row = certify_one(x, label, idx, generator)
    elapsed = time.perf_counter() - start
    return {"idx": idx, "label": label, "time": elapsed, "seed": cfg.seed, **row}


def _check_compatible(meta: dict, dataset) -> None:
    if int(meta["num_classes"]) != dataset.num_classes:
        raise SmoothcertError(
            f"num_classes mismatch: the checkpoint has {meta['num_classes']} classes, "
            f"dataset {dataset.name!r} has {dataset.num_classes}"
        )
    if tuple(meta["input_shape"]) != tuple(dataset.input_shape):
        raise SmoothcertError(
            f"the checkpoint expects inputs of shape {tuple(meta['input_shape'])}, "
            f"dataset {dataset.name!r} has {tuple(dataset.input_shape)}"
        )


def _identity(cfg: RunConfig) -> dict:
    """The run's identity; the engine's settings only when some differ from the defaults, so
    that plain runs keep the identity they had before the settings existed (and resume)."""
    identity = dataclasses.asdict(cfg)
    if not identity["engine"]:
        del identity["engine"]
    return identity


def _manifest(cfg: RunConfig, checkpoint, shard, dataset_size: int, device) -> dict:
    return {
        "kind": cfg.task,
        "identity": _identity(cfg),
        "shard": {"index": shard[0], "count": shard[1]},
        "indices": {"dataset_size": dataset_size, "skip": cfg.skip, "max_count": cfg.max_count},
        "provenance": {
            "checkpoint": str(checkpoint),
            "device": str(device),
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "versions": versions(),
            "git_sha": git_sha(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    }


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise SmoothcertError(f"cannot read checkpoint {path}: {e.strerror}") from e
    return digest.hexdigest()


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
