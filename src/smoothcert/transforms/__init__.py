"""Semantic transformations as a smoothing axis (Li et al., TSS, CCS 2021): the
:class:`Transformation` base class and one file per family, each registered by name in
:data:`TRANSFORMS` (``--transform NAME:KEY=VALUE,...``).

Importing the package registers every file in this folder: ``brightness`` and ``contrast``
(``brightness.py``: x → e^k (x + b), one distribution, two certificates), ``blur``
(``blur.py``: a Gaussian blur of random variance, OpenCV's kernel and borders) and
``translation`` (``translation.py``: cyclic shifts by rounded Gaussian offsets), and the
transformations certified by sampling (``sampled.py``: Gaussian pixel noise, sampled parameters
and the interpolation bound of ``interpolation.py`` between them): ``rotation``
(``rotation.py``) and ``scaling`` (``scaling.py``). A new transformation is one new file here.
"""

from ..registry import import_submodules
from .base import (
    TRANSFORMS,
    Transformation,
    build_transformation,
    canonical_name,
    canonical_text,
    register_transformation,
)

import_submodules(__name__, __path__, skip=("base",))

__all__ = ["TRANSFORMS", "Transformation", "build_transformation", "canonical_name",
           "canonical_text", "register_transformation"]
