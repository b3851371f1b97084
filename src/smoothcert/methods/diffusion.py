"""Diffusion training: a DDPM's ε-prediction loss (Ho et al. 2020)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..denoisers.ddpm import EXPORT_FOLDER, exported_from
from ..io import file_sha256
from ..models.checkpoint import RUN_CHECKPOINT
from ..tensors import eval_mode
from .base import TrainingMethod, eval_batches, register_method

__all__ = ["EXPORT_FOLDER", "DiffusionTraining", "diffusion_loss", "noised"]


def _bare(model: nn.Module) -> nn.Module:
    """The model itself, not its ``DistributedDataParallel`` wrapper (which hides attributes)."""
    return getattr(model, "module", model)


def noised(alphas_cumprod: torch.Tensor, x0: torch.Tensor, t: torch.Tensor,
           eps: torch.Tensor) -> torch.Tensor:
    """x_t = √ᾱ_t · x0 + √(1 − ᾱ_t) · ε for a batch x0 (B, C, H, W) on the [−1, 1] scale at
    timesteps t (B,) (0-based into ``alphas_cumprod``); the coefficients are computed in float64
    and applied in x0's dtype."""
    a = alphas_cumprod.to(device=x0.device, dtype=torch.float64)[t].view(-1, 1, 1, 1)
    return a.sqrt().to(x0.dtype) * x0 + (1 - a).sqrt().to(x0.dtype) * eps


def diffusion_loss(model: nn.Module, x: torch.Tensor,
                   generator: torch.Generator) -> torch.Tensor:
    """Ho et al. 2020, Algorithm 1 (their L_simple): mean ‖ε − ε̂(x_t, t)‖² per coordinate for a
    batch x (B, C, H, W) of pixels in [0, 1], with x0 = 2x − 1, t ~ U{0, …, T−1} and
    ε ~ N(0, I), drawn from ``generator`` in that order, and x_t as :func:`noised`. ``model`` is
    a :class:`~smoothcert.denoisers.ddpm.DiffusionModel` (or its data-parallel wrapper)."""
    alphas_cumprod = _bare(model).alphas_cumprod
    x0 = 2 * x - 1
    t = torch.randint(0, len(alphas_cumprod), (x.shape[0],), generator=generator,
                      device=x.device)
    eps = torch.randn(x0.shape, generator=generator, device=x.device, dtype=x.dtype)
    return F.mse_loss(model(noised(alphas_cumprod, x0, t, eps), t), eps)


@register_method("diffusion")
class DiffusionTraining(TrainingMethod):
    """Ho, Jain & Abbeel, "Denoising Diffusion Probabilistic Models", NeurIPS 2020: train a
    DDPM (``--arch ddpm_unet``: a diffusers ``UNet2DModel`` and a linear-β ``DDPMScheduler``)
    to predict the noise ε of x_t = √ᾱ_t x0 + √(1 − ᾱ_t) ε (:func:`diffusion_loss`), for
    one-shot denoised smoothing as Carlini et al., "(Certified!!) Adversarial Robustness for
    Free!", ICLR 2023.

    The run takes no σ: the model learns every noise level, and certification picks the
    timestep t* whose level matches 2σ. Defaults as Ho et al. (§4, App. B): Adam at lr 2e-4, a
    constant schedule, no weight decay, gradients clipped to norm 1; their EMA of the weights
    (decay 0.9999) and learning-rate warm-up (5000 steps) are not used. The log's ``test_loss``
    is the same loss on the test split with draws fixed across epochs; ``train_acc`` is NaN. After
    each checkpoint the run folder gets ``diffusers/``, the model as a diffusers pipeline
    (``certify CLF --denoiser diffusers:RUN/diffusers``, or ``--denoiser RUN``), which names the
    checkpoint it was exported from; a resumed run exports it again when it does not name the
    checkpoint beside it (its export failed, e.g. on a full disk).
    """

    trains = "diffusion"
    uses_noise = False
    defaults = {"optimizer": "adam", "lr": 2e-4, "weight_decay": 0.0, "lr_schedule": "constant"}
    max_grad_norm = 1.0
    test_columns = ("test_loss",)

    def loss(self, model, x, y, noise, generator):
        return {"loss": diffusion_loss(model, x, generator)}

    def evaluate(self, model, data, noise, generator, batch_size) -> dict[str, float]:
        total = torch.zeros((), dtype=torch.float64, device=generator.device)
        with eval_mode(model), torch.inference_mode():
            for x, _ in eval_batches(data, batch_size, generator.device):
                total += diffusion_loss(model, x, generator).double() * len(x)
        return {"test_loss": total.item() / len(data)}

    def export(self, model: nn.Module, out_dir: Path) -> None:
        """``out_dir/diffusers``: the model as a diffusers ``DDPMPipeline`` folder, replaced
        whole (:meth:`~smoothcert.denoisers.ddpm.DiffusionModel.save_pretrained`), naming the
        SHA-256 of ``out_dir/checkpoint.pt`` (when there is one) in its marker."""
        checkpoint = Path(out_dir) / RUN_CHECKPOINT
        marker = {"checkpoint_sha256": file_sha256(checkpoint)} if checkpoint.is_file() else None
        _bare(model).save_pretrained(Path(out_dir) / EXPORT_FOLDER, marker=marker)

    def export_is_current(self, out_dir: Path) -> bool:
        """Whether ``out_dir/diffusers`` was exported from ``out_dir/checkpoint.pt``."""
        checkpoint = Path(out_dir) / RUN_CHECKPOINT
        return not checkpoint.is_file() or \
            exported_from(Path(out_dir) / EXPORT_FOLDER) == file_sha256(checkpoint)
