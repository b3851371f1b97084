"""DnCNN (Zhang et al. 2017, "Beyond a Gaussian Denoiser: Residual Learning of Deep CNN for Image
Denoising"), laid out as the denoisers of Salman et al., NeurIPS 2020, "Denoised Smoothing: A
Provable Defense for Pretrained Classifiers" (microsoft/denoised-smoothing ``code/archs/dncnn.py``),
so that their released state dicts load key for key (``dncnn.0.weight``, ``dncnn.2.weight``, ...).
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import check_count

# BatchNorm settings of the authors' code: eps 1e-4 and momentum 0.95, which in PyTorch's
# convention (running = 0.05·running + 0.95·batch) keeps mostly the last batch's statistics; kept
# as is, since their released weights were trained with it.
BN_EPS, BN_MOMENTUM = 1e-4, 0.95


class DnCNN(nn.Module):
    """x ↦ x − R(x): a residual denoiser on pixels (B, C, H, W), any H and W (3×3 convolutions,
    padding 1). R is conv(C→width, bias) + ReLU, then (depth − 2) × [conv(width→width, no bias)
    + BatchNorm + ReLU], then conv(width→C, no bias): R estimates the noise. The output is not
    clipped to [0, 1]. Initialization as the authors': orthogonal convolutions, zero biases, BN
    weight 1 and bias 0, and the last convolution zero, so a fresh DnCNN is the identity.

    ``depth`` 17 and ``width`` 64 are Zhang et al.'s and Salman et al.'s ``cifar_dncnn`` and
    ``imagenet_dncnn``; ``cifar_dncnn_wide`` has width 128.
    """

    def __init__(self, channels: int, depth: int = 17, width: int = 64):
        super().__init__()
        channels = check_count("channels", channels)
        depth, width = check_count("depth", depth, minimum=2), check_count("width", width)
        layers: list[nn.Module] = [nn.Conv2d(channels, width, 3, padding=1, bias=True),
                                   nn.ReLU(inplace=True)]
        for _ in range(depth - 2):
            layers += [nn.Conv2d(width, width, 3, padding=1, bias=False),
                       nn.BatchNorm2d(width, eps=BN_EPS, momentum=BN_MOMENTUM),
                       nn.ReLU(inplace=True)]
        layers.append(nn.Conv2d(width, channels, 3, padding=1, bias=False))
        self.dncnn = nn.Sequential(*layers)
        self.channels, self.depth, self.width = channels, depth, width
        self._init_weights()

    def _init_weights(self) -> None:
        convs = [m for m in self.modules() if isinstance(m, nn.Conv2d)]
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.orthogonal_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.zeros_(convs[-1].weight)  # R(x) = 0 at the start: D begins as the identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - self.dncnn(x)
