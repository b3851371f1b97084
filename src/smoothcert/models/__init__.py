"""Model registry (architectures and their roles), the normalization layer and checkpoint I/O."""

from .archs import (
    MODELS,
    ROLES,
    NormalizeLayer,
    build_model,
    check_arch_kwargs,
    model_role,
    register_model,
)
from .checkpoint import (
    Checkpoint,
    checkpoint_meta,
    checkpoint_role,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    versions,
)

__all__ = [
    "MODELS",
    "ROLES",
    "Checkpoint",
    "NormalizeLayer",
    "build_model",
    "check_arch_kwargs",
    "checkpoint_meta",
    "checkpoint_role",
    "load_checkpoint",
    "model_from_checkpoint",
    "model_role",
    "register_model",
    "save_checkpoint",
    "versions",
]
