"""Checkpoints are data, not code: a dict of plain Python values and tensors.

A smoothcert checkpoint is a ``torch.save`` of::

    {"format": "smoothcert-checkpoint", "format_version": 2,
     "meta": {...}, "state_dict": {...}, "train_state": {...} | None}

``meta`` says how to rebuild and interpret the model (arch, dataset, num_classes, input_shape,
mean, std, noise, method, epoch, versions, config; and, where they apply, arch_kwargs, classes,
role and input_encoding, absent otherwise so that older files read unchanged); ``train_state``
holds whatever the trainer needs to resume (optimizer, scheduler, RNG states). Loading uses
``torch.load(weights_only=True)``, so a checkpoint can never run code. Writing is atomic: a
crash or a full disk leaves the old file or the new one. A checkpoint of an older format version
(and the training config in its meta) is upgraded in memory on loading
(:func:`smoothcert.upgrade.upgrade_checkpoint`); the file is not changed.

Every file is checked where it is read, so that a bad one is one line naming the file and what is
wrong, never a deep error later: unreadable or hostile bytes, a meta whose fields are missing, of
the wrong type or out of range (:func:`load_checkpoint`), weights that do not fit the model or are
not finite (:func:`load_weights`). A train run folder stands for its ``checkpoint.pt``
(:func:`checkpoint_file`).
"""

from __future__ import annotations

import io
import math
import os
import platform
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..data.registry import TASKS
from ..errors import SmoothcertError
from ..io import atomic_write
from ..upgrade import CHECKPOINT_VERSION, VERSION_KEY, upgrade_checkpoint
from .archs import ROLES, build_model, model_role, model_task
from .encodings import ENCODINGS

FORMAT = "smoothcert-checkpoint"
REQUIRED_META = (
    "arch",
    "dataset",
    "num_classes",
    "input_shape",
    "mean",
    "std",
    "noise",
    "method",
    "epoch",
    "versions",
    "config",
)
# Exact types: subclasses (e.g. torch.__version__, a str subclass) pickle under their own class,
# which weights-only loading refuses.
_SCALARS = (str, int, float, bool, type(None))
_MAPPINGS = (dict, OrderedDict)
_SEQUENCES = (list, tuple)
RUN_CHECKPOINT = "checkpoint.pt"  # the checkpoint in a train run folder (training/loop.py)
# Bounds of a meta's sizes, far above any real model's (ImageNet-21k has 21,841 classes; the
# largest inputs of the papers are 512x512), so that a corrupt or edited meta is refused at
# load instead of asking for terabytes when the model is built.
MAX_CLASSES = 1_000_000
MAX_SIDE = 65_536
MAX_EPOCH = 10**9  # more completed epochs than any run: a corrupt or foreign number


@dataclass(frozen=True)
class Checkpoint:
    meta: dict
    state_dict: dict[str, torch.Tensor]
    train_state: dict | None


def versions() -> dict[str, str]:
    """Versions of smoothcert, torch and Python, for provenance."""
    from ..version import __version__

    python = platform.python_version()
    return {"smoothcert": str(__version__), "torch": str(torch.__version__), "python": python}


def save_checkpoint(
    path: str | os.PathLike, model: nn.Module, meta: dict, train_state: dict | None = None
) -> Path:
    """Write ``model``'s state dict (moved to CPU) with ``meta`` and ``train_state`` to ``path``.

    ``meta`` needs the keys of :data:`REQUIRED_META`; ``meta`` and ``train_state`` may hold only
    str/int/float/bool/None, tensors, and lists, tuples and str-keyed dicts of those, so that
    weights-only loading can read them. The file is replaced atomically
    (:func:`smoothcert.io.atomic_write`); its folder is created if missing. Returns the path
    written.

    The checkpoint is serialized in memory first (one more copy of the CPU tensors, for a
    moment) and then written with a plain file write: a full disk then fails as an ``OSError``
    (ENOSPC) naming ``path``, where ``torch.save`` into the file would raise torch's own
    ``RuntimeError`` ("unexpected pos"), and the old file at ``path`` stays whole.
    """
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise SmoothcertError(f"checkpoint meta lacks {', '.join(missing)}; add them before saving")
    _check_plain(meta, "meta")
    _check_plain(train_state, "train_state")
    payload = {
        "format": FORMAT,
        VERSION_KEY: CHECKPOINT_VERSION,
        "meta": meta,
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "train_state": train_state,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, binary=True) as f:
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        f.write(buffer.getbuffer())
    return path


def _check_plain(obj, where: str) -> None:
    """Raise if ``obj`` holds anything weights-only loading would refuse (e.g. numpy scalars)."""
    if type(obj) in _MAPPINGS:
        for key, value in obj.items():
            if type(key) not in (str, int):
                raise SmoothcertError(f"{where} has a key {key!r}; use str keys")
            _check_plain(value, f"{where}[{key!r}]")
    elif type(obj) in _SEQUENCES:
        for i, value in enumerate(obj):
            _check_plain(value, f"{where}[{i}]")
    elif type(obj) not in _SCALARS and not isinstance(obj, torch.Tensor):
        raise SmoothcertError(
            f"{where} is a {type(obj).__name__}; checkpoints hold only plain Python values and "
            f"tensors (convert it, e.g. with float() or .tolist())"
        )


# --------------------------------------------------------------------------- loading
def checkpoint_file(path: str | os.PathLike) -> Path:
    """The checkpoint file ``path`` names: ``path`` itself, or the ``checkpoint.pt`` of a train
    run folder. A folder without one, or a path where nothing is, is one clear error."""
    path = Path(path)
    if path.is_dir():
        if (path / RUN_CHECKPOINT).is_file():
            return path / RUN_CHECKPOINT
        if _diffusers_folder(path):
            raise SmoothcertError(
                f"{path} is a diffusers folder (a diffusion model), not a classifier checkpoint; "
                f"put it in front of a classifier with --denoiser diffusers:{path}")
        raise SmoothcertError(f"{path} is a folder without a {RUN_CHECKPOINT} ({_held(path)}); "
                              "give a checkpoint file or a train run folder")
    if not path.is_file():
        raise SmoothcertError(f"checkpoint {path} does not exist; check the path")
    return path


def _diffusers_folder(folder: Path) -> bool:
    """Whether ``folder`` looks like a diffusers pipeline or a flat UNet + scheduler folder."""
    return (folder / "model_index.json").is_file() or (folder / "unet" / "config.json").is_file() \
        or ((folder / "config.json").is_file() and (folder / "scheduler_config.json").is_file())


def _held(folder: Path) -> str:
    """What ``folder`` holds, in a few words."""
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError as e:
        return f"it cannot be listed: {e.strerror}"
    if not names:
        return "it is empty"
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return f"it holds {', '.join(names[:5])}{more}"


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> Checkpoint:
    """Read a smoothcert checkpoint with weights-only unpickling; tensors go to ``map_location``.
    One of an older format version comes back in the current format. ``path`` may be a train run
    folder (its ``checkpoint.pt``). The meta is checked (:func:`check_meta`); a file that cannot
    be read weights-only, is not a smoothcert checkpoint or has a bad meta is one
    ``SmoothcertError`` naming it."""
    path = checkpoint_file(path)
    if path.stat().st_size == 0:
        raise SmoothcertError(f"checkpoint {path} is empty (0 bytes); save it again")
    try:
        with warnings.catch_warnings():  # torch's lines about a pickle protocol: noise here
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        raise SmoothcertError(_unreadable(path, err)) from err
    _check_format(obj, path)
    obj = upgrade_checkpoint(obj, f"checkpoint {path}")
    check_meta(obj["meta"], f"checkpoint {path}")
    return Checkpoint(obj["meta"], obj["state_dict"], obj.get("train_state"))


def _unreadable(path: Path, err: Exception) -> str:
    """One line for a file ``torch.load`` refused. Never torch's own advice: its message
    suggests ``weights_only=False``, which would run whatever code the file holds."""
    if "unsupported global" in str(err).lower():
        return (f"checkpoint {path} holds Python objects other than tensors and plain values "
                "(pickled code?), which smoothcert never unpickles; it is not a smoothcert "
                "checkpoint (one from elsewhere goes through import-checkpoint)")
    return (f"checkpoint {path} cannot be read as a weights-only PyTorch file "
            f"({type(err).__name__}); it is truncated, corrupt or not a checkpoint, save it again")


def _check_format(obj, path: Path) -> None:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        keys = ", ".join(sorted(map(str, obj))[:8]) if isinstance(obj, dict) \
            else type(obj).__name__
        raise SmoothcertError(
            f"{path} is not a smoothcert checkpoint (it holds {keys}); reference checkpoints "
            f"(e.g. Cohen et al.'s .pth.tar) must first be converted with the import command"
        )
    if not isinstance(obj.get("meta"), dict) or not isinstance(obj.get("state_dict"), dict):
        raise SmoothcertError(f"{path} lacks its meta or state_dict; the checkpoint is corrupt")


# --------------------------------------------------------------------------- checking a meta
def check_meta(meta: dict, where: str) -> None:
    """Refuse a meta that lacks a key of :data:`REQUIRED_META` or holds a value of the wrong
    type or out of range (a corrupt or hand-edited file), with one line naming ``where``, the
    field and what it must be."""
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise SmoothcertError(f"{where}: its meta lacks {', '.join(missing)}; the checkpoint is "
                              "corrupt or was not written by smoothcert")
    for key, (ok, wanted) in _META_RULES.items():
        if key in meta and not ok(meta[key]):
            raise SmoothcertError(f"{where}: meta {key} is {_shown(meta[key])}, expected "
                                  f"{wanted}; the checkpoint is corrupt or was edited")
    channels = meta["input_shape"][0]
    for key in ("mean", "std"):
        if len(meta[key]) not in (1, channels):
            raise SmoothcertError(f"{where}: meta {key} has {len(meta[key])} values for "
                                  f"{channels} channels; the checkpoint is corrupt or was edited")


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(value, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _reals(values, positive: bool = False) -> bool:
    return isinstance(values, (list, tuple)) and len(values) > 0 and all(
        _real(v) and (v > 0 or not positive) for v in values)


def _named(value) -> bool:
    return isinstance(value, dict) and isinstance(value.get("name"), str)


def _noise(value) -> bool:
    return value is None or (_named(value) and _real(value.get("sigma"))
                             and value["sigma"] >= 0)  # 0: a clean classifier


_META_RULES = {
    "arch": (lambda v: isinstance(v, str) and v != "", "an architecture name"),
    "dataset": (lambda v: isinstance(v, str) and v != "", "a dataset name"),
    "num_classes": (lambda v: _int(v, 0, MAX_CLASSES), f"an integer in 0..{MAX_CLASSES}"),
    "input_shape": (lambda v: isinstance(v, (list, tuple)) and 1 <= len(v) <= 4
                    and all(_int(s, 1, MAX_SIDE) for s in v),
                    f"1 to 4 integers in 1..{MAX_SIDE}, e.g. [3, 32, 32]"),
    "mean": (_reals, "a list of finite numbers"),
    "std": (lambda v: _reals(v, positive=True), "a list of positive finite numbers"),
    "noise": (_noise, "none, or a noise name with a finite sigma >= 0"),
    "method": (_named, "a method name with its hyperparameters"),
    "epoch": (lambda v: _int(v, 0, MAX_EPOCH),
              f"a count of epochs (an integer in 0..{MAX_EPOCH})"),
    "versions": (lambda v: isinstance(v, dict), "a mapping of versions"),
    "config": (lambda v: isinstance(v, dict), "a mapping (the training config)"),
    "arch_kwargs": (lambda v: v is None or isinstance(v, dict), "a mapping of parameters"),
    "classes": (lambda v: isinstance(v, list) and all(isinstance(c, str) for c in v),
                "a list of class names"),
    "role": (lambda v: v in ROLES, f"one of {', '.join(ROLES)}"),
    # absent (every checkpoint before Step 18, every classifier): "classification"
    "task": (lambda v: v in TASKS, f"one of {', '.join(TASKS)}"),
    # absent (every checkpoint before ablation smoothing) is None: a plain classifier
    "input_encoding": (lambda v: v is None or (isinstance(v, str) and v in ENCODINGS),
                       f"none or an input encoding ({', '.join(ENCODINGS)})"),
}


# --------------------------------------------------------------------------- weights into a model
def load_weights(model: nn.Module, state_dict, where: str, what: str,
                 fix: str = "the checkpoint is corrupt or its meta is wrong") -> None:
    """Copy ``state_dict`` into ``model`` (strictly: the same keys and shapes), refusing weights
    that are not all finite (NaN or inf weights would make the model vote for one class
    everywhere, and certify it). A mismatch is one line: ``where`` (e.g. "checkpoint c.pt"),
    ``what`` the model is (e.g. "a lenet model"), how many keys are missing or unexpected, the
    first shape that differs, and ``fix``."""
    bad = [k for k, v in state_dict.items() if not isinstance(k, str)
           or not isinstance(v, torch.Tensor)]
    if bad:
        raise SmoothcertError(f"{where}: weight {bad[0]!r} is not a tensor; {fix}")
    problems = _mismatch(model.state_dict(), state_dict)
    if problems:
        raise SmoothcertError(f"the weights in {where} do not fit {what} ({problems}); {fix}")
    check_finite(state_dict, where)
    try:
        model.load_state_dict(state_dict, strict=True)
    except RuntimeError as err:  # what the key and shape checks above do not foresee
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise SmoothcertError(f"the weights in {where} do not fit {what} ({first}); {fix}") \
            from err


def check_finite(tensors, where: str,
                 fix: str = "the model diverged or the file is corrupt, use another checkpoint"
                 ) -> None:
    """Refuse weights (a mapping of names to tensors) that are not all finite: NaN or inf
    weights make a model vote for one class everywhere, which smoothing then certifies. One
    line naming ``where``, the first such weight and ``fix``."""
    for key, value in tensors.items():
        if (value.is_floating_point() or value.is_complex()) and not bool(
                torch.isfinite(value).all()):
            raise SmoothcertError(f"{where}: weight {key} holds NaN or inf values; {fix}")


def _mismatch(expected: dict, given: dict) -> str:
    """What differs between a model's state dict and ``given``, in a few words ("" if nothing)."""
    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    shapes = [k for k in expected if k in given and given[k].shape != expected[k].shape]
    parts = [f"{len(keys)} {kind}: {_some(keys)}"
             for kind, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
    if shapes:
        k = shapes[0]
        more = f" and {len(shapes) - 1} more shapes differ" if len(shapes) > 1 else ""
        parts.append(f"{k} is {list(given[k].shape)} in the file but "
                     f"{list(expected[k].shape)} in the model{more}")
    return "; ".join(parts)


def _some(keys: list[str], n: int = 3) -> str:
    return ", ".join(keys[:n]) + (f" and {len(keys) - n} more" if len(keys) > n else "")


def model_from_checkpoint(path: str | os.PathLike, device="cpu") -> tuple[nn.Module, dict]:
    """The model saved at ``path`` on ``device``, in eval mode, and the checkpoint's meta.

    The model is built by its role (``meta["role"]``, "classifier" when absent): a classifier
    is ``Sequential(NormalizeLayer, net)``, behind its input encoding when the meta names one
    (``meta["input_encoding"]``, e.g. an ablation model's); a denoiser or a diffusion model is
    the bare module (:func:`smoothcert.models.build_model`). ``path`` may be a train run
    folder."""
    path = checkpoint_file(path)
    return model_from_loaded(load_checkpoint(path, map_location=device), path, device)


def model_from_loaded(ckpt: Checkpoint, where, device="cpu") -> tuple[nn.Module, dict]:
    """:func:`model_from_checkpoint` for a checkpoint already read (from ``where``)."""
    meta = ckpt.meta
    check_meta(meta, f"checkpoint {where}")
    _check_role(meta, where)
    model = build_model(meta["arch"], meta["num_classes"], meta["input_shape"], meta["mean"],
                        meta["std"], meta.get("arch_kwargs"), meta.get("input_encoding"))
    load_weights(model, ckpt.state_dict, f"checkpoint {where}", f"a {meta['arch']} model")
    return model.to(device).eval(), meta


def checkpoint_task(meta: dict) -> str:
    """The task of a checkpoint's model (:data:`~smoothcert.data.registry.TASKS`):
    ``meta["task"]``, "classification" when absent (every classifier, every checkpoint written
    before segmentation and regression)."""
    return meta.get("task", "classification")


def checkpoint_role(meta: dict) -> str:
    """The role of the model a checkpoint holds: ``meta["role"]``, "classifier" when absent
    (every checkpoint written before denoisers)."""
    return meta.get("role", "classifier")


def _check_role(meta: dict, path) -> None:
    role = checkpoint_role(meta)
    if role not in ROLES or role != model_role(meta["arch"]):
        raise SmoothcertError(
            f"checkpoint {path} says role {role!r} but arch {meta['arch']!r} is a "
            f"{model_role(meta['arch'])}; the checkpoint is corrupt or its meta is wrong")
    if role == "classifier" and checkpoint_task(meta) != model_task(meta["arch"]):
        raise SmoothcertError(
            f"checkpoint {path} says task {checkpoint_task(meta)!r} but arch {meta['arch']!r} "
            f"serves {model_task(meta['arch'])}; the checkpoint is corrupt or its meta is wrong")


def checkpoint_meta(
    *,
    arch: str,
    dataset: str,
    num_classes: int,
    input_shape,
    mean,
    std,
    noise: dict | None,
    method: dict,
    epoch: int,
    config: dict,
    arch_kwargs: dict | None = None,
    classes: list[str] | None = None,
    role: str = "classifier",
    input_encoding: str | None = None,
    task: str = "classification",
) -> dict:
    """A complete ``meta`` dict in plain types, with :func:`versions` filled in.

    ``arch_kwargs`` (a registered architecture's parameters or a torchvision/timm model's
    constructor arguments), ``classes`` (the class names, in label order, of an image-folder
    dataset), ``role`` (the model's role, :data:`smoothcert.models.archs.ROLES`, when it is
    not "classifier") and ``input_encoding`` (the model's first layer, e.g. "ablation", when it
    has one) and ``task`` (segmentation or regression) are stored only when given, so the
    meta of other checkpoints is unchanged.
    """
    extra = _optional_meta(arch_kwargs, classes, role, input_encoding, task)
    return {**extra,
        "arch": arch,
        "dataset": dataset,
        "num_classes": int(num_classes),
        "input_shape": [int(s) for s in input_shape],
        "mean": [float(m) for m in mean],
        "std": [float(s) for s in std],
        "noise": None if noise is None else dict(noise),  # None: trained without noise
        "method": dict(method),
        "epoch": int(epoch),
        "versions": versions(),
        "config": dict(config),
    }


def _optional_meta(arch_kwargs, classes, role: str, input_encoding, task: str) -> dict:
    """The meta fields stored only where they differ from a plain classifier's."""
    if role not in ROLES:
        raise SmoothcertError(f"unknown model role {role!r}; known: {', '.join(ROLES)}")
    extra = {"arch_kwargs": dict(arch_kwargs)} if arch_kwargs else {}
    if classes is not None:
        extra["classes"] = [str(c) for c in classes]
    if role != "classifier":
        extra["role"] = role
    if task != "classification":
        if task not in TASKS:
            raise SmoothcertError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
        extra["task"] = task
    if input_encoding is not None:
        if input_encoding not in ENCODINGS:
            raise SmoothcertError(f"unknown input encoding {input_encoding!r}; known: "
                                  f"{', '.join(ENCODINGS)}")
        extra["input_encoding"] = str(input_encoding)
    return extra
