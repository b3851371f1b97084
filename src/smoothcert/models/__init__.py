"""Model registry (architectures and their roles), the normalization layer, input encodings and
checkpoint I/O."""

from . import dense_archs  # noqa: F401  (registers fcn_small and lenet_box)
from .archs import (
    MODELS,
    ROLES,
    NormalizeLayer,
    build_model,
    check_arch_kwargs,
    input_channels,
    model_role,
    model_task,
    register_model,
)
from .checkpoint import (
    Checkpoint,
    checkpoint_meta,
    checkpoint_role,
    checkpoint_task,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    versions,
)
from .encodings import ENCODINGS, AblationEncoding

__all__ = [
    "ENCODINGS",
    "MODELS",
    "ROLES",
    "AblationEncoding",
    "Checkpoint",
    "NormalizeLayer",
    "build_model",
    "check_arch_kwargs",
    "checkpoint_meta",
    "checkpoint_role",
    "checkpoint_task",
    "input_channels",
    "load_checkpoint",
    "model_from_checkpoint",
    "model_role",
    "model_task",
    "register_model",
    "save_checkpoint",
    "versions",
]
