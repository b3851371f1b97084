"""What a dataset run certifies: a model (a smoothcert checkpoint or any pixel-space module) and
examples (any map-style dataset of (x, y)), each with the identity that goes into the records.

:class:`ModelSource` carries the model, its meta (empty for a plain module), the number of
classes and a fingerprint (the checkpoint file's sha256, or ``state_dict:<sha256>`` of a module's
tensors) that makes a resumed run refuse another model. :class:`Examples` adapts a dataset to
what the runner reads: validated ``(x (C, H, W) float, label int)`` per index, a name and split for
the run identity, and :meth:`Examples.stream`, which decodes ahead through a
:class:`torch.utils.data.DataLoader` with worker processes when asked.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import SmoothcertError, check_count
from ..io import file_sha256
from ..models.checkpoint import model_from_checkpoint
from ..tensors import model_device


@dataclass(frozen=True)
class ModelSource:
    """A base classifier (pixels in [0, 1] → logits) ready to certify."""

    model: nn.Module
    meta: dict  # the checkpoint's meta; {} for a module given directly
    num_classes: int
    sha256: str  # the run identity's "checkpoint_sha256"
    label: str  # what the manifest names as the model
    device: torch.device


def load_source(model, device=None, num_classes: int | None = None) -> ModelSource:
    """A smoothcert checkpoint path (loaded on ``device``, default CPU) or an ``nn.Module``
    (moved to ``device`` only when one is given; else it stays where it is)."""
    if isinstance(model, (str, os.PathLike)):
        module, meta = model_from_checkpoint(model, device=device or "cpu")
        sha, label = file_sha256(model), str(model)
    elif isinstance(model, nn.Module):
        module, meta = (model.to(device) if device is not None else model), {}
        sha, label = state_dict_sha256(model), f"<{type(model).__name__} module>"
    else:
        raise SmoothcertError("model must be a smoothcert checkpoint path or a torch nn.Module, "
                              f"got {type(model).__name__}")
    classes = meta.get("num_classes", num_classes or getattr(module, "num_classes", None))
    if classes is None:
        raise SmoothcertError("pass num_classes: the module has no num_classes attribute")
    return ModelSource(module, meta, check_count("num_classes", int(classes), minimum=2), sha,
                       label, model_device(module))


def state_dict_sha256(model: nn.Module) -> str:
    """A fingerprint of a module's parameters and buffers: names, dtypes, shapes and bytes."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return f"state_dict:{digest.hexdigest()}"


class Examples:
    """A map-style dataset of (x, y) seen as the runner needs it.

    ``x`` must be a floating-point tensor (C, H, W) of pixels in [0, 1], ``y`` an int (or a
    0-d integer tensor). ``name`` and ``split`` go into the run identity: the dataset's own
    ``name``/``split`` attributes (smoothcert datasets have them), else the class name and
    "test". ``num_classes``, ``input_shape`` and ``classes`` are the dataset's when it states
    them (``None`` otherwise).
    """

    def __init__(self, dataset, name: str | None = None, split: str | None = None):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise SmoothcertError("dataset must be a map-style dataset (with __getitem__ and "
                                  f"__len__) of (x, y), got {type(dataset).__name__}")
        self.dataset = dataset
        self.name = name or getattr(dataset, "name", None) or type(dataset).__name__
        self.split = split or getattr(dataset, "split", None) or "test"
        self.num_classes = getattr(dataset, "num_classes", None)
        self.input_shape = getattr(dataset, "input_shape", None)
        self.classes = getattr(dataset, "classes", None)

    def __len__(self) -> int:
        return len(self.dataset)

    def example(self, idx: int) -> tuple[torch.Tensor, int]:
        """Example ``idx`` validated: (x float (C, H, W), label int)."""
        item = self.dataset.example(idx) if hasattr(self.dataset, "example") \
            else self.dataset[idx]
        return _checked(item, idx, self.name)

    def stream(self, indices: Sequence[int], workers: int | None = None
               ) -> Iterator[tuple[int, torch.Tensor, int]]:
        """(idx, x, label) for ``indices`` in order, read lazily; with ``workers`` > 0 worker
        processes decode ahead (``None``: :func:`default_workers`)."""
        workers = default_workers(self.dataset) if workers is None else workers
        check_count("workers", workers, minimum=0)
        if workers == 0 or not indices:
            return ((idx, *self.example(idx)) for idx in indices)
        return self._loaded(list(indices), workers)

    def _loaded(self, indices: list[int], workers: int):
        loader = torch.utils.data.DataLoader(
            _Picked(self, indices), batch_size=None, num_workers=workers)
        try:
            for idx, (x, label) in zip(indices, loader, strict=True):
                yield idx, x, label
        except SmoothcertError as err:  # re-raised from a worker with its traceback
            raise SmoothcertError(_last_line(str(err))) from None


class _Picked(torch.utils.data.Dataset):
    """The examples at ``indices``, in order, validated in the worker that decodes them."""

    def __init__(self, examples: Examples, indices: list[int]):
        self.examples, self.indices = examples, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.examples.example(self.indices[i])


def default_workers(dataset) -> int:
    """Decoding workers: none for data already in memory, else one per core but one (at most 8),
    so that decoding keeps ahead of the model without starving it."""
    if not getattr(dataset, "streamed", False) and not hasattr(dataset, "samples"):
        return 0
    return max(1, min(8, (os.cpu_count() or 2) - 1))


def _checked(item, idx: int, name: str) -> tuple[torch.Tensor, int]:
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise SmoothcertError(f"{name}[{idx}] is not an (x, y) pair")
    x, y = item[0], item[1]
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 3:
        raise SmoothcertError(
            f"{name}[{idx}] x must be a float tensor (C, H, W) of pixels in [0, 1] (e.g. from "
            f"transforms.ToTensor()), got {_describe(x)}")
    if isinstance(y, torch.Tensor):
        y = y.item() if y.numel() == 1 and not y.is_floating_point() else y
    if isinstance(y, bool) or not isinstance(y, int):
        raise SmoothcertError(f"{name}[{idx}] y must be an integer class label, got {y!r}")
    return x, int(y)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__


def _last_line(message: str) -> str:
    """The original message of an error re-raised by a DataLoader worker (its last line)."""
    last = [line for line in message.strip().splitlines() if line.strip()][-1]
    return last.split("SmoothcertError: ", 1)[-1].strip()


def as_examples(dataset, name: str | None = None, split: str | None = None) -> Examples:
    return dataset if isinstance(dataset, Examples) else Examples(dataset, name, split)


__all__ = ["Examples", "ModelSource", "as_examples", "default_workers", "file_sha256",
           "load_source", "state_dict_sha256"]
