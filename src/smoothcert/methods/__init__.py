"""Training methods, one module per paper; importing this package registers them all.

Every module of this package is imported here, so a new method only needs its own file with a
``@register_method`` class.
"""

import importlib
import pkgutil

from .base import METHODS, EpochContext, TrainingMethod, build_method, register_method
from .gaussian import GaussianAugmentation

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "METHODS",
    "EpochContext",
    "GaussianAugmentation",
    "TrainingMethod",
    "build_method",
    "register_method",
]
