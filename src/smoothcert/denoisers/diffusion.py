"""One-shot diffusion denoising (Carlini et al., ICLR 2023, "(Certified!!) Adversarial Robustness
for Free!"): one call of an off-the-shelf diffusion model's UNet turns a noisy image into an
estimate of the clean one, at the timestep whose noise level matches σ.

Pixels x + δ, δ ~ N(0, σ²I), in [0, 1] are 2(x + δ) − 1 = (2x − 1) + 2δ on the model's [−1, 1]
scale: noise of standard deviation 2σ. The forward process at step t is
x_t = √ᾱ_t·x₀ + √(1 − ᾱ_t)·ε, i.e. x_t/√ᾱ_t = x₀ + √((1 − ᾱ_t)/ᾱ_t)·ε; so the noisy image scaled by
√ᾱ_t* is a sample of step t* when (1 − ᾱ_t*)/ᾱ_t* = 4σ².
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import SmoothcertError, check_positive_finite
from .ddpm import require_diffusers

PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")
UNET_WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")


def one_shot_timestep(alphas_cumprod, sigma: float) -> int:
    """t* = argmin_t |(1 − ᾱ_t)/ᾱ_t − 4σ²|, a 0-based index into ``alphas_cumprod`` (ᾱ, float64
    arithmetic), for pixel noise σ on [0, 1] (2σ on the model's [−1, 1]); the first on a tie.

    Carlini et al.'s code (``cifar10/certify.py``) takes the first t ≥ 1 with
    √(1 − ᾱ_t)/√ᾱ_t ≥ 2σ instead, which is t* or the step after it."""
    sigma = check_positive_finite("sigma", sigma)
    a = torch.as_tensor(alphas_cumprod, dtype=torch.float64).detach().cpu().flatten()
    if a.numel() == 0 or not bool(((a > 0) & (a <= 1)).all()):
        raise SmoothcertError("alphas_cumprod must be a non-empty sequence of values in (0, 1]")
    return int(torch.argmin(((1 - a) / a - 4 * sigma**2).abs()))


class DiffusionDenoiser(nn.Module):
    """Noisy pixels (B, C, H, W) in [0, 1] → denoised pixels in [0, 1], in one UNet call.

    With ᾱ = ᾱ_t* (:func:`one_shot_timestep` for ``sigma``): x_t = √ᾱ·(2x − 1); o = unet(x_t, t*);
    when o has 2C channels (a model that also predicts its variance) only the first C are used;
    x̂₀ = (x_t − √(1 − ᾱ)·ε̂)/√ᾱ for the scheduler's ``prediction_type`` "epsilon" (ε̂ = o),
    √ᾱ·x_t − √(1 − ᾱ)·v̂ for "v_prediction" (v̂ = o), o itself for "sample"; then x̂₀ is clamped to
    [−1, 1] and mapped back to (x̂₀ + 1)/2. Carlini et al. do the same with x the noisy input.

    ``unet``: a diffusers ``UNet2DModel`` (or any module ``unet(x_t, t)`` returning a tensor or an
    object with ``.sample``); ``scheduler``: anything with ``alphas_cumprod`` and
    ``config.prediction_type`` (a diffusers ``DDPMScheduler``). Attributes: ``timestep`` (t*),
    ``sigma``, ``prediction_type``, ``input_shape`` ((C, H, W) from the UNet's config, else None).
    """

    def __init__(self, unet: nn.Module, scheduler, sigma: float):
        super().__init__()
        self.unet, self.scheduler = unet, scheduler
        self.sigma = check_positive_finite("sigma", sigma)
        self.prediction_type = _prediction_type(scheduler)
        alphas = torch.as_tensor(scheduler.alphas_cumprod, dtype=torch.float64)
        self.timestep = one_shot_timestep(alphas, self.sigma)
        alpha = float(alphas[self.timestep])
        self.sqrt_alpha, self.sqrt_one_minus_alpha = math.sqrt(alpha), math.sqrt(1.0 - alpha)
        self.input_shape = _unet_input_shape(unet)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_t = self.sqrt_alpha * (2 * x - 1)
        t = torch.full((x.shape[0],), self.timestep, dtype=torch.long, device=x.device)
        out = self.unet(x_t, t)
        out = _first_channels(getattr(out, "sample", out), x.shape[1])
        if self.prediction_type == "epsilon":
            x0 = (x_t - self.sqrt_one_minus_alpha * out) / self.sqrt_alpha
        elif self.prediction_type == "v_prediction":
            x0 = self.sqrt_alpha * x_t - self.sqrt_one_minus_alpha * out
        else:
            x0 = out
        return (x0.clamp(-1, 1) + 1) / 2

    def with_sigma(self, sigma: float) -> DiffusionDenoiser:
        """The same UNet and scheduler (shared, not copied) denoising noise level ``sigma``."""
        return DiffusionDenoiser(self.unet, self.scheduler, sigma)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, sigma: float,
                        device=None) -> DiffusionDenoiser:
        """The denoiser of the local diffusers folder ``path``, in eval mode on ``device``.

        Two layouts: (a) a pipeline (``model_index.json``, ``unet/`` with ``config.json`` and
        ``diffusion_pytorch_model.{safetensors,bin}``, ``scheduler/scheduler_config.json``), as
        ``DiffusionModel.save_pretrained`` and ``DDPMPipeline.save_pretrained`` write it; (b)
        flat, as google/ddpm-cifar10-32: ``config.json``, the weights and
        ``scheduler_config.json`` at the top. Nothing is downloaded. A missing folder, UNet or
        scheduler, or diffusers not installed, raise one SmoothcertError."""
        layout = pretrained_layout(path)
        diffusers = require_diffusers("--denoiser diffusers:FOLDER")
        try:
            unet = diffusers.UNet2DModel.from_pretrained(
                layout.unet_dir, local_files_only=True, low_cpu_mem_usage=False,
                use_safetensors=layout.weights.name.endswith(".safetensors"))
            scheduler = diffusers.DDPMScheduler.from_pretrained(
                layout.scheduler_dir, local_files_only=True)
        except (OSError, ValueError, RuntimeError, TypeError, KeyError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise SmoothcertError(f"diffusers folder {path} cannot be loaded ({first}); check "
                                  f"that it holds a UNet2DModel and a DDPM scheduler") from err
        denoiser = cls(unet, scheduler, sigma).eval()
        return denoiser.to(device) if device is not None else denoiser


def _prediction_type(scheduler) -> str:
    config = getattr(scheduler, "config", None)
    kind = getattr(config, "prediction_type", None) or "epsilon"
    if kind not in PREDICTION_TYPES:
        raise SmoothcertError(f"the scheduler's prediction_type {kind!r} is not one of "
                              f"{', '.join(PREDICTION_TYPES)}")
    return kind


def _unet_input_shape(unet) -> tuple[int, int, int] | None:
    config = getattr(unet, "config", None)
    size, channels = getattr(config, "sample_size", None), getattr(config, "in_channels", None)
    if size is None or channels is None:
        return None
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    return int(channels), int(h), int(w)


def _first_channels(out: torch.Tensor, channels: int) -> torch.Tensor:
    if out.shape[1] == 2 * channels:  # learned variance: [ε̂ (or v̂, x̂₀), variance]
        return out[:, :channels]
    if out.shape[1] != channels:
        raise SmoothcertError(f"the UNet returns {out.shape[1]} channels for {channels}-channel "
                              f"inputs; it must return {channels} (or {2 * channels} with a "
                              "learned variance)")
    return out


# ---------------------------------------------------------------------------------------------
# Local diffusers folders: where the UNet and the scheduler are, and their fingerprint.


@dataclass(frozen=True)
class PretrainedLayout:
    """The files of a diffusers folder that :meth:`DiffusionDenoiser.from_pretrained` reads."""

    folder: Path
    unet_dir: Path
    scheduler_dir: Path
    weights: Path  # the UNet weights file loaded (.safetensors preferred, as diffusers does)
    files: tuple[Path, ...]  # every file read, sorted (configs and weights)


def pretrained_layout(path: str | os.PathLike) -> PretrainedLayout:
    """The layout of the diffusers folder ``path`` (see
    :meth:`DiffusionDenoiser.from_pretrained`), or one SmoothcertError saying what is missing."""
    folder = Path(path)
    if not folder.is_dir():
        raise SmoothcertError(f"diffusers folder {folder} does not exist; check the path "
                              "(diffusers:FOLDER names a local folder, nothing is downloaded)")
    pipeline = (folder / "unet").is_dir()
    unet_dir = folder / "unet" if pipeline else folder
    scheduler_dir = folder / "scheduler" if pipeline else folder
    weights = next((unet_dir / n for n in UNET_WEIGHTS if (unet_dir / n).is_file()), None)
    if weights is None or not (unet_dir / "config.json").is_file():
        raise SmoothcertError(
            f"{folder} holds no UNet: expected unet/config.json and "
            f"unet/{UNET_WEIGHTS[0]} (or .bin), or config.json and the weights at the top, as "
            "google/ddpm-cifar10-32")
    if not (scheduler_dir / "scheduler_config.json").is_file():
        where = "scheduler/scheduler_config.json" if pipeline else "scheduler_config.json"
        raise SmoothcertError(f"{folder} holds no scheduler: expected {where}")
    # model_index.json is not read: the UNet and the scheduler are loaded on their own.
    files = [unet_dir / "config.json", weights, scheduler_dir / "scheduler_config.json"]
    return PretrainedLayout(folder, unet_dir, scheduler_dir, weights,
                            tuple(sorted(files, key=lambda p: p.relative_to(folder).as_posix())))


def folder_sha256(folder: str | os.PathLike) -> str:
    """``"folder:<hex>"``: SHA-256 over the relative path, size and bytes of each file the
    loader reads (configs and UNet weights, sorted by path). Renaming or moving the folder keeps
    it; changing a weight or a config changes it."""
    layout = pretrained_layout(folder)
    digest = hashlib.sha256()
    for path in layout.files:
        digest.update(f"{path.relative_to(layout.folder).as_posix()}|{path.stat().st_size}|"
                      .encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return f"folder:{digest.hexdigest()}"
