"""Training-cost tables of run folders: :class:`TrainRun`, :func:`read_run`, :func:`train_report`.

A run folder (:func:`smoothcert.training.train`) says what its training cost: seconds per epoch
and peak memory from its ``log.tsv``, the method and its number of hyperparameters from its
checkpoint (or ``config.yaml``), and the ACR of the first CERTIFY record file beside them
(Jeong & Shin's Table 3 columns).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ..errors import SmoothcertError
from ..io import read_tsv
from ..runs.records import read_manifest, read_records
from .metrics import average_certified_radius
from .report import _paths_and_labels
from .tables import Table, get_format


@dataclasses.dataclass(frozen=True)
class TrainRun:
    """What a run folder says about the cost of its training (Jeong & Shin's Table 3 columns)."""

    name: str
    method: str
    num_hparams: int
    epochs: int
    seconds_per_epoch: float
    peak_mem_mb: float | None  # None for runs logged before memory was recorded
    acr: float | None  # of the first CERTIFY record file in the folder, if any
    variant: str | None = None  # a named variant, not the method's paper (e.g. "target=self")

    @property
    def method_label(self) -> str:
        """The method column: its name, and its named variant in parentheses where it has one
        (``"catrs (target=self)"``), so a table never passes a variant off as the paper's."""
        return self.method if self.variant is None else f"{self.method} ({self.variant})"


def read_run(run_dir, name: str | None = None) -> TrainRun:
    """Summarize a training run folder: log.tsv, the method from checkpoint.pt (or, where the
    checkpoint stays out of git, from the config.yaml the trainer writes beside it) and the ACR of
    the first CERTIFY record file in it."""
    run_dir = Path(run_dir)
    _check_run_folder(run_dir)
    log = _read_log(run_dir / "log.tsv")
    method, hparams, num_hparams, variant = _run_method(run_dir)
    return TrainRun(
        name=name or run_dir.name,
        method=method,
        variant=variant,
        num_hparams=num_hparams if num_hparams is not None else len(hparams),
        epochs=len(log["seconds"]),
        seconds_per_epoch=float(np.mean(log["seconds"])),
        peak_mem_mb=float(np.max(log["peak_mem_mb"])) if "peak_mem_mb" in log else None,
        acr=_run_acr(run_dir),
    )


def _check_run_folder(run_dir: Path) -> None:
    if not ((run_dir / "checkpoint.pt").is_file() or (run_dir / "config.yaml").is_file()):
        raise SmoothcertError(
            f"{run_dir} is not a training run folder (no checkpoint.pt or config.yaml)")


def _run_method(run_dir: Path) -> tuple[str, dict, int | None, str | None]:
    """(method name, hyperparameters, recorded #HP or None, named variant or None) of a run
    folder: the variant its checkpoint records (``meta["method"]["variant"]``), else the one its
    hyperparameters make (:func:`_named_variant`; config.yaml, older checkpoints)."""
    if (run_dir / "checkpoint.pt").is_file():
        from ..models.checkpoint import load_checkpoint

        meta = load_checkpoint(run_dir / "checkpoint.pt").meta
        name, hparams = meta["method"]["name"], meta["method"].get("hparams", {})
        variant = meta["method"].get("variant") or _named_variant(name, hparams)
        return name, hparams, meta.get("num_hparams"), variant
    name, params = _config_method(run_dir / "config.yaml")
    return name, params, None, _named_variant(name, params)


def _named_variant(name: str, hparams: dict) -> str | None:
    """``TrainingMethod.named_variant`` of the method these hyperparameters build; None where
    this version cannot build it (a method or hyperparameter it no longer knows): the table
    then shows the bare name, as it did before variants were recorded."""
    from ..methods import build_method

    try:
        return build_method(name, **hparams).named_variant()
    except SmoothcertError:
        return None


def _config_method(path: Path) -> tuple[str, dict]:
    """(method name, its hyperparameters) of a run's config.yaml."""
    from ..training.recipes import read_yaml

    config = read_yaml(path, "run config")
    config = config if isinstance(config, dict) else {}
    method, params = config.get("method"), config.get("method_params") or {}
    if not isinstance(method, str) or not isinstance(params, dict):
        raise SmoothcertError(f"cannot read the method of {path}: it must be a mapping with "
                              "the method's name (method) and its hyperparameters "
                              "(method_params)")
    return method, dict(params)


def _read_log(path: Path) -> dict[str, np.ndarray]:
    """The cost columns of a training log.tsv (it has the record-file layout, keyed by
    ``epoch``): ``seconds`` and, where logged, ``peak_mem_mb``, one float per completed epoch.
    A log that cannot be read, or whose cost cells are not finite numbers ≥ 0, is one
    SmoothcertError line naming the file and the line."""
    from ..training.recipes import not_utf8

    try:
        lines = read_tsv(path)  # complete lines: not a row being written
    except UnicodeDecodeError as e:
        raise SmoothcertError(f"training log {path} is not a text file: {not_utf8(e)}") from None
    except OSError as e:
        raise SmoothcertError(f"cannot read training log {path}: {e.strerror or e}") from None
    header = lines[0] if lines else []
    if "seconds" not in header:
        raise SmoothcertError(f"training log {path} line 1: the header has no 'seconds' column; "
                              "is it a smoothcert train log.tsv?")
    rows = [(number, row) for number, row in enumerate(lines[1:], start=2) if row != [""]]
    if not rows:
        raise SmoothcertError(f"training log {path} has no completed epoch")
    kept = [key for key in _COST_COLUMNS if key in header]
    return {key: np.array([_cost(path, number, header, row, key) for number, row in rows])
            for key in kept}


_COST_COLUMNS = ("seconds", "peak_mem_mb")  # the log's columns the table reads


def _cost(path: Path, number: int, header: list[str], row: list[str], key: str) -> float:
    """The cell ``key`` of log line ``number``: a number ≥ 0 (seconds, MiB); NaN only as the
    peak memory of a platform that cannot measure it."""
    if len(row) != len(header):
        raise SmoothcertError(f"training log {path} line {number}: {len(row)} cells, but the "
                              f"header has {len(header)}")
    cell = row[header.index(key)]
    try:
        value = float(cell)
    except ValueError:
        value = None
    unknown = key == "peak_mem_mb" and value is not None and np.isnan(value)
    if not unknown and (value is None or not np.isfinite(value) or value < 0):
        raise SmoothcertError(f"training log {path} line {number}: {key} must be a number >= 0, "
                              f"got {cell[:40]!r}")
    return value


def _run_acr(run_dir: Path) -> float | None:
    for path in sorted(run_dir.glob("*.tsv")):
        manifest = read_manifest(path)
        if manifest is not None and (manifest.get("identity") or {}).get("certifier") == "certify":
            return average_certified_radius(read_records(path))
    return None


def training_table(runs: Sequence[TrainRun]) -> Table:
    return Table(
        keys=("name", "method", "num_hparams", "epochs", "seconds_per_epoch", "peak_mem_mb",
              "acr"),
        headers=("name", "method", "#HP", "epochs", "s/epoch", "peak MB", "ACR"),
        styles=("text", "text", "int", "int", "float2", "float2", "float3"),
        rows=tuple((r.name, r.method_label, r.num_hparams, r.epochs, r.seconds_per_epoch,
                    r.peak_mem_mb, r.acr) for r in runs),
    )


def train_report(run_dirs: Iterable, fmt: str = "md") -> str:
    """The training-cost table of run folders: method, #HP, seconds per epoch, peak memory, ACR."""
    formatter = get_format(fmt)
    paths, labels = _paths_and_labels(run_dirs, folders=True)
    return formatter(training_table([read_run(p, label) for p, label in zip(paths, labels)]))
