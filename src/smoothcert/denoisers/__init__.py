"""Denoisers for denoised smoothing: a classifier certified behind a Gaussian denoiser.

- :class:`DnCNN`: the trained denoiser of Salman et al., NeurIPS 2020 (``--arch dncnn``).
- :class:`DiffusionModel`: a diffusers UNet and DDPM scheduler (``--arch ddpm_unet``,
  ``train --method diffusion``).
- :class:`DiffusionDenoiser`: one-shot denoising with a diffusion model (Carlini et al., ICLR
  2023), from a local diffusers folder (:meth:`DiffusionDenoiser.from_pretrained`).
- :class:`Denoised`: classifier ∘ denoiser, the base classifier that smoothing certifies.
- :func:`load_denoiser`: a denoiser from a checkpoint, ``diffusers:FOLDER`` or a module, with its
  fingerprint for the run identity.

diffusers (``smoothcert[diffusion]``) is imported only when a diffusion model is built or loaded.
"""

from .composition import Denoised
from .ddpm import DiffusionModel
from .diffusion import DiffusionDenoiser, folder_sha256, one_shot_timestep
from .dncnn import DnCNN
from .loading import DenoiserSource, load_denoiser

__all__ = [
    "Denoised",
    "DenoiserSource",
    "DiffusionDenoiser",
    "DiffusionModel",
    "DnCNN",
    "folder_sha256",
    "load_denoiser",
    "one_shot_timestep",
]
