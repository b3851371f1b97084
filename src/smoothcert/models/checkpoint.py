"""Checkpoints are data, not code: a dict of plain Python values and tensors.

A smoothcert checkpoint is a ``torch.save`` of::

    {"format": "smoothcert-checkpoint", "format_version": 2,
     "meta": {...}, "state_dict": {...}, "train_state": {...} | None}

``meta`` says how to rebuild and interpret the model (arch, dataset, num_classes, input_shape,
mean, std, noise, method, epoch, versions, config); ``train_state`` holds whatever the trainer
needs to resume (optimizer, scheduler, RNG states). Loading uses ``torch.load(weights_only=True)``,
so a checkpoint can never run code. Writing is atomic: a crash leaves the old file or the new one.
A checkpoint of an older format version (and the training config in its meta) is upgraded in
memory on loading (:func:`smoothcert.upgrade.upgrade_checkpoint`); the file is not changed.
"""

from __future__ import annotations

import os
import platform
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import SmoothcertError
from ..io import atomic_write
from ..upgrade import CHECKPOINT_VERSION, VERSION_KEY, upgrade_checkpoint
from .archs import ROLES, build_model, model_role

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
        torch.save(payload, f)
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


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> Checkpoint:
    """Read a smoothcert checkpoint with weights-only unpickling; tensors go to ``map_location``.
    One of an older format version comes back in the current format."""
    path = Path(path)
    if not path.is_file():
        raise SmoothcertError(f"checkpoint {path} does not exist; check the path")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        raise SmoothcertError(
            f"checkpoint {path} cannot be read as a weights-only PyTorch file "
            f"({type(err).__name__}); it is truncated, corrupt or not a checkpoint, save it again"
        ) from err
    _check_format(obj, path)
    obj = upgrade_checkpoint(obj, f"checkpoint {path}")
    return Checkpoint(obj["meta"], obj["state_dict"], obj.get("train_state"))


def _check_format(obj, path: Path) -> None:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        keys = ", ".join(sorted(map(str, obj))) if isinstance(obj, dict) else type(obj).__name__
        raise SmoothcertError(
            f"{path} is not a smoothcert checkpoint (it holds {keys}); reference checkpoints "
            f"(e.g. Cohen et al.'s .pth.tar) must first be converted with the import command"
        )
    if not isinstance(obj.get("meta"), dict) or not isinstance(obj.get("state_dict"), dict):
        raise SmoothcertError(f"{path} lacks its meta or state_dict; the checkpoint is corrupt")


def model_from_checkpoint(path: str | os.PathLike, device="cpu") -> tuple[nn.Module, dict]:
    """The model saved at ``path`` on ``device``, in eval mode, and the checkpoint's meta.

    The model is built by its role (``meta["role"]``, "classifier" when absent): a classifier
    is ``Sequential(NormalizeLayer, net)``; a denoiser or a diffusion model is the bare module
    (:func:`smoothcert.models.build_model`)."""
    return model_from_loaded(load_checkpoint(path, map_location=device), path, device)


def model_from_loaded(ckpt: Checkpoint, where, device="cpu") -> tuple[nn.Module, dict]:
    """:func:`model_from_checkpoint` for a checkpoint already read (from ``where``)."""
    meta = ckpt.meta
    missing = [k for k in ("arch", "num_classes", "input_shape", "mean", "std") if k not in meta]
    if missing:
        raise SmoothcertError(f"checkpoint {where} meta lacks {', '.join(missing)}; it is corrupt")
    _check_role(meta, where)
    model = build_model(meta["arch"], meta["num_classes"], meta["input_shape"], meta["mean"],
                        meta["std"], meta.get("arch_kwargs"))
    try:
        model.load_state_dict(ckpt.state_dict, strict=True)
    except RuntimeError as err:
        raise SmoothcertError(
            f"checkpoint {where} weights do not fit a {meta['arch']} model ({err}); "
            f"the checkpoint is corrupt or its meta is wrong"
        ) from err
    return model.to(device).eval(), meta


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
) -> dict:
    """A complete ``meta`` dict in plain types, with :func:`versions` filled in.

    ``arch_kwargs`` (a registered architecture's parameters or a torchvision/timm model's
    constructor arguments), ``classes`` (the class names, in label order, of an image-folder
    dataset) and ``role`` (the model's role, :data:`smoothcert.models.archs.ROLES`, when it is
    not "classifier") are stored only when given, so the meta of other checkpoints is unchanged.
    """
    if role not in ROLES:
        raise SmoothcertError(f"unknown model role {role!r}; known: {', '.join(ROLES)}")
    extra = {"arch_kwargs": dict(arch_kwargs)} if arch_kwargs else {}
    if classes is not None:
        extra["classes"] = [str(c) for c in classes]
    if role != "classifier":
        extra["role"] = role
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
