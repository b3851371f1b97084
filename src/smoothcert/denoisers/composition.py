"""A classifier behind a denoiser: the base classifier of denoised smoothing (Salman et al.,
NeurIPS 2020; Carlini et al., ICLR 2023), which randomized smoothing then certifies as any other."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SmoothcertError
from .ddpm import DiffusionModel
from .diffusion import DiffusionDenoiser
from .dncnn import DnCNN


def _shape(module: nn.Module) -> tuple[int, int, int] | None:
    shape = getattr(module, "input_shape", None)
    return tuple(int(s) for s in shape) if shape is not None else None


def _role(module: nn.Module) -> str | None:
    """What ``module`` is, where it says so: its ``role`` (every model ``build_model`` makes),
    or its class for smoothcert's own denoisers built directly; None for any other module."""
    role = getattr(module, "role", None)
    if isinstance(role, str):
        return role
    if isinstance(module, (DnCNN, DiffusionDenoiser)):
        return "denoiser"
    return "diffusion" if isinstance(module, DiffusionModel) else None


def _check_roles(denoiser: nn.Module, classifier: nn.Module) -> None:
    """Refuse the arguments in the wrong order, a classifier in the denoiser's place, a
    denoiser in the classifier's, and a bare diffusion model (which needs its σ)."""
    den, clf = _role(denoiser), _role(classifier)
    if den == "classifier" and clf in ("denoiser", "diffusion"):
        raise SmoothcertError("the denoiser and the classifier are swapped: Denoised takes the "
                              "denoiser first; pass Denoised(denoiser, classifier)")
    if den == "classifier" or clf in ("denoiser", "diffusion"):
        place, role = ("denoiser", den) if den == "classifier" else ("classifier", clf)
        raise SmoothcertError(f"the {place} given to Denoised is a {role}; pass "
                              "Denoised(denoiser, classifier)")
    if den == "diffusion":
        raise SmoothcertError("a diffusion model denoises at the timestep of one sigma: pass "
                              "DiffusionDenoiser(model.unet, model.scheduler, sigma) (or "
                              "load_denoiser(model, sigma).module) as the denoiser")


def _float_dtype(module: nn.Module) -> torch.dtype | None:
    """The dtype of ``module``'s first floating-point parameter (or buffer); None if none."""
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return None


def _as(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """``x`` in the dtype of ``module``'s weights (a float64 denoiser in front of a float32
    classifier, or the other way round), as it is when the module states none."""
    dtype = _float_dtype(module)
    return x if dtype is None or dtype == x.dtype else x.to(dtype)


class Denoised(nn.Module):
    """x ↦ classifier(resize(denoiser(x))) for pixels x (B, C, H, W) in [0, 1].

    ``resize`` is bicubic interpolation with antialiasing to the classifier's (H, W) when the
    denoised image has another size (Carlini et al. resize the 32×32 diffusion output to their
    ViT's 224×224 so), the identity otherwise or when the classifier states no ``input_shape``.
    The denoiser's output is not clipped here (a DnCNN's is not; a diffusion denoiser's is
    already in [0, 1]). Attributes: ``denoiser``, ``classifier``, ``num_classes`` (the
    classifier's, None when it states none) and ``input_shape`` (the denoiser's when it states
    one, else the classifier's, else None). A denoiser whose channels the classifier does not take
    is refused when both state their channels, and so are the two given in the wrong order
    (where their roles say so). Each module gets its input in the dtype of its own weights, so a
    float64 denoiser or classifier runs beside a float32 one.
    """

    def __init__(self, denoiser: nn.Module, classifier: nn.Module):
        super().__init__()
        for name, module in (("denoiser", denoiser), ("classifier", classifier)):
            if not isinstance(module, nn.Module):  # a path or a lambda would fail deep in torch
                raise SmoothcertError(
                    f"Denoised takes torch nn.Modules; the {name} is a {type(module).__name__} "
                    "(load a checkpoint with smoothcert.denoisers.load_denoiser or "
                    "smoothcert.models.checkpoint.model_from_checkpoint)")
        _check_roles(denoiser, classifier)
        den, clf = _shape(denoiser), _shape(classifier)
        den_channels = den[0] if den else getattr(denoiser, "channels", None)
        if den_channels is not None and clf is not None and den_channels != clf[0]:
            raise SmoothcertError(
                f"the denoiser gives {den_channels}-channel images but the classifier takes "
                f"{clf[0]} channels; use a denoiser trained on the classifier's kind of images")
        self.denoiser, self.classifier = denoiser, classifier
        self.num_classes = getattr(classifier, "num_classes", None)
        self.input_shape = den or clf
        self.size = clf[1:] if clf else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.denoiser(_as(x, self.denoiser))
        if self.size is not None and tuple(y.shape[-2:]) != self.size:
            y = F.interpolate(y, size=self.size, mode="bicubic", antialias=True,
                              align_corners=False)
        return self.classifier(_as(y, self.classifier))
