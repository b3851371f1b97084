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
from ..models.checkpoint import checkpoint_role, load_checkpoint, model_from_loaded
from .ddpm import DiffusionModel
from .diffusion import DiffusionDenoiser, folder_sha256

DIFFUSERS_PREFIX = "diffusers:"


@dataclass(frozen=True)
class DenoiserSource:
    """A denoiser ready to go in front of a classifier.

    ``module``: pixels (B, C, H, W) in [0, 1] → denoised pixels, in eval mode; ``sha256``: its
    fingerprint (a checkpoint file's SHA-256, ``folder:<hex>`` of a diffusers folder's files,
    ``state_dict:<hex>`` of a module's tensors); ``label``: what the manifest names; ``timestep``:
    t* of a diffusion denoiser, else None; ``input_shape``: (C, H, W) when the denoiser states it.
    """

    module: nn.Module
    sha256: str
    label: str
    timestep: int | None
    input_shape: tuple[int, int, int] | None


def load_denoiser(spec, sigma: float, device=None) -> DenoiserSource:
    """The denoiser ``spec`` for pixel noise level ``sigma``, in eval mode, moved to ``device``
    when one is given (checkpoints and folders load on CPU otherwise).

    ``spec``: ``"diffusers:FOLDER"`` (:meth:`DiffusionDenoiser.from_pretrained`), the path of a
    smoothcert checkpoint of role "denoiser" (e.g. ``--arch dncnn``) or "diffusion" (a
    ``train --method diffusion`` checkpoint, denoised in one shot), or an ``nn.Module`` (taken
    as it is; its ``timestep`` attribute, if any, is reported). A missing file or folder, a
    classifier checkpoint and anything else raise one SmoothcertError.
    """
    sigma = check_positive_finite("sigma", sigma)
    if isinstance(spec, nn.Module):
        module, sha, label = spec, state_dict_sha256(spec), f"<{type(spec).__name__} module>"
        if isinstance(spec, DiffusionModel):
            module = DiffusionDenoiser(spec.unet, spec.scheduler, sigma)
    elif isinstance(spec, (str, os.PathLike)) and os.fspath(spec).startswith(DIFFUSERS_PREFIX):
        folder = os.fspath(spec)[len(DIFFUSERS_PREFIX):]
        if not folder:
            raise SmoothcertError("diffusers: needs a folder, e.g. diffusers:models/ddpm-cifar10")
        module = DiffusionDenoiser.from_pretrained(folder, sigma)
        sha, label = folder_sha256(folder), os.fspath(spec)
    elif isinstance(spec, (str, os.PathLike)):
        module, sha, label = _from_checkpoint(Path(spec), sigma), file_sha256(spec), str(spec)
    else:
        raise SmoothcertError("a denoiser is a smoothcert checkpoint path, diffusers:FOLDER or a "
                              f"torch nn.Module, got {type(spec).__name__}")
    module = (module.to(device) if device is not None else module).eval()
    shape = getattr(module, "input_shape", None)
    return DenoiserSource(module, sha, label, getattr(module, "timestep", None),
                          tuple(int(s) for s in shape) if shape is not None else None)


def _from_checkpoint(path: Path, sigma: float) -> nn.Module:
    """The denoiser of a smoothcert checkpoint; a diffusion model denoises in one shot."""
    if not path.is_file():
        hint = " (a diffusers folder is named diffusers:FOLDER)" if path.is_dir() else ""
        raise SmoothcertError(f"denoiser checkpoint {path} does not exist; check the path{hint}")
    ckpt = load_checkpoint(path)
    role = checkpoint_role(ckpt.meta)
    if role == "classifier":
        raise SmoothcertError(
            f"{path} is a classifier checkpoint, not a denoiser; pass a denoiser (train --arch "
            "dncnn --method denoiser-mse, or diffusers:FOLDER) and give the classifier as the "
            "model")
    model, _ = model_from_loaded(ckpt, path)
    if role == "diffusion":
        return DiffusionDenoiser(model.unet, model.scheduler, sigma)
    return model


def state_dict_sha256(model: nn.Module) -> str:
    """``state_dict:<hex>``: SHA-256 over a module's parameter and buffer names, dtypes, shapes
    and bytes (the fingerprint runs give a classifier module)."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return f"state_dict:{digest.hexdigest()}"
