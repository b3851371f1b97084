"""Noise distributions: the :class:`Noise` base class and one file per noise, each registered by
name in :data:`NOISES` (``--noise``) with :func:`register_noise`.

Importing the package registers every noise file in this folder: ``gaussian`` (L2, Cohen et al.
2019), the sound ``discrete-gaussian`` on the 8-bit grid (Voráček & Hein 2023), ``uniform`` (L1,
Yang et al. 2020); a new noise is one new file here.
"""

from ..registry import import_submodules
from .base import NOISES, Noise, NoisesWith, Sigma, noises_with, register_noise, with_soft_radius
from .discrete_gaussian import DiscreteGaussian, QuantizedDiscreteGaussian
from .gaussian import Gaussian
from .uniform import Uniform

import_submodules(__name__, __path__, skip=("base",))

__all__ = ["NOISES", "DiscreteGaussian", "Gaussian", "Noise", "NoisesWith",
           "QuantizedDiscreteGaussian", "Sigma", "Uniform", "noises_with", "register_noise",
           "with_soft_radius"]
