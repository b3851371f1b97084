"""Architectures, the model registry (with each model's role) and the normalization layer.

A classifier (role ``"classifier"``, every model before denoisers) is
``nn.Sequential(NormalizeLayer(mean, std), net)``: it takes pixels in [0, 1] of shape
(B, C, H, W) and returns logits (B, num_classes). Normalization is the first layer so that
noise is added, and radii are measured, in pixel space (Cohen et al. 2019, ``datasets.py``). The
state-dict keys are therefore ``0.mean``, ``0.std`` and ``1.<net keys>``, the ``1.*`` layout of the
checkpoints released by Cohen et al. and the works built on their code.

A classifier built with an input encoding (``input_encoding="ablation"``: the model of ablation
smoothing, whose inputs are NaN where ablated) is ``nn.Sequential(AblationEncoding(),
NormalizeLayer(2C means, 2C stds), net)`` with ``net`` taking the encoding's 2C channels
(:mod:`smoothcert.models.encodings`): the encoding is the method's business, so every
architecture takes it. One whose channel count is fixed (``channels`` of
:func:`register_model`: the CIFAR ResNets and ResNet-50 take 3; torchvision's models too) gets a
learned 1×1 convolution from 2C to its channels in front (``net = Sequential(stem, arch)``): a
linear map per pixel, so it can pass the encoded pair on (e.g. a·x + b·(1 − x) with 0 outside
[a, b] keeps ablated apart from every kept value) where cutting the network's first layer open
would need surgery on every model. Every classifier carries ``input_encoding`` (None when
plain), which certifiers ask for.

A denoiser (role ``"denoiser"``) maps pixels to pixels (B, C, H, W) and a diffusion model (role
``"diffusion"``) is a UNet and its noise schedule (:mod:`smoothcert.denoisers`): both are built
bare, without ``NormalizeLayer``, because Salman et al.'s denoisers work on raw pixels (their
checkpoints' keys are ``dncnn.N.*``) and a diffusion model has its own [−1, 1] scale.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from ..data.registry import TASKS
from ..errors import SmoothcertError, check_count
from ..registry import NoOptions, Registry, option, option_values, parse_options
from .encodings import ENCODINGS
from .zoos import EXTERNAL_ZOOS, ZOO_CHANNELS, torchvision_net

# A factory builds the bare network for (num_classes, input_shape=(C, H, W), **arch params); it
# raises SmoothcertError for input shapes the architecture cannot take.
ModelFactory = Callable[..., nn.Module]
MODELS: Registry = Registry("arch")
ROLES = ("classifier", "denoiser", "diffusion")


def register_model(name: str, role: str = "classifier", params: type = NoOptions,
                   channels: int | None = None, task: str = "classification"):
    """Decorator: register a model factory under ``name`` with its ``role`` (one of
    :data:`ROLES`), its arch parameters ``params`` (a frozen dataclass of
    :func:`~smoothcert.registry.option` fields; ``--arch-param KEY=VALUE``), which the factory
    takes as keyword arguments, the number of input ``channels`` it is fixed at (None: it
    takes any) and the ``task`` its outputs serve (:data:`~smoothcert.data.registry.TASKS`:
    logits (B, K), per-pixel logits (B, K, H, W), or D real outputs (B, D)). All are kept on
    the factory (``.role``, ``.Options``, ``.channels``, ``.task``)."""
    if role not in ROLES:
        raise ValueError(f"model role {role!r} is not one of {ROLES}")
    if task not in TASKS:
        raise ValueError(f"model task {task!r} is not one of {TASKS}")

    def add(factory):
        factory.role, factory.Options, factory.channels = role, params, channels
        factory.task = task
        return MODELS.register(name)(factory)

    return add


def _external(arch: str) -> bool:
    source, _, name = arch.partition(":")
    return bool(name) and source in EXTERNAL_ZOOS


def model_role(arch: str) -> str:
    """The role of ``arch``: "classifier", "denoiser" or "diffusion" (torchvision:/timm: models
    are classifiers); an unknown name raises the registry's error listing the known ones."""
    return "classifier" if _external(arch) else MODELS[arch].role


SEGMENTATION_ZOO_PREFIXES = ("fcn_", "deeplabv3_", "lraspp_")  # torchvision's segmenters


def model_task(arch: str) -> str:
    """The task of ``arch``'s outputs (:data:`~smoothcert.data.registry.TASKS`): a registered
    arch's own; torchvision's segmentation models segment, other zoo models classify."""
    if _external(arch):
        source, _, name = arch.partition(":")
        segments = source == "torchvision" and name.startswith(SEGMENTATION_ZOO_PREFIXES)
        return "segmentation" if segments else "classification"
    return MODELS[arch].task


def input_channels(arch: str) -> int | None:
    """The number of input channels ``arch`` is fixed at, or None when it takes any."""
    if _external(arch):
        return ZOO_CHANNELS[arch.partition(":")[0]]
    return MODELS[arch].channels


def check_arch_kwargs(arch: str, kwargs: Mapping | None) -> dict:
    """``kwargs`` checked for ``arch``: a registered architecture's parameters converted to their
    types and completed with their defaults (one SmoothcertError naming the valid keys for an
    unknown one); a torchvision:/timm: model's constructor arguments passed through (its
    constructor checks them when the model is built)."""
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise SmoothcertError(f"arch_kwargs must be a mapping of names to values, got {kwargs!r}")
    if _external(arch):
        return dict(kwargs)
    options = parse_options("arch", arch, MODELS[arch].Options, kwargs, what="arch parameter")
    return option_values(options)


class NormalizeLayer(nn.Module):
    """(x − mean) / std per channel; x (B, C, H, W) in pixel units.

    ``mean`` and ``std`` are persistent buffers of shape (C, 1, 1), so they travel with the state
    dict and the model's device. Backward keeps a copy of ``std`` (C numbers, the same values),
    not the buffer: DDP re-broadcasts buffers in place before each forward, which broke a loss of
    several forwards on ranks > 0 ("modified by an inplace operation", torch 2.11).
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        if len(mean) != len(std) or not all(s > 0 for s in std):
            raise SmoothcertError("normalization needs one mean and one positive std per "
                                  f"channel, got mean={tuple(mean)} std={tuple(std)}")
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(-1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std.clone()


def build_model(
    arch: str,
    num_classes: int,
    input_shape: Sequence[int],
    mean: Sequence[float],
    std: Sequence[float],
    arch_kwargs: dict | None = None,
    input_encoding: str | None = None,
) -> nn.Module:
    """The model ``arch``, freshly initialized, built by its role (:func:`model_role`).

    ``arch`` is a registered name (:data:`MODELS`), ``torchvision:NAME`` (any torchvision
    classification model) or ``timm:NAME`` (any timm model; needs ``smoothcert[timm]``);
    ``arch_kwargs`` are a registered architecture's parameters (:func:`check_arch_kwargs`) or the
    external model's constructor arguments. A classifier is
    ``Sequential(NormalizeLayer(mean, std), net)`` and carries ``num_classes``; a denoiser or a
    diffusion model is the bare module (``mean``, ``std`` and ``num_classes`` unused). Every
    result carries ``input_shape`` (C, H, W, the pixels it takes) and ``role`` as attributes
    (the smoothed classifier validates inputs against them), and ``input_encoding``.

    ``input_encoding`` (a name in :data:`~smoothcert.models.encodings.ENCODINGS`, classifiers
    only) puts that encoding first: ``Sequential(encoding, NormalizeLayer, net)`` (see the
    module's docstring); ``mean`` and ``std`` stay the dataset's C values.
    """
    shape = _check_shape(input_shape)
    role = model_role(arch)
    kwargs = check_arch_kwargs(arch, arch_kwargs)
    if role != "classifier":
        if input_encoding is not None:
            raise SmoothcertError(f"{arch} is a {role}: an input encoding is for classifiers")
        model = MODELS[arch](int(num_classes), shape, **kwargs)
    else:
        if len(mean) != shape[0] or len(std) != shape[0]:
            raise SmoothcertError(
                f"input has {shape[0]} channels but normalization has {len(mean)} means and "
                f"{len(std)} stds; give one per channel"
            )
        layers = _classifier_layers(arch, int(num_classes), shape, mean, std, kwargs,
                                    input_encoding)
        model = nn.Sequential(*layers)
        model.num_classes = int(num_classes)
    model.input_shape, model.role, model.input_encoding = shape, role, input_encoding
    model.task = model_task(arch) if role == "classifier" else None
    return model


def _classifier_layers(arch: str, num_classes: int, shape: tuple[int, int, int], mean, std,
                       kwargs: dict, input_encoding: str | None) -> list[nn.Module]:
    """[NormalizeLayer, net], or [encoding, NormalizeLayer of the encoded channels, net taking
    them] (through a 1×1-conv stem when ``arch`` is fixed at another channel count)."""
    if input_encoding is None:
        return [NormalizeLayer(mean, std), _build_net(arch, num_classes, shape, kwargs)]
    encoding = ENCODINGS[input_encoding]
    c, h, w = shape
    wide = encoding.out_channels(c)
    fixed = input_channels(arch)
    if fixed is None or fixed == wide:
        net = _build_net(arch, num_classes, (wide, h, w), kwargs)
    else:  # the arch's own first layer stays as it is; the stem adapts the channels
        net = nn.Sequential(nn.Conv2d(wide, fixed, kernel_size=1),
                            _build_net(arch, num_classes, (fixed, h, w), kwargs))
    return [encoding(), NormalizeLayer(*encoding.normalization(mean, std)), net]


def _build_net(arch: str, num_classes: int, shape: tuple[int, int, int], kwargs: dict) -> nn.Module:
    source, _, name = arch.partition(":")
    if _external(arch):
        return EXTERNAL_ZOOS[source](name, num_classes, shape, kwargs)
    return MODELS[arch](num_classes, shape, **kwargs)


def _check_shape(input_shape: Sequence[int]) -> tuple[int, int, int]:
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise SmoothcertError(f"input_shape must be (C, H, W) with positive sizes, got {shape}")
    return shape


def _require_channels(arch: str, input_shape: tuple[int, int, int], channels: int) -> None:
    if input_shape[0] != channels:
        raise SmoothcertError(
            f"{arch} takes {channels}-channel inputs, got {input_shape[0]} channels; "
            f"choose an architecture that fits the dataset"
        )


# ---------------------------------------------------------------------------------------------
# Small CNNs for 8×8 digits and 28×28 (Fashion-)MNIST.


@register_model("digits_cnn")
def digits_cnn(num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    """conv3×3 C→16, ReLU, max-pool 2; conv3×3 16→32, ReLU, max-pool 2; fc→64, ReLU; fc→classes.

    Sized for sklearn's 1×8×8 digits and kept small (~85k multiply-adds per image) so that
    certifying the whole test split with n = 10,000 fits the CPU demo; any C×H×W with H, W ≥ 4
    works (flatten size computed).
    """
    c, h, w = input_shape
    if h < 4 or w < 4:
        raise SmoothcertError(f"digits_cnn needs inputs of at least 4×4 pixels, got {h}×{w}")
    return nn.Sequential(
        nn.Conv2d(c, 16, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * (h // 4) * (w // 4), 64),
        nn.ReLU(),
        nn.Linear(64, num_classes),
    )


class LeNet(nn.Module):
    """Caffe-style LeNet as used for MNIST by Jeong & Shin (NeurIPS 2020), ``archs/lenet.py``.

    conv5×5 C→20, ReLU, max-pool 2; conv5×5 20→50, ReLU, max-pool 2; fc→500, ReLU; fc→classes.
    Attribute names (conv1, conv2, fc1, fc2) match theirs so released weights load. The flatten
    size is 50·⌊(⌊(H−4)/2⌋−4)/2⌋·(same for W): 800 for 28×28.
    """

    def __init__(self, num_classes: int, input_shape: tuple[int, int, int]):
        super().__init__()
        c, h, w = input_shape
        fh, fw = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
        if fh < 1 or fw < 1:
            raise SmoothcertError(f"lenet needs inputs of at least 16×16 pixels, got {h}×{w}")
        self.conv1 = nn.Conv2d(c, 20, kernel_size=5)
        self.conv2 = nn.Conv2d(20, 50, kernel_size=5)
        self.fc1 = nn.Linear(50 * fh * fw, 500)
        self.fc2 = nn.Linear(500, num_classes)
        self.pool, self.relu = nn.MaxPool2d(2), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        x = self.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


@register_model("lenet")
def lenet(num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    """Caffe-style LeNet for 1×28×28 inputs, the MNIST model of Jeong & Shin (NeurIPS 2020)."""
    return LeNet(num_classes, input_shape)


@register_model("ablation_cnn")
def ablation_cnn(num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    """The MNIST base classifier of Levine & Feizi's ablation smoothing (NeurIPS 2020,
    alevine0/patchSmoothing ``train_mnist_band.py`` and ``train_mnist_block.py``): conv4×4
    stride 2 C→64, ReLU; conv4×4 stride 2 64→128, ReLU; fc→500, ReLU; fc→100, ReLU;
    fc→classes. Any C×H×W with H, W ≥ 4 (flatten 128·⌊⌊H/2⌋/2⌋·⌊⌊W/2⌋/2⌋: 6272 for 28×28);
    their C is the encoding's 2."""
    c, h, w = input_shape
    if h < 4 or w < 4:
        raise SmoothcertError(f"ablation_cnn needs inputs of at least 4×4 pixels, got {h}×{w}")
    return nn.Sequential(
        nn.Conv2d(c, 64, kernel_size=4, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 128, kernel_size=4, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(128 * (h // 2 // 2) * (w // 2 // 2), 500),
        nn.ReLU(),
        nn.Linear(500, 100),
        nn.ReLU(),
        nn.Linear(100, num_classes),
    )


# ---------------------------------------------------------------------------------------------
# CIFAR ResNets (He et al. 2016, §4.2), laid out as Cohen et al.'s archs/cifar_resnet.py (from
# bearpaw/pytorch-classification) so that their released state dicts load: same attribute names,
# bias-free convolutions, 1×1-conv + BN downsampling, He-normal conv init, BN weight 1 / bias 0.


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3×3 conv-BN layers and an identity (or 1×1 conv-BN) shortcut."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None):
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + shortcut)


class Bottleneck(nn.Module):
    """1×1 reduce, 3×3, 1×1 expand (×4) conv-BN layers and a shortcut."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + shortcut)


# Blocks per stage from the depth: 6n+2 layers with basic blocks, 9n+2 with bottlenecks.
_BLOCKS = {"basic": (BasicBlock, 6), "bottleneck": (Bottleneck, 9)}


class CifarResNet(nn.Module):
    """ResNet for 3×32×32 inputs: 3×3 stem (16), stages of 16/32/64 planes, 8×8 average pool, fc."""

    def __init__(self, depth: int, num_classes: int, block: str = "basic"):
        super().__init__()
        block_cls, layers_per_block = _BLOCKS[block]
        if (depth - 2) % layers_per_block:
            raise SmoothcertError(f"a {block}-block CIFAR ResNet needs depth {layers_per_block}n+2")
        n = (depth - 2) // layers_per_block
        self.inplanes = 16
        self.conv1 = _conv3x3(3, 16)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_stage(block_cls, 16, n, stride=1)  # 32×32
        self.layer2 = self._make_stage(block_cls, 32, n, stride=2)  # 16×16
        self.layer3 = self._make_stage(block_cls, 64, n, stride=2)  # 8×8
        self.avgpool = nn.AvgPool2d(8)
        self.fc = nn.Linear(64 * block_cls.expansion, num_classes)
        self._init_weights()

    def _make_stage(self, block_cls, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block_cls.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block_cls.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(planes * block_cls.expansion),
            )
        stage = [block_cls(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block_cls.expansion
        stage += [block_cls(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*stage)

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):  # He et al. 2015: N(0, 2/fan_out), fan_out = k·k·C_out
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.avgpool(x).flatten(1))


def _cifar_resnet(depth: int) -> ModelFactory:
    """Factory for depth ``depth`` with basic blocks, as Cohen et al. build every depth."""

    def factory(num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
        arch = f"cifar_resnet{depth}"
        _require_channels(arch, input_shape, 3)
        if input_shape[1:] != (32, 32):
            h, w = input_shape[1:]
            raise SmoothcertError(f"{arch} takes 32×32 inputs, got {h}×{w}")
        return CifarResNet(depth, num_classes, block="basic")

    factory.__doc__ = (f"ResNet-{depth} for 3×32×32 inputs (He et al. 2016, §4.2), the CIFAR-10 "
                       "model of Cohen et al. and the papers that follow them")
    return factory


for _depth in (20, 56, 110):  # 0.27M, 0.85M, 1.7M parameters (He et al. 2016, Table 6)
    register_model(f"cifar_resnet{_depth}", channels=3)(_cifar_resnet(_depth))


# ---------------------------------------------------------------------------------------------
# ImageNet's ResNet-50 from torchvision (the external zoos: models/zoos.py).


@register_model("resnet50", channels=3)
def resnet50(num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    """torchvision's ImageNet ResNet-50 (He et al. 2016), the model of Cohen et al.'s,
    Salman et al.'s and Jeong & Shin's ImageNet results; its state dict has the key names of
    their released files once ``module.`` is dropped."""
    _require_channels("resnet50", input_shape, 3)
    return torchvision_net("resnet50", num_classes, input_shape, {})


# ---------------------------------------------------------------------------------------------
# Denoisers and diffusion models (smoothcert.denoisers), built bare. Their modules are imported
# inside the factories: smoothcert.denoisers itself loads checkpoints through this package, and
# ddpm_unet needs the optional diffusers only when one is built.


@dataclasses.dataclass(frozen=True)
class DnCNNParams:
    depth: int = option(17, "convolutional layers (Zhang et al. 2017, Salman et al. 2020: 17)")
    width: int = option(64, "channels of the hidden layers (Salman et al.: 64; 128 for their "
                            "cifar_dncnn_wide)")

    def __post_init__(self):
        check_count("depth", self.depth, minimum=2)
        check_count("width", self.width)


@register_model("dncnn", role="denoiser", params=DnCNNParams)
def dncnn(num_classes: int, input_shape: tuple[int, int, int], *, depth: int = 17,
          width: int = 64) -> nn.Module:
    """DnCNN denoiser (Zhang et al. 2017) as Salman et al., NeurIPS 2020, train it for denoised
    smoothing: pixels to pixels, x − R(x), any C×H×W; ``num_classes`` is unused."""
    from ..denoisers.dncnn import DnCNN

    return DnCNN(input_shape[0], depth=depth, width=width)


@dataclasses.dataclass(frozen=True)
class DDPMParams:
    width: int = option(64, "channels of the first level; the others have twice as many")
    levels: int | None = option(None, "resolution levels, len(block_out_channels) (default: 3 "
                                      "for inputs up to 32 pixels a side, 4 above)")
    layers_per_block: int = option(2, "residual blocks per level (Ho et al. 2020: 2)")
    timesteps: int = option(1000, "diffusion steps T (Ho et al. 2020: 1000)")

    def __post_init__(self):
        check_count("width", self.width)
        if self.levels is not None:
            check_count("levels", self.levels)
        check_count("layers_per_block", self.layers_per_block)
        check_count("timesteps", self.timesteps, minimum=2)


@register_model("ddpm_unet", role="diffusion", params=DDPMParams)
def ddpm_unet(num_classes: int, input_shape: tuple[int, int, int], *, width: int = 64,
              levels: int | None = None, layers_per_block: int = 2,
              timesteps: int = 1000) -> nn.Module:
    """A small DDPM (Ho et al. 2020): diffusers' UNet2DModel predicting ε and a linear-β
    DDPMScheduler, for one-shot denoising as Carlini et al., ICLR 2023 (needs
    ``smoothcert[diffusion]``); ``num_classes`` is unused."""
    from ..denoisers.ddpm import build_ddpm

    return build_ddpm(input_shape, width=width, levels=levels,
                      layers_per_block=layers_per_block, timesteps=timesteps)
