"""What a run's model and examples are for (:data:`~smoothcert.data.registry.TASKS`), checked
against each other and against the certifier before any file is opened; the labels of the
dense tasks (a mask per image, D numbers per image) validated as they are read.
"""

from __future__ import annotations

import torch

from ..certifiers import Certifier
from ..errors import SmoothcertError
from ..models.checkpoint import checkpoint_task


def examples_task(dataset) -> tuple[str, int | None]:
    """(task, ignore_index) of a dataset: its spec's (smoothcert's datasets, image folders), its
    own ``task`` attribute, else classification."""
    spec = getattr(dataset, "spec", None)
    task = getattr(spec, "task", None) or getattr(dataset, "task", None) or "classification"
    ignore = getattr(spec, "ignore_index", getattr(dataset, "ignore_index", None))
    return task, ignore


def source_task(source) -> str | None:
    """The task a model declares: its checkpoint's ``meta["task"]``, or a module's ``task``
    attribute (``build_model`` sets it); None for a plain module that says nothing."""
    if source.meta:
        return checkpoint_task(source.meta)
    return getattr(source.classifier, "task", None)


def check_task(certifier: Certifier, source, data) -> str:
    """The run's task: the model's and the examples' must agree, and the certifier must certify
    it (``Certifier.tasks``); otherwise one line naming what fits."""
    model, task = source_task(source), data.task
    if model is not None and model != task:
        raise SmoothcertError(f"the model {source.label} is a {model} model but dataset "
                              f"{data.name!r} is for {task}; choose a dataset of its task")
    if task not in certifier.tasks:
        from ..certifiers import CERTIFIERS

        fits = sorted(n for n, c in CERTIFIERS.items() if task in c.tasks and c.certifies)
        raise SmoothcertError(f"certifier {certifier.name!r} certifies "
                              f"{' and '.join(certifier.tasks)}, not this {task} model; use "
                              f"--certifier {' or '.join(fits) or '(none yet)'}")
    return task


def checked_dense_label(y, where: str, task: str, num_classes: int | None,
                        ignore_index: int | None, shape) -> torch.Tensor:
    """A segmentation mask (H, W) of integer classes in [0, num_classes) or ``ignore_index``,
    or a regression target (D,) of finite numbers, D = ``num_classes``: refused in one line
    otherwise (``where``: "dataset[idx]"; ``shape``: the image's (C, H, W))."""
    if not isinstance(y, torch.Tensor):
        raise SmoothcertError(f"{where} y must be a tensor ({task} label), got "
                              f"{type(y).__name__}")
    if task == "segmentation":
        if y.is_floating_point() or y.dtype == torch.bool or tuple(y.shape) != tuple(shape[1:]):
            raise SmoothcertError(f"{where} y must be an integer mask of shape "
                                  f"{tuple(shape[1:])}, got {y.dtype} {tuple(y.shape)}")
        labels = y[y != ignore_index] if ignore_index is not None else y
        if num_classes is not None and labels.numel() and not (
                int(labels.min()) >= 0 and int(labels.max()) < num_classes):
            raise SmoothcertError(f"{where} has pixel labels outside the model's {num_classes} "
                                  f"classes 0..{num_classes - 1} (ignore index {ignore_index})")
        return y.to(torch.int64)
    if y.dim() != 1 or (num_classes is not None and y.shape[0] != num_classes) \
            or not bool(torch.isfinite(y.to(torch.float64)).all()):
        raise SmoothcertError(f"{where} y must be {num_classes} finite numbers (the model's "
                              f"outputs), got {tuple(y.shape)}")
    return y.to(torch.float32)
