"""The one trainer loop: a method's loss, with checkpoints that resume bit-for-bit.

A run lives in one folder::

    DIR/config.yaml     the resolved TrainConfig (``train_config.py``; written at start)
    DIR/log.tsv         one row per completed epoch, flushed and fsynced; besides the losses it
                        records the epoch's cost: ``seconds`` and ``peak_mem_mb``
    DIR/checkpoint.pt   weights + metadata + everything needed to resume (written after each epoch)
    DIR/diffusers/      ``--method diffusion`` only: the model as a diffusers pipeline folder,
                        rewritten after each checkpoint (the method's export hook); naming the
                        checkpoint it comes from, so a resumed run rewrites one left behind
    DIR/train.lock      while a run writes DIR: a second run into DIR is refused (one line)

Each epoch's log row is appended just before its checkpoint is written (atomically), and cut
off again if the checkpoint is not (a full disk, an interrupt), so ``log.tsv`` does not list an
epoch whose checkpoint is not on disk (a kill between the two writes leaves the row; a resumed
run drops it). A full disk while writing ends the run with one line naming the file, the cause
and the epoch the checkpoint still holds. A fresh run that fails before its first checkpoint
removes what it wrote (config.yaml, log.tsv, and DIR itself if it created it), so a failed start
leaves nothing behind.

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
import logging
import os
import sys
from pathlib import Path

import yaml
from tqdm import tqdm

from ..errors import SmoothcertError
from ..io import (
    FileLock,
    append_lines,
    disk_full_error,
    read_tsv,
    trim_tsv,
    write_text_atomic,
)
from ..methods import build_method
from ..models.checkpoint import RUN_CHECKPOINT, load_checkpoint, model_from_loaded, save_checkpoint
from ..runs.progress import check_progress
from .config import TrainConfig
from .distributed import World, join
from .trainer import Trainer

log = logging.getLogger(__name__)

CHECKPOINT, LOG, CONFIG, LOCK = RUN_CHECKPOINT, "log.tsv", "config.yaml", "train.lock"


# --------------------------------------------------------------------------- run folder
def train(
    config: TrainConfig, out_dir, device="cpu", resume: bool = False, progress=True,
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
    idx), so the weights do not depend on ``workers``. ``progress`` (``runs.progress.MODES``):
    False, True or ``"bar"`` (a bar per epoch), ``"lines"`` (a plain line every 30 s within
    each epoch, for a log). Each epoch's log row is also written to stderr as one line when
    ``progress`` shows any, or when ``epoch_lines`` asks for it without (a log file, SLURM):
    rank 0 only.

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

    One run at a time writes ``out_dir`` (rank 0 locks it; a second is refused with one line).
    A full disk ends the run with one ``SmoothcertError`` naming the file and the epoch the
    checkpoint holds, which resumes; a fresh run that fails before its first checkpoint leaves
    nothing behind (see the module's docstring).
    """
    check_progress(progress)  # before the run folder is made
    with join(device) as world:
        return _train(config, Path(out_dir), world, resume, progress, workers, epoch_lines)


def _train(config: TrainConfig, out: Path, world: World, resume: bool, progress,
           workers: int | None = None, epoch_lines: bool = False) -> Path:
    path = out / CHECKPOINT
    with _RunFolder(out, world.is_main) as folder:
        checkpoint = _checkpoint_to_resume(config, path, resume)
        if checkpoint is not None:
            folder.saved = checkpoint.meta["epoch"]
            if world.is_main:
                folder.repair_export(config, checkpoint)
            if folder.saved >= config.epochs:
                log.warning("%s: all %d epochs are done; nothing to train", path, config.epochs)
                return path
        trainer = Trainer(config, world.device, load_init=checkpoint is None, world=world,
                          workers=workers)
        progress = progress if world.is_main else False  # a mode: "lines" stays
        say = progress or (epoch_lines and world.is_main)
        if checkpoint is not None:
            trainer.load(checkpoint)
            _say(f"resuming {path} after epoch {trainer.epoch}", say)
        if world.is_main:
            folder.write_config(config)
            epoch_log = folder.epoch_log(trainer.epoch)
        while trainer.epoch < config.epochs:
            row = trainer.train_epoch(progress)
            folder.save_epoch(trainer, epoch_log if world.is_main else None, row)
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


def _save(path: Path, trainer: Trainer) -> None:
    """Rank 0 writes the checkpoint, then the method's export beside it (e.g. a diffusers
    folder); every rank returns once they are on disk."""
    state = trainer.train_state()  # with K > 1 processes, every rank takes part
    if trainer.world.is_main:
        save_checkpoint(path, trainer.model, trainer.meta(), state)
        trainer.method.export(trainer.model, path.parent)
    trainer.world.barrier()


class _RunFolder:
    """The run folder while this run writes it. On rank 0 (``main``): created if missing and
    locked (:class:`smoothcert.io.FileLock` on ``train.lock``), so that a second run into it is
    refused; ``saved`` is the epoch of the checkpoint on disk (None: none yet). If the run fails
    while ``saved`` is None, the files this run wrote are removed, and the folder if this run
    created it. Other ranks write nothing and hold nothing."""

    def __init__(self, out: Path, main: bool):
        self.out, self.main = out, main
        self.saved: int | None = None
        self._created, self._lock, self._wrote = False, None, []

    def __enter__(self) -> _RunFolder:
        if self.main:
            self._created = _make_folder(self.out)
            try:
                self._lock = FileLock(self.out / LOCK, f"another train is writing {self.out}; "
                                      "wait for it to end or choose another --out")
            except BaseException:
                self._remove_folder()
                raise
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if self._lock is None:
            return
        failed_fresh = kind is not None and self.saved is None
        try:
            for file in self._wrote if failed_fresh else ():
                file.unlink(missing_ok=True)
        finally:
            self._lock.release()
        if failed_fresh:
            self._remove_folder()

    def _remove_folder(self) -> None:
        """The folder, if this run created it and it is empty."""
        if self._created:
            with contextlib.suppress(OSError):
                self.out.rmdir()

    def write_config(self, config: TrainConfig) -> None:
        path = self.out / CONFIG
        self._wrote.append(path)
        with self.writing(path, None):
            write_text_atomic(path, yaml.safe_dump(config.to_dict(), sort_keys=False))

    def epoch_log(self, epoch: int) -> _EpochLog:
        """The log, continued after the checkpoint's ``epoch`` (0: a new log)."""
        path = self.out / LOG
        if epoch == 0:
            self._wrote.append(path)
        return _EpochLog(path, epoch)

    def save_epoch(self, trainer: Trainer, epoch_log: _EpochLog | None, row: dict) -> None:
        """Epoch ``trainer.epoch``'s log ``row`` (rank 0: ``epoch_log``), then its checkpoint.
        If the checkpoint is not replaced (a full disk, an interrupt), the row is cut off the
        log again, so the log never lists an epoch whose checkpoint is not on disk (only a kill
        between the two writes leaves it, and a resumed run drops it)."""
        path, epoch = self.out / CHECKPOINT, trainer.epoch
        before = _file_id(path)
        with self.writing(epoch_log.path if epoch_log else path, epoch):
            mark = epoch_log.append(row) if epoch_log is not None else None
        try:
            _save(path, trainer)
        except BaseException as e:
            written = _file_id(path) != before  # the new checkpoint is there (its export failed)
            if written:
                self.saved = epoch
            elif epoch_log is not None:
                epoch_log.cut(mark)
            self._raise_if_disk_full(e, self.out if written else path, epoch)
            raise
        self.saved = epoch

    def repair_export(self, config: TrainConfig, checkpoint) -> None:
        """Bring the method's export (e.g. ``diffusers/``) up to date with the checkpoint being
        resumed: an export that failed after its checkpoint was written (a full disk) would
        otherwise stay an epoch behind it for good, since the epoch is done."""
        method = build_method(config.method, **config.method_params)
        if method.export_is_current(self.out):
            return
        model, _ = model_from_loaded(checkpoint, self.out / CHECKPOINT)
        with self.writing(self.out, self.saved):
            method.export(model, self.out)
        log.warning("%s: the export beside the checkpoint was behind it (epoch %d); written "
                    "again", self.out, self.saved)

    @contextlib.contextmanager
    def writing(self, file: Path, epoch: int | None):
        """A full disk (or quota) while ``file`` is written for ``epoch`` (None: at the start)
        becomes one line (:meth:`_raise_if_disk_full`)."""
        try:
            yield
        except Exception as e:
            self._raise_if_disk_full(e, file, epoch)
            raise

    def _raise_if_disk_full(self, e: BaseException, file: Path, epoch: int | None) -> None:
        """Raise one ``SmoothcertError`` line for ``e`` if it is a full disk or quota: the file,
        the cause, what the checkpoint holds, what to do. Nothing is lost: files are replaced
        atomically (the previous checkpoint is whole) and the log is cut back."""
        full = disk_full_error(e)
        if full is None:
            return
        when = f"saving epoch {epoch} to" if epoch is not None else "writing"
        raise SmoothcertError(
            f"disk full while {when} {file} ({full.strerror}); {self._kept(epoch)}; "
            "free some space, then rerun the same command with --resume") from e

    def _kept(self, epoch: int | None) -> str:
        if self.saved is None:
            return "no checkpoint was written yet"
        held = "holds" if self.saved == epoch else "still holds"
        return f"{self.out / CHECKPOINT} {held} epoch {self.saved}"


def _file_id(path: Path):
    """(device, inode) of ``path``, None if missing: an atomic replace gives a new inode."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _make_folder(out: Path) -> bool:
    """Create the run folder ``out`` (and its parents); whether it was created."""
    if out.is_dir():
        return False
    try:
        out.mkdir(parents=True)
    except FileExistsError:
        if out.is_dir():  # another process made it just now
            return False
        raise SmoothcertError(f"--out {out} is a file; give a folder for the run") from None
    except NotADirectoryError:
        raise SmoothcertError(f"cannot create the run folder {out}: a file is in the way; "
                              "choose another --out") from None
    return True


def _say(line: str, say: bool) -> None:
    """One line on stderr, above a progress bar if one is drawn."""
    if say:
        tqdm.write(line, file=sys.stderr)


class _EpochLog:
    """DIR/log.tsv: a header, then one full-precision row per completed epoch.

    Rows are written just before the epoch's checkpoint, and cut off again (:meth:`cut`) when
    the checkpoint is not written; on resume, rows after the checkpoint's epoch (left by a
    killed run) and a torn last line are dropped, so the file has one row per saved epoch. An
    append that fails (a full disk) leaves the file as it was. The file is a TSV file of
    :mod:`smoothcert.io`, written as the record files are.
    """

    def __init__(self, path: Path, epoch: int):
        self.path = path
        if epoch == 0:
            path.unlink(missing_ok=True)
        elif path.exists():
            try:
                trim_tsv(path, lambda header, row: len(row) == len(header)
                         and row[0].isdigit() and int(row[0]) <= epoch)  # garbage rows go too
            except UnicodeDecodeError:
                raise SmoothcertError(f"{path} is not a text TSV file (it cannot be decoded as "
                                      "UTF-8); move it away, then resume") from None

    def append(self, row: dict[str, float]) -> int:
        """Append ``row``; the size of the file before it (for :meth:`cut`)."""
        new = not self.path.exists() or self.path.stat().st_size == 0
        header = list(row) if new else read_tsv(self.path)[0]
        if sorted(header) != sorted(row):
            raise RuntimeError(f"log columns changed: {header} vs {list(row)}")
        size = 0 if new else self.path.stat().st_size
        append_lines(self.path, ([header] if new else []) + [[row[k] for k in header]])
        return size

    def cut(self, size: int) -> None:
        """Take back what was appended after the file had ``size`` bytes (needs no space)."""
        with contextlib.suppress(OSError):
            os.truncate(self.path, size)
