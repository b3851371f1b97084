"""External model zoos: ``torchvision:NAME`` and ``timm:NAME`` classifiers, and torchvision's
segmentation models (``torchvision:fcn_resnet50``, ``deeplabv3_*``, ``lraspp_mobilenet_v3_large``,
behind :class:`SegmentationLogits`), randomly initialised (pretrained weights come in through
--init-from or import-checkpoint, never from a hub at run time). :data:`EXTERNAL_ZOOS` maps a
zoo's name to its builder ``(name, num_classes, (C, H, W), kwargs) -> nn.Module``;
:data:`ZOO_CHANNELS` says how many input channels a zoo's models take (None: any, set at
construction), which an input encoding's extra channels need to know.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

import torch
from torch import nn

from ..errors import SmoothcertError


def torchvision_net(name: str, num_classes: int, shape, kwargs: dict) -> nn.Module:
    """torchvision's classification model ``name`` with ``num_classes`` outputs, or its
    segmentation model ``name`` (:func:`torchvision_segmenter`), random weights."""
    import torchvision.models

    known = torchvision.models.list_models(module=torchvision.models)
    segmenters = torchvision_segmentation_models()
    if name in segmenters:
        return torchvision_segmenter(name, num_classes, shape, kwargs)
    if name not in known:
        raise _unknown_model("torchvision", name, [*known, *segmenters])
    net = _construct("torchvision", name, lambda: torchvision.models.get_model(
        name, weights=None, num_classes=num_classes, **kwargs))
    return _check_forward(f"torchvision:{name}", net, shape, (1, num_classes))


def torchvision_segmentation_models() -> list[str]:
    """The names of torchvision's segmentation models (``torchvision.models.segmentation``)."""
    import torchvision.models

    return torchvision.models.list_models(module=torchvision.models.segmentation)


class SegmentationLogits(nn.Module):
    """A torchvision segmentation model returning its per-pixel logits (B, K, H, W), at the
    input's resolution, as a tensor: torchvision's return a dict ``{"out": ..., "aux": ...}``
    (``aux`` only with ``aux_loss=True``; it is dropped here, so only ``out`` is trained and
    smoothed). The model is ``self.model``: its state-dict keys are torchvision's behind
    ``model.``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)["out"]


def torchvision_segmenter(name: str, num_classes: int, shape, kwargs: dict) -> nn.Module:
    """torchvision's segmentation model ``name`` with ``num_classes`` classes per pixel behind
    :class:`SegmentationLogits`, random weights: ``weights=None`` and ``weights_backbone=None``
    (torchvision's default backbone weights would be downloaded from its hub)."""
    import torchvision.models

    net = _construct("torchvision", name, lambda: torchvision.models.get_model(
        name, weights=None, weights_backbone=None, num_classes=num_classes, **kwargs))
    _, h, w = shape
    return _check_forward(f"torchvision:{name}", SegmentationLogits(net), shape,
                          (1, num_classes, h, w))


def timm_net(name: str, num_classes: int, shape, kwargs: dict) -> nn.Module:
    """timm's model ``name`` with ``num_classes`` outputs and ``C`` input channels, random
    weights (``pretrained=False``: nothing is downloaded)."""
    try:
        import timm
    except ImportError as err:
        raise SmoothcertError(
            "--arch timm:... needs timm, which is not installed; install it with "
            "pip install 'smoothcert[timm]' (or pip install timm)"
        ) from err
    known = timm.list_models()
    if name not in known:
        raise _unknown_model("timm", name, known)
    net = _construct("timm", name, lambda: timm.create_model(
        name, pretrained=False, num_classes=num_classes, in_chans=shape[0], **kwargs))
    return _check_forward(f"timm:{name}", net, shape, (1, num_classes))


EXTERNAL_ZOOS = {"torchvision": torchvision_net, "timm": timm_net}
# torchvision's classification models all take RGB; timm sets in_chans to the input's channels.
ZOO_CHANNELS: dict[str, int | None] = {"torchvision": 3, "timm": None}


def _unknown_model(zoo: str, name: str, known) -> SmoothcertError:
    close = difflib.get_close_matches(name, list(known), n=5, cutoff=0.6)
    hint = f"; close names: {', '.join(close)}" if close else ""
    return SmoothcertError(f"unknown {zoo} model {name!r}{hint}")


def _construct(zoo: str, name: str, make: Callable[[], nn.Module]) -> nn.Module:
    try:
        return make()
    except (TypeError, ValueError, AssertionError) as err:  # a bad keyword argument or value
        raise SmoothcertError(f"cannot build {zoo}:{name} ({err}); check --arch-param") from err


def _check_forward(arch: str, net: nn.Module, shape, expected: tuple[int, ...]) -> nn.Module:
    """Refuse an input shape the network cannot take (a ViT of another image size, 1-channel
    data into a 3-channel stem, ...), found by one forward pass of a zero input in eval mode,
    and a network whose output for it is not of shape ``expected``: (1, K) logits of a
    classifier, (1, K, H, W) of a segmenter."""
    training = net.training
    try:
        with torch.no_grad():
            out = net.eval()(torch.zeros(1, *shape))
    except (RuntimeError, AssertionError, ValueError) as err:
        c, h, w = shape
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SmoothcertError(f"{arch} cannot take {c}×{h}×{w} inputs ({first}); choose "
                              f"another --image-size or architecture") from err
    finally:
        net.train(training)
    if tuple(out.shape) != tuple(expected):
        what = (f"per-pixel logits {expected[1:]}; it is not a segmenter" if len(expected) == 4
                else f"{expected[1]} logits; it is not a classifier")
        raise SmoothcertError(f"{arch} returns outputs of shape {tuple(out.shape)[1:]} for one "
                              f"input, not {what}")
    return net
