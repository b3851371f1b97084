"""The one trainer loop: a method's loss, with checkpoints that resume bit-for-bit.

A run lives in one folder::

    DIR/config.yaml     the resolved TrainConfig (``train_config.py``; written at start)
    DIR/log.tsv         one row per completed epoch, flushed and fsynced; besides the losses it
                        records the epoch's cost: ``seconds`` and ``peak_mem_mb``
    DIR/checkpoint.pt   weights + metadata + everything needed to resume (written after each epoch)
    DIR/diffusers/      ``--method diffusion`` only: the model as a diffusers pipeline folder,
                        rewritten after each checkpoint (the method's export hook)

Every random draw comes from a generator seeded from ``config.seed``: the model's initialisation,
the per-epoch shuffle (a CPU generator), and the augmentation and noise draws (a generator on the
training device; one per process in data-parallel training under ``torchrun``, see
:func:`train`). Their states go into the checkpoint, so an interrupted run resumed with
``resume=True`` ends with the same weights as an uninterrupted one (on the same device and
software). The trainer never branches on the method: a method returns ``{"loss", "logits", ...}``
and every other scalar it returns becomes a log column; a method may also hook the start of an
epoch (:meth:`~smoothcert.methods.TrainingMethod.on_epoch_start`) and choose which examples an
epoch visits (:meth:`~smoothcert.methods.TrainingMethod.epoch_indices`).

A run may start from the weights of another checkpoint (``init_checkpoint``, CLI ``--init-from``)
of the same architecture and dataset, for methods that fine-tune a pretrained classifier.

With ``sigma_mode="data_dependent"`` (Alfarra et al., "Data Dependent Randomized Smoothing",
UAI 2022, Algorithm 2) every training example keeps its own σ across epochs; before each step
the σ of the batch's examples take ``num_steps`` steps of OptimizeSigma
(:func:`smoothcert.smoothing.sigma_optimization.optimize_sigma`; ``sigma_mode_params``) and the
method trains
each example at its σ (see :class:`smoothcert.training.sigma_modes.PerExampleSigma`). The noise
is ``NOISES[config.noise]`` (Gaussian by default). The σ of all examples are saved with
every checkpoint (``train_state["per_example_sigma"]``, indexed like the training split) and
summarised in the log (``sigma_mean``, ``sigma_min``, ``sigma_max``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import sys
from pathlib import Path

import yaml
from tqdm import tqdm

from ..errors import SmoothcertError
from ..io import append_rows, read_tsv, trim_tsv, write_text_atomic
from ..models.checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig
from .distributed import World, join
from .trainer import Trainer

log = logging.getLogger(__name__)

CHECKPOINT, LOG, CONFIG = "checkpoint.pt", "log.tsv", "config.yaml"


# --------------------------------------------------------------------------- run folder
def train(
    config: TrainConfig, out_dir, device="cpu", resume: bool = False, progress: bool = True,
    workers: int | None = None, epoch_lines: bool = False,
) -> Path:
    """Train the model ``config`` says (a base classifier, a denoiser or a diffusion model, as its
    method trains), in the run folder ``out_dir``; returns the path of ``out_dir/checkpoint.pt``.

    Without ``resume`` an existing checkpoint is refused. With ``resume`` an existing checkpoint
    must hold the same config (``data_root`` aside); training continues after its last completed
    epoch with the same schedule and random streams, so the final weights equal those of an
    uninterrupted run. A run whose epochs are all done returns at once. ``workers`` processes
    decode an image folder's batches ahead of the step (default: one per core but one, at most
    8; 0 decodes in the step); data in memory need none. Crops and flips come from (seed, epoch,
    idx), so the weights do not depend on ``workers``. Each epoch's log row is also written to
    stderr as one line when ``progress`` draws bars, or when ``epoch_lines`` asks for it without
    bars (a log file, SLURM): rank 0 only.

    Data-parallel: launched by ``torchrun --nproc-per-node K`` (``WORLD_SIZE`` = K > 1), every
    process calls this with the same arguments; they join a process group (gloo on CPU, NCCL on
    CUDA, rank r on ``cuda:LOCAL_RANK``; see :mod:`smoothcert.training.distributed`). Then

    - ``config.batch_size`` B is the global batch, which must be a multiple of K: every epoch's
      order (the same on all ranks) is cut into global batches and rank r trains on the r-th
      of K contiguous parts, so the ranks together visit exactly the single-process epoch, and
      DDP averages the gradients: each step is the single-process step on the same B examples
      (with BatchNorm, each rank normalises its part with the part's own statistics);
    - each rank draws its noise and augmentation from its own stream, seeded from
      (seed, rank): the noise differs from a single-process run's;
    - the log's losses and training accuracy are means over all ranks' examples (all-reduced
      once per epoch); ``seconds``, ``peak_mem_mb`` and ``test_acc`` are rank 0's;
    - only rank 0 writes ``config.yaml``, ``log.tsv`` and ``checkpoint.pt``; the checkpoint
      holds every rank's noise generator, so a run resumed by as many processes continues
      exactly as an uninterrupted one (all ranks read the checkpoint). Resumed by another number
      of processes, everything but the noise streams continues exactly.
    """
    with join(device) as world:
        return _train(config, Path(out_dir), world, resume, progress, workers, epoch_lines)


def _train(config: TrainConfig, out: Path, world: World, resume: bool, progress: bool,
           workers: int | None = None, epoch_lines: bool = False) -> Path:
    path = out / CHECKPOINT
    checkpoint = _checkpoint_to_resume(config, path, resume)
    if checkpoint is not None and checkpoint.meta["epoch"] >= config.epochs:
        log.warning("%s: all %d epochs are done; nothing to train", path, config.epochs)
        return path
    trainer = Trainer(config, world.device, load_init=checkpoint is None, world=world,
                      workers=workers)
    progress = progress and world.is_main
    say = progress or (epoch_lines and world.is_main)
    if checkpoint is not None:
        trainer.load(checkpoint)
        _say(f"resuming {path} after epoch {trainer.epoch}", say)
    if world.is_main:
        _write_config(out, config)
        epoch_log = _EpochLog(out / LOG, trainer.epoch)
    while trainer.epoch < config.epochs:
        row = trainer.train_epoch(progress)
        with _disk_full(path, trainer.epoch):
            if world.is_main:
                epoch_log.append(row)
            _save(path, trainer)
        _say(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in row.items()), say)
    return path


def _checkpoint_to_resume(config: TrainConfig, path: Path, resume: bool):
    """The checkpoint to continue from, None for a fresh start; raises when it must not be used."""
    if not path.exists():
        return None
    if not resume:
        raise SmoothcertError(
            f"{path} already exists; pass --resume (resume=True) to continue that run, "
            "or choose another --out"
        )
    checkpoint = load_checkpoint(path)
    _check_same_config(config, checkpoint.meta, path)
    return checkpoint


def _check_same_config(config: TrainConfig, meta: dict, path: Path) -> None:
    """The checkpoint's config must be ``config``. One written by an older version (the
    ``dd_*`` keys, no ``noise``: Gaussian, fields added since at their defaults) is read by
    :meth:`TrainConfig.from_dict` as the config it ran, so such runs resume."""
    if not isinstance(meta.get("config"), dict):
        raise SmoothcertError(f"{path} holds no training config; it cannot be resumed")
    stored = TrainConfig.from_dict(meta["config"])
    keys = config.differences(stored)
    if keys:
        said = "; ".join(f"{k}: checkpoint {stored.to_dict()[k]!r}, asked {config.to_dict()[k]!r}"
                         for k in keys)
        raise SmoothcertError(
            f"cannot resume {path}: the config differs ({said}); "
            "use the run's config (its config.yaml) or another --out"
        )


@contextlib.contextmanager
def _disk_full(path: Path, epoch: int):
    """A full disk (or quota) while epoch ``epoch``'s log row or checkpoint ``path`` is written
    becomes one clear error. Nothing is lost: the checkpoint is replaced atomically, so the
    previous one is whole, and a resumed run drops the log's rows after it."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        kept = (f"{path} still holds epoch {epoch - 1}" if path.exists()
                else "no checkpoint was written yet")
        raise SmoothcertError(
            f"disk full while saving epoch {epoch} in {path.parent} ({e.strerror}); {kept}; "
            "free some space, then rerun the same command with --resume") from e


def _save(path: Path, trainer: Trainer) -> None:
    """Rank 0 writes the checkpoint, then the method's export beside it (e.g. a diffusers
    folder); every rank returns once they are on disk."""
    state = trainer.train_state()  # with K > 1 processes, every rank takes part
    if trainer.world.is_main:
        save_checkpoint(path, trainer.model, trainer.meta(), state)
        trainer.method.export(trainer.model, path.parent)
    trainer.world.barrier()


def _write_config(out: Path, config: TrainConfig) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / CONFIG, yaml.safe_dump(config.to_dict(), sort_keys=False))


def _say(line: str, say: bool) -> None:
    """One line on stderr, above a progress bar if one is drawn."""
    if say:
        tqdm.write(line, file=sys.stderr)


class _EpochLog:
    """DIR/log.tsv: a header, then one full-precision row per completed epoch.

    Rows are written before the epoch's checkpoint; on resume, rows after the checkpoint's epoch
    (and a torn last line) are dropped, so the file always has exactly one row per saved epoch.
    The file is a TSV file of :mod:`smoothcert.io`, written as the record files are.
    """

    def __init__(self, path: Path, epoch: int):
        self.path = path
        if epoch == 0:
            path.unlink(missing_ok=True)
        elif path.exists():
            trim_tsv(path, lambda header, row: len(row) == len(header) and int(row[0]) <= epoch)

    def append(self, row: dict[str, float]) -> None:
        new = not self.path.exists() or self.path.stat().st_size == 0
        header = list(row) if new else read_tsv(self.path)[0]
        if sorted(header) != sorted(row):
            raise RuntimeError(f"log columns changed: {header} vs {list(row)}")
        with open(self.path, "a", encoding="utf-8") as f:
            append_rows(f, ([header] if new else []) + [[row[k] for k in header]])
