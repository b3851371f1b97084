"""A denoising diffusion model (Ho et al. 2020, "Denoising Diffusion Probabilistic Models"): a
diffusers ``UNet2DModel`` and its ``DDPMScheduler``, kept together as one module.

diffusers is an optional dependency (``smoothcert[diffusion]``): nothing here imports it until a
model is built or saved, so ``import smoothcert`` never needs it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from ..errors import SmoothcertError, check_count

DIFFUSION_EXTRA = "pip install 'smoothcert[diffusion]'"
EXPORT_FOLDER = "diffusers"
"""The sub-folder of a ``train --method diffusion`` run folder that holds the model as a
diffusers pipeline (``--denoiser diffusers:RUN/diffusers``, or ``--denoiser RUN``)."""
EXPORT_MARKER = "smoothcert_export.json"
"""The file in an exported folder that names the checkpoint it was exported from
(``{"checkpoint_sha256": HEX}``); diffusers ignores it and :func:`~.diffusion.folder_sha256`
does not read it, so it changes no fingerprint."""

# Ho et al. 2020 §4: T = 1000 steps, β linear from 1e-4 to 0.02; their CIFAR-10 UNet has channel
# multipliers (1, 2, 2, 2) and self-attention at the 16×16 level, the second one. The UNet's
# remaining settings are those of google/ddpm-cifar10-32's config (the port of Ho et al.'s
# weights to diffusers): sinusoidal embedding with frequency shift 1 and no sin/cos flip,
# GroupNorm eps 1e-6, downsampling without padding, single-head attention.
BETA_START, BETA_END = 1e-4, 0.02
_CHANNEL_MULT = (1, 2, 2, 2, 2, 2)
_HO_UNET = {"flip_sin_to_cos": False, "freq_shift": 1, "norm_eps": 1e-6,
            "downsample_padding": 0, "attention_head_dim": None, "act_fn": "silu"}


def require_diffusers(what: str):
    """The ``diffusers`` module, or one SmoothcertError saying that ``what`` needs the extra."""
    try:
        import diffusers
    except ImportError as err:
        raise SmoothcertError(
            f"{what} needs diffusers, which is not installed; install it with {DIFFUSION_EXTRA} "
            f"(or pip install diffusers)") from err
    return diffusers


def _sample_shape(sample_size) -> tuple[int, int]:
    if isinstance(sample_size, (list, tuple)):
        return int(sample_size[0]), int(sample_size[1])
    return int(sample_size), int(sample_size)


class DiffusionModel(nn.Module):
    """A diffusers ``UNet2DModel`` (``.unet``) and ``DDPMScheduler`` (``.scheduler``).

    ``forward(x_t, t)`` is the UNet's output on noisy samples x_t (B, C, H, W) on the model's
    [−1, 1] scale at timesteps t (an int or a (B,) tensor, 0-based): ε̂ for the scheduler's
    ``prediction_type`` "epsilon" (with 2C channels when the UNet also predicts its variance).
    Attributes: ``input_shape`` (C, H, W), ``role`` "diffusion", ``alphas_cumprod`` (ᾱ_t, float64,
    on CPU). The state dict is the UNet's (``unet.*``); the scheduler is configuration only.
    """

    def __init__(self, unet: nn.Module, scheduler):
        super().__init__()
        self.unet, self.scheduler = unet, scheduler
        h, w = _sample_shape(unet.config.sample_size)
        self.input_shape = (int(unet.config.in_channels), h, w)
        self.role = "diffusion"

    @property
    def alphas_cumprod(self) -> torch.Tensor:
        return self.scheduler.alphas_cumprod.to(torch.float64)

    def forward(self, x_t: torch.Tensor, t) -> torch.Tensor:
        return self.unet(x_t, t).sample

    def save_pretrained(self, folder: str | os.PathLike, marker: dict | None = None) -> Path:
        """Write a diffusers ``DDPMPipeline`` folder: ``model_index.json``, ``unet/``
        (``config.json``, ``diffusion_pytorch_model.safetensors``) and ``scheduler/``
        (``scheduler_config.json``), and ``marker`` as :data:`EXPORT_MARKER` when given. It is
        written into a temporary sibling folder, then renamed into place, so ``folder`` is
        either the old one or the complete new one (its marker included). Its folders and files
        get the permissions of a plain ``mkdir`` and ``open`` (0o777 and 0o666 less the umask),
        not the private ones of a temporary folder. Returns it."""
        diffusers = require_diffusers("saving a diffusion model")
        folder = Path(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            pipeline = diffusers.DDPMPipeline(unet=self.unet, scheduler=self.scheduler)
            pipeline.save_pretrained(tmp, safe_serialization=True)
            if marker is not None:
                (tmp / EXPORT_MARKER).write_text(json.dumps(marker, sort_keys=True) + "\n")
            _follow_umask(tmp)
            _replace_folder(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return folder


def exported_from(folder: str | os.PathLike) -> str | None:
    """The checkpoint SHA-256 that the :data:`EXPORT_MARKER` of ``folder`` names; None when it
    has none or it cannot be read (a folder exported by hand, or before markers)."""
    try:
        marker = json.loads((Path(folder) / EXPORT_MARKER).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    sha = marker.get("checkpoint_sha256") if isinstance(marker, dict) else None
    return sha if isinstance(sha, str) else None


def _follow_umask(folder: Path) -> None:
    """Give ``folder`` and everything in it the permissions a plain ``mkdir``/``open`` would:
    ``tempfile.mkdtemp`` makes it 0o700 and safetensors writes its file 0o600, which would make
    an export private on a shared machine whatever the user's umask says."""
    mask = os.umask(0o022)  # reading the umask means setting it: put it back at once
    os.umask(mask)
    for path in (folder, *folder.rglob("*")):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def _replace_folder(new: Path, folder: Path) -> None:
    """Rename ``new`` to ``folder``; an existing ``folder`` is moved aside first and removed
    after, so a crash leaves one complete folder (possibly under the aside name)."""
    old = None
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        folder.rename(old)
    new.rename(folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def default_levels(input_shape: tuple[int, int, int]) -> int:
    """Resolution levels of ``ddpm_unet`` when not given: 3 up to 32 pixels a side (two
    downsamplings: 32 → 8, 28 → 7), 4 above, fewer while a side would not halve evenly."""
    side = min(input_shape[1:])
    levels = 3 if side <= 32 else 4
    while levels > 1 and not _fits(input_shape, levels):
        levels -= 1
    return levels


def _fits(input_shape, levels: int) -> bool:
    factor = 2 ** (levels - 1)
    return all(s % factor == 0 and s // factor >= 2 for s in input_shape[1:])


def build_ddpm(input_shape: tuple[int, int, int], *, width: int = 64, levels: int | None = None,
               layers_per_block: int = 2, timesteps: int = 1000) -> DiffusionModel:
    """A fresh ε-prediction DDPM for images of ``input_shape`` (C, H, W): a UNet with
    ``levels`` resolution levels of width·(1, 2, 2, ...) channels and ``layers_per_block``
    residual blocks each, self-attention at the second level (Ho et al.'s 16×16 on CIFAR-10), and
    a linear-β ``DDPMScheduler`` of ``timesteps`` steps (Ho et al.: 1000, β 1e-4 … 0.02)."""
    diffusers = require_diffusers("--arch ddpm_unet")
    c, h, w = input_shape
    levels = default_levels(input_shape) if levels is None else \
        check_count("levels", levels, maximum=len(_CHANNEL_MULT))
    if not _fits(input_shape, levels):
        raise SmoothcertError(
            f"ddpm_unet with {levels} levels halves {h}×{w} inputs {levels - 1} times, which "
            f"needs sides divisible by {2 ** (levels - 1)}; pass --arch-param levels=N with a "
            f"smaller N")
    channels = tuple(width * m for m in _CHANNEL_MULT[:levels])
    down = tuple("AttnDownBlock2D" if i == 1 else "DownBlock2D" for i in range(levels))
    up = tuple("AttnUpBlock2D" if b.startswith("Attn") else "UpBlock2D" for b in reversed(down))
    unet = diffusers.UNet2DModel(
        sample_size=h if h == w else (h, w), in_channels=c, out_channels=c,
        down_block_types=down, up_block_types=up, block_out_channels=channels,
        layers_per_block=layers_per_block, norm_num_groups=math.gcd(32, width), **_HO_UNET)
    scheduler = diffusers.DDPMScheduler(
        num_train_timesteps=timesteps, beta_start=BETA_START, beta_end=BETA_END,
        beta_schedule="linear", variance_type="fixed_small", clip_sample=True,
        prediction_type="epsilon")
    return DiffusionModel(unet, scheduler)
