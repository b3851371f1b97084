"""A denoiser from what a user names: a smoothcert checkpoint, a local diffusers folder or a module,
with the fingerprint that goes into the run identity."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import SmoothcertError, check_positive_finite
from ..io import file_sha256
from ..models.checkpoint import (
    RUN_CHECKPOINT,
    checkpoint_file,
    checkpoint_role,
    load_checkpoint,
    model_from_loaded,
)
from .ddpm import EXPORT_FOLDER, DiffusionModel, exported_from
from .diffusion import DiffusionDenoiser, folder_sha256, pretrained_layout

DIFFUSERS_PREFIX = "diffusers:"


@dataclass(frozen=True)
class DenoiserSource:
    """A denoiser ready to go in front of a classifier.

    ``module``: pixels (B, C, H, W) in [0, 1] → denoised pixels, in eval mode; ``sha256``: its
    fingerprint (a checkpoint file's SHA-256, ``folder:<hex>`` of a diffusers folder's files,
    ``state_dict:<hex>`` of a module's tensors); ``label``: what the manifest names; ``timestep``:
    t* of a diffusion denoiser, else None; ``input_shape``: (C, H, W) when the denoiser states it;
    ``trained_noise``: the noise it was trained to remove, as a checkpoint's meta ``noise``
    (``{"name", "sigma"}``; a diffusion model ``{"name": "gaussian"}``: every σ), None when
    unknown (a module).
    """

    module: nn.Module
    sha256: str
    label: str
    timestep: int | None
    input_shape: tuple[int, int, int] | None
    trained_noise: dict | None = None


def load_denoiser(spec, sigma: float, device=None) -> DenoiserSource:
    """The denoiser ``spec`` for pixel noise level ``sigma``, in eval mode, moved to ``device``
    when one is given (checkpoints and folders load on CPU otherwise).

    ``spec``: ``"diffusers:FOLDER"`` (:meth:`DiffusionDenoiser.from_pretrained`), the path of a
    smoothcert checkpoint of role "denoiser" (e.g. ``--arch dncnn``) or "diffusion" (a
    ``train --method diffusion`` checkpoint, denoised in one shot), a train run folder (its
    ``checkpoint.pt``; a diffusion run's ``diffusers/`` folder when it has one, as
    ``diffusers:RUN/diffusers``), or an ``nn.Module`` (taken as it is; its ``timestep``
    attribute, if any, is reported). A missing file or folder, a classifier checkpoint, a run's
    ``diffusers/`` folder exported from another checkpoint than the one beside it (an export
    that failed, e.g. on a full disk) and anything else raise one SmoothcertError.
    """
    sigma = check_positive_finite("sigma", sigma)
    if isinstance(spec, (str, os.PathLike)) and not os.fspath(spec).startswith(
            DIFFUSERS_PREFIX) and Path(spec).is_dir():
        spec = _run_folder_spec(Path(spec))
    if isinstance(spec, nn.Module):
        module, sha, label = spec, state_dict_sha256(spec), f"<{type(spec).__name__} module>"
        if isinstance(spec, DiffusionModel):
            module = DiffusionDenoiser(spec.unet, spec.scheduler, sigma)
        trained = _GAUSSIAN if isinstance(module, DiffusionDenoiser) else None
    elif isinstance(spec, (str, os.PathLike)) and os.fspath(spec).startswith(DIFFUSERS_PREFIX):
        module, sha, label = _from_folder(os.fspath(spec)[len(DIFFUSERS_PREFIX):], sigma)
        trained = _GAUSSIAN
    elif isinstance(spec, (str, os.PathLike)):
        module, trained = _from_checkpoint(Path(spec), sigma)
        sha, label = file_sha256(spec), str(spec)
    else:
        raise SmoothcertError("a denoiser is a smoothcert checkpoint path, diffusers:FOLDER or a "
                              f"torch nn.Module, got {type(spec).__name__}")
    module = (module.to(device) if device is not None else module).eval()
    shape = getattr(module, "input_shape", None)
    return DenoiserSource(module, sha, label, getattr(module, "timestep", None),
                          tuple(int(s) for s in shape) if shape is not None else None, trained)


# A diffusion model is trained on the Gaussian forward process at every noise level.
_GAUSSIAN = {"name": "gaussian"}


def _run_folder_spec(folder: Path) -> str:
    """What a folder given as the denoiser stands for: a diffusion run's ``diffusers/``
    (``diffusers:RUN/diffusers``, so both spellings have one fingerprint), else its
    ``checkpoint.pt``. A diffusers folder itself must be named ``diffusers:FOLDER``."""
    if (folder / RUN_CHECKPOINT).is_file() and (folder / EXPORT_FOLDER).is_dir():
        return f"{DIFFUSERS_PREFIX}{folder / EXPORT_FOLDER}"
    if not (folder / RUN_CHECKPOINT).is_file() and _is_diffusers_folder(folder):
        raise SmoothcertError(f"{folder} is a diffusers folder; name it --denoiser "
                              f"diffusers:{folder} (Python: denoiser=\"diffusers:{folder}\")")
    return str(checkpoint_file(folder))  # a folder without a checkpoint: one line saying so


def _is_diffusers_folder(folder: Path) -> bool:
    try:
        pretrained_layout(folder)
    except SmoothcertError:
        return False
    return True


def _from_folder(folder: str, sigma: float) -> tuple[nn.Module, str, str]:
    """The one-shot denoiser of the diffusers folder ``folder``, its fingerprint and label."""
    if not folder:
        raise SmoothcertError("diffusers: needs a folder, e.g. diffusers:models/ddpm-cifar10")
    _check_export_current(Path(folder))
    module = DiffusionDenoiser.from_pretrained(folder, sigma)
    return module, folder_sha256(folder), f"{DIFFUSERS_PREFIX}{folder}"


def _check_export_current(folder: Path) -> None:
    """A folder a train run exported (it names its checkpoint's SHA-256) must come from the
    checkpoint beside it: an export that failed after its checkpoint (a full disk) leaves the
    folder an epoch behind, and the two would certify differently."""
    exported = exported_from(folder)
    checkpoint = folder.parent / RUN_CHECKPOINT
    if exported is None or not checkpoint.is_file() or exported == file_sha256(checkpoint):
        return
    raise SmoothcertError(
        f"{folder} was exported from an older checkpoint than {checkpoint} (its export failed, "
        f"e.g. on a full disk); rerun the train command with --resume to export it again, or "
        f"pass --denoiser {checkpoint}")


def _from_checkpoint(path: Path, sigma: float) -> tuple[nn.Module, dict | None]:
    """The denoiser of a smoothcert checkpoint (a diffusion model denoises in one shot) and the
    noise it was trained on."""
    if not path.is_file():
        raise SmoothcertError(f"denoiser checkpoint {path} does not exist; check the path")
    ckpt = load_checkpoint(path)
    role = checkpoint_role(ckpt.meta)
    if role == "classifier":
        raise SmoothcertError(
            f"{path} is a classifier checkpoint, not a denoiser; pass a denoiser (train --arch "
            "dncnn --method denoiser-mse, or diffusers:FOLDER) and give the classifier as the "
            "model")
    model, _ = model_from_loaded(ckpt, path)
    if role == "diffusion":
        return DiffusionDenoiser(model.unet, model.scheduler, sigma), _GAUSSIAN
    return model, ckpt.meta.get("noise")


def state_dict_sha256(model: nn.Module) -> str:
    """``state_dict:<hex>``: SHA-256 over a module's parameter and buffer names, dtypes, shapes
    and bytes (the fingerprint runs give a classifier module)."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return f"state_dict:{digest.hexdigest()}"
