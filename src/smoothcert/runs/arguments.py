"""The Python arguments of :func:`~smoothcert.runs.runner.certify_dataset` checked by type,
before anything is loaded: what the CLI's parser guarantees for its own calls (a dict of
options, a device name), a Python caller may get wrong, and each mistake is one
:class:`~smoothcert.errors.SmoothcertError` line naming the argument and its expected form,
not a ``ValueError`` from ``dict()`` or a ``RuntimeError`` from torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from ..errors import SmoothcertError
from ..smoothing.probe import Tuning
from .inputs import checked_indices

MAPPINGS = {
    "models": "role -> model, e.g. {'core': model} for certifier 'aces'",
    "options": "name -> value of the certifier's options, e.g. {'th': 0.5} for 'dsrs'",
    "engine": "setting -> value, e.g. {'precision': 'bf16'}",
}
"""The arguments that are dicts with names as keys, and what each maps."""


def check_arguments(models=None, options=None, engine=None, tune=None, device=None,
                    indices=None) -> None:
    """Each argument of ``certify_dataset`` that is given, by type: ``models``, ``options``
    and ``engine`` dicts whose keys are names (:data:`MAPPINGS`), ``tune`` a
    :class:`~smoothcert.smoothing.probe.Tuning`, ``device`` a device torch knows and this
    machine has, ``indices`` a list (of integers >= 0, which the run configuration checks
    once numpy's integers are Python's)."""
    for name, value in (("models", models), ("options", options), ("engine", engine)):
        if value is not None:
            check_mapping(name, value)
    if tune is not None and not isinstance(tune, Tuning):
        raise SmoothcertError(f"tune must be a smoothcert.smoothing.probe.Tuning (or None), "
                              f"got {type(tune).__name__}")
    if device is not None:
        check_device(device)
    if indices is not None and not isinstance(indices, Iterable):
        checked_indices(indices)  # the one message for indices; their values: RunConfig's


def check_mapping(name: str, value) -> None:
    """``value`` a dict (any Mapping) whose keys are non-empty strings."""
    if not isinstance(value, Mapping):
        raise SmoothcertError(f"{name} must be a dict of {MAPPINGS[name]}; got "
                              f"{type(value).__name__} {_short(value)}")
    for key in value:
        if not isinstance(key, str) or not key:
            raise SmoothcertError(f"{name} must be a dict of {MAPPINGS[name]}; its key "
                                  f"{key!r} is not a name")


def check_device(device) -> torch.device:
    """``device`` ("cpu", "cuda", "cuda:1", a ``torch.device``) as a torch.device that this
    machine has (a CUDA device needs CUDA)."""
    try:
        checked = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise SmoothcertError(f"device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got "
                              f"{_short(device)}") from None
    if checked.type == "cuda" and not torch.cuda.is_available():
        raise SmoothcertError(f"device {_short(device)} needs CUDA, which this machine has not; "
                              "use device='cpu'")
    return checked


def _short(value) -> str:
    """``value``'s repr on one line, cut at 60 characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["MAPPINGS", "check_arguments", "check_device", "check_mapping"]
