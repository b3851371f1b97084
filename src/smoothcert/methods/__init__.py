"""Training methods, one module per paper; importing this package registers them all."""

from . import gaussian  # noqa: F401  (registers "gaussian")
from .base import METHODS, EpochContext, TrainingMethod, build_method, register_method
from .gaussian import GaussianAugmentation

__all__ = [
    "METHODS",
    "EpochContext",
    "GaussianAugmentation",
    "TrainingMethod",
    "build_method",
    "register_method",
]
