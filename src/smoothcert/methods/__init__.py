"""Training methods, one module per paper; importing this package registers them all.

Every module of this package is imported here, so a new method only needs its own file with a
``@register_method`` class.
"""

from ..registry import import_submodules
from .base import METHODS, EpochContext, TrainingMethod, build_method, register_method
from .gaussian import GaussianAugmentation

import_submodules(__name__, __path__, skip=("base",))

__all__ = ["METHODS", "EpochContext", "GaussianAugmentation", "TrainingMethod", "build_method",
           "register_method"]
