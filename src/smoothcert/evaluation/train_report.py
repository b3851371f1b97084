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
import yaml

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


def read_run(run_dir, name: str | None = None) -> TrainRun:
    """Summarize a training run folder: log.tsv, the method from checkpoint.pt (or, where the
    checkpoint stays out of git, from the config.yaml the trainer writes beside it) and the ACR of
    the first CERTIFY record file in it."""
    run_dir = Path(run_dir)
    _check_run_folder(run_dir)
    log = _read_log(run_dir / "log.tsv")
    method, hparams, num_hparams = _run_method(run_dir)
    return TrainRun(
        name=name or run_dir.name,
        method=method,
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


def _run_method(run_dir: Path) -> tuple[str, dict, int | None]:
    """(method name, hyperparameters, recorded #HP or None) of a run folder."""
    if (run_dir / "checkpoint.pt").is_file():
        from ..models.checkpoint import load_checkpoint

        meta = load_checkpoint(run_dir / "checkpoint.pt").meta
        hparams = meta["method"].get("hparams", {})
        return meta["method"]["name"], hparams, meta.get("num_hparams")
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        return config["method"], dict(config.get("method_params") or {}), None
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        raise SmoothcertError(f"cannot read the method of {run_dir / 'config.yaml'}: {e}") from e


def _read_log(path: Path) -> dict:
    """The columns of a training log.tsv (it has the record-file layout, keyed by ``epoch``)."""
    try:
        lines = read_tsv(path)  # complete lines: not a row being written
    except OSError as e:
        raise SmoothcertError(f"cannot read training log {path}: {e.strerror}") from e
    header, rows = lines[0] if lines else [], [row for row in lines[1:] if row != [""]]
    if not rows:
        raise SmoothcertError(f"training log {path} has no completed epoch")
    return {k: np.array([float(r[i]) for r in rows]) for i, k in enumerate(header)}


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
        rows=tuple(dataclasses.astuple(r) for r in runs),
    )


def train_report(run_dirs: Iterable, fmt: str = "md") -> str:
    """The training-cost table of run folders: method, #HP, seconds per epoch, peak memory, ACR."""
    formatter = get_format(fmt)
    paths, labels = _paths_and_labels(run_dirs, folders=True)
    return formatter(training_table([read_run(p, label) for p, label in zip(paths, labels)]))
