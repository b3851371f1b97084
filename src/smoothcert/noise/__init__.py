"""Noise distributions: the :class:`Noise` base class and one file per noise, each registered by
name in :data:`NOISES` (``--noise``) with :func:`register_noise`.

Importing the package registers every noise file in this folder: ``gaussian`` (L2, Cohen et al.
2019), the sound ``discrete-gaussian`` on the 8-bit grid (Voráček & Hein 2023), ``uniform`` (L1
and L∞, Yang et al. 2020), ``laplace`` (L1, Teng et al. 2020; L∞) and the other families of
Yang et al. 2020: ``pareto`` (L1), ``exp-inf`` (L∞, L1), ``exp1`` (L1), ``exp2`` (L2). Each
certifies the norms in its ``direct_norms`` and the others by conversion (``Noise.radii``);
``draws.py`` holds their generator-driven samplers, ``radial.py`` the base of the noises with a
density of one norm, ``tables.py`` the differential method's cached radius tables. The ℓp
families' classes are imported from their modules (``smoothcert.noise.laplace.Laplace``, …)
and register after the three above. A new noise is one new file here.
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
