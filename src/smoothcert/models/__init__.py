"""Model registry, the normalization layer and checkpoint I/O."""

from .archs import MODELS, NormalizeLayer, build_model, register_model
from .checkpoint import (
    Checkpoint,
    checkpoint_meta,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    versions,
)

__all__ = [
    "MODELS",
    "Checkpoint",
    "NormalizeLayer",
    "build_model",
    "checkpoint_meta",
    "load_checkpoint",
    "model_from_checkpoint",
    "register_model",
    "save_checkpoint",
    "versions",
]
