"""Noise distributions, one file each, registered by name in :data:`NOISES` (``--noise``).

Importing the package registers every noise: ``gaussian`` (L2, Cohen et al. 2019), ``uniform``
(L1, Yang et al. 2020) and the sound ``discrete-gaussian`` on the 8-bit grid (Voráček & Hein 2023).
"""

from .base import NOISES, Sigma
from .discrete_gaussian import DiscreteGaussian, QuantizedDiscreteGaussian
from .gaussian import Gaussian
from .uniform import Uniform

__all__ = ["NOISES", "DiscreteGaussian", "Gaussian", "QuantizedDiscreteGaussian", "Sigma",
           "Uniform"]
