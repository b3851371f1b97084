"""One-shot diffusion denoising (Carlini et al., ICLR 2023, "(Certified!!) Adversarial Robustness
for Free!"): one call of an off-the-shelf diffusion model's UNet turns a noisy image into an
estimate of the clean one, at the timestep whose noise level matches σ.

Pixels x + δ, δ ~ N(0, σ²I), in [0, 1] are 2(x + δ) − 1 = (2x − 1) + 2δ on the model's [−1, 1]
scale: noise of standard deviation 2σ. The forward process at step t is
x_t = √ᾱ_t·x₀ + √(1 − ᾱ_t)·ε, i.e. x_t/√ᾱ_t = x₀ + √((1 − ᾱ_t)/ᾱ_t)·ε; so the noisy image scaled by
√ᾱ_t* is a sample of step t* when (1 − ᾱ_t*)/ᾱ_t* = 4σ².
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import SmoothcertError, check_positive_finite
from ..models.checkpoint import check_finite
from .ddpm import require_diffusers
from .openai_unet import saved_timestep_scale

PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")
UNET_WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")


def one_shot_timestep(alphas_cumprod, sigma: float) -> int:
    """t* = argmin_t |(1 − ᾱ_t)/ᾱ_t − 4σ²|, a 0-based index into ``alphas_cumprod`` (ᾱ, float64
    arithmetic), for pixel noise σ on [0, 1] (2σ on the model's [−1, 1]); the first on a tie.

    Carlini et al.'s code (``cifar10/certify.py``) takes the first t ≥ 1 with
    √(1 − ᾱ_t)/√ᾱ_t ≥ 2σ instead, which is t* or the step after it.

    A schedule whose noise never reaches 2σ (its largest (1 − ᾱ_t)/ᾱ_t is below 4σ², up to a
    relative 1e-9 of rounding) is refused: t* would be its last step whatever σ, and the UNet
    would remove less noise than there is (T = 10 steps, or β = 0, the identity)."""
    sigma = check_positive_finite("sigma", sigma)
    a = torch.as_tensor(alphas_cumprod, dtype=torch.float64).detach().cpu().flatten()
    if a.numel() == 0 or not bool(((a > 0) & (a <= 1)).all()):
        raise SmoothcertError("alphas_cumprod must be a non-empty sequence of values in (0, 1]")
    levels = (1 - a) / a  # the noise variance of each step on the [−1, 1] scale
    top = float(levels.max())
    if top < 4 * sigma**2 * (1 - 1e-9):
        reach = math.sqrt(top) / 2
        raise SmoothcertError(
            f"the diffusion schedule's noise reaches pixel sigma {reach:.3g} at most (std "
            f"{2 * reach:.3g} on [-1, 1] after {a.numel()} steps), short of sigma {sigma}; use "
            f"a schedule with more steps or larger betas (Ho et al.: 1000 steps, beta up to "
            f"0.02) or a sigma of at most {reach:.3g}")
    return int(torch.argmin((levels - 4 * sigma**2).abs()))


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
    ``timestep_scale``: the UNet is called at t*·timestep_scale (a float tensor) when it is not 1
    (improved-diffusion's ``rescale_timesteps``: 1000/T; see :mod:`.openai_unet`).
    """

    def __init__(self, unet: nn.Module, scheduler, sigma: float, timestep_scale: float = 1.0):
        super().__init__()
        self.unet, self.scheduler = unet, scheduler
        self.timestep_scale = check_positive_finite("timestep_scale", timestep_scale)
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
        if self.timestep_scale != 1.0:  # improved-diffusion's _scale_timesteps, same arithmetic
            t = t.float() * self.timestep_scale
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
        return DiffusionDenoiser(self.unet, self.scheduler, sigma, self.timestep_scale)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, sigma: float,
                        device=None) -> DiffusionDenoiser:
        """The denoiser of the local diffusers folder ``path``, in eval mode on ``device``.

        Two layouts: (a) a pipeline (``model_index.json``, ``unet/`` with ``config.json`` and
        ``diffusion_pytorch_model.{safetensors,bin}``, ``scheduler/scheduler_config.json``), as
        ``DiffusionModel.save_pretrained`` and ``DDPMPipeline.save_pretrained`` write it; (b)
        flat, as google/ddpm-cifar10-32: ``config.json``, the weights and
        ``scheduler_config.json`` at the top. Nothing is downloaded. A missing folder, UNet or
        scheduler, or diffusers not installed, raise one SmoothcertError.

        The UNet is loaded strictly, as a checkpoint is: a config that is not a JSON object,
        weights missing a key of the UNet its config describes or holding one it does not
        have (diffusers would leave the missing ones uninitialised, behind a warning), or
        weights that are not all finite are refused in one line naming the file and the keys.
        Nothing diffusers or torch would print while loading is shown."""
        layout = pretrained_layout(path)
        diffusers = require_diffusers("--denoiser diffusers:FOLDER")
        for config in (layout.unet_dir / "config.json",
                       layout.scheduler_dir / "scheduler_config.json"):
            _check_config(config)
        with _quiet(diffusers):
            unet, scheduler = _load_parts(diffusers, layout, f"diffusers folder {path}")
        scale = saved_timestep_scale(layout.scheduler_dir)
        denoiser = cls(unet, scheduler, sigma, scale).eval()
        return denoiser.to(device) if device is not None else denoiser


def _check_config(path: Path) -> None:
    """A diffusers config file must hold a JSON object (diffusers takes any other value for
    the name of a model on the Hugging Face hub, and tries to reach it)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise SmoothcertError(f"{path} is not a diffusers config (it is not valid JSON: "
                              f"{_first_line(err)}); export or download the folder again") \
            from None
    if not isinstance(value, dict):
        kind = {list: "a JSON list", str: "a JSON string", bool: "a JSON boolean",
                type(None): "JSON null"}.get(type(value), "a JSON number")
        raise SmoothcertError(f"{path} is not a diffusers config (it holds {kind}, not an "
                              "object of settings); export or download the folder again")


@contextlib.contextmanager
def _quiet(diffusers):
    """Neither diffusers' log lines nor Python warnings (torch's, diffusers' deprecations) are
    shown while a folder loads: what they would report is checked here and refused in one
    line, so a refusal is never preceded by other lines."""
    logs = diffusers.utils.logging
    level = logs.get_verbosity()
    logs.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logs.set_verbosity(level)


def _load_parts(diffusers, layout: PretrainedLayout, where: str):
    """The UNet (strictly loaded, finite) and the DDPM scheduler of ``layout``."""
    try:
        unet, info = diffusers.UNet2DModel.from_pretrained(
            layout.unet_dir, local_files_only=True, low_cpu_mem_usage=False,
            use_safetensors=layout.weights.name.endswith(".safetensors"),
            output_loading_info=True)
        scheduler = diffusers.DDPMScheduler.from_pretrained(
            layout.scheduler_dir, local_files_only=True)
    except (OSError, ValueError, RuntimeError, TypeError, KeyError) as err:
        raise SmoothcertError(f"{where} cannot be loaded ({_first_line(err)}); check that it "
                              "holds a UNet2DModel and a DDPM scheduler") from err
    weights = layout.weights.relative_to(layout.folder).as_posix()
    problems = [f"{len(keys)} {kind}: {_some(sorted(keys))}" for kind, keys in
                (("missing", info["missing_keys"]), ("unexpected", info["unexpected_keys"]))
                if keys]
    if problems:
        raise SmoothcertError(
            f"the weights in {where} ({weights}) do not fit the UNet of its config "
            f"({'; '.join(problems)}); the file is incomplete or of another model, export or "
            "download the folder again")
    check_finite(unet.state_dict(), f"{where} ({weights})",
                 fix="the model diverged or the file is corrupt, export or download it again")
    return unet, scheduler


def _first_line(err: BaseException) -> str:
    """The line of ``err`` that says what is wrong: torch's size mismatch when it names one
    (its first line only says "Error(s) in loading state_dict"), else the first."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = [line for line in lines if line.startswith("size mismatch")]
    return (named or lines or [type(err).__name__])[0]


def _some(keys: list[str], n: int = 3) -> str:
    return ", ".join(keys[:n]) + (f" and {len(keys) - n} more" if len(keys) > n else "")


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
