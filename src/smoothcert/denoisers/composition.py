"""A classifier behind a denoiser: the base classifier of denoised smoothing (Salman et al.,
NeurIPS 2020; Carlini et al., ICLR 2023), which randomized smoothing then certifies as any other."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import SmoothcertError


def _shape(module: nn.Module) -> tuple[int, int, int] | None:
    shape = getattr(module, "input_shape", None)
    return tuple(int(s) for s in shape) if shape is not None else None


class Denoised(nn.Module):
    """x ↦ classifier(resize(denoiser(x))) for pixels x (B, C, H, W) in [0, 1].

    ``resize`` is bicubic interpolation with antialiasing to the classifier's (H, W) when the
    denoised image has another size (Carlini et al. resize the 32×32 diffusion output to their
    ViT's 224×224 so), the identity otherwise or when the classifier states no ``input_shape``.
    The denoiser's output is not clipped here (a DnCNN's is not; a diffusion denoiser's is
    already in [0, 1]). Attributes: ``denoiser``, ``classifier``, ``num_classes`` (the
    classifier's, None when it states none) and ``input_shape`` (the denoiser's when it states
    one, else the classifier's, else None). A denoiser whose channels the classifier does not take
    is refused when both state their channels.
    """

    def __init__(self, denoiser: nn.Module, classifier: nn.Module):
        super().__init__()
        for name, module in (("denoiser", denoiser), ("classifier", classifier)):
            if not isinstance(module, nn.Module):  # a path or a lambda would fail deep in torch
                raise SmoothcertError(
                    f"Denoised takes torch nn.Modules; the {name} is a {type(module).__name__} "
                    "(load a checkpoint with smoothcert.denoisers.load_denoiser or "
                    "smoothcert.models.checkpoint.model_from_checkpoint)")
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
        y = self.denoiser(x)
        if self.size is not None and tuple(y.shape[-2:]) != self.size:
            y = F.interpolate(y, size=self.size, mode="bicubic", antialias=True,
                              align_corners=False)
        return self.classifier(y)
