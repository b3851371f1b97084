"""smoothcert: randomized smoothing — train, certify and evaluate certifiably robust classifiers.

The public names are imported on first use (PEP 562), so that ``import smoothcert`` — which
the ``smoothcert`` command does before parsing — does not import torch:
``from smoothcert import Smoothed`` imports it then.

What they are: the smoothed classifier (``Smoothed``, ``Certificate``, ``Prediction``) and the
dataset runner (``certify_dataset``: every registered certifier, ``certifier="dsrs"``,
``"cascade"``, ``"aces"``, ``"ablation"``, ``"segment"``, ``"median"`` … with records); the
noises (``Gaussian``, ``Uniform``, ``DiscreteGaussian``, and Yang et al.'s ℓp families
``Laplace``, ``Pareto``, ``ExpInf``, ``Exp1``, ``Exp2``, and ``GeneralGaussian``), each with
``radius(p)`` and ``radii(p, dim)``; models (``Ensemble``, ``Denoised``); and the torch-free
statistics of the certificates: Clopper–Pearson and the binomial test, median smoothing's
intervals (``certify_median``), the per-pixel certificates of segmentation
(``certify_pixels``, ``segmentation_radius``). Each checks its arguments: bad input is one
:class:`SmoothcertError` line."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import SmoothcertError
from .version import __version__

if TYPE_CHECKING:  # what the names are, for type checkers and IDEs
    from .denoisers import Denoised
    from .models.ensemble import Ensemble
    from .noise.discrete_gaussian import DiscreteGaussian
    from .noise.exp1 import Exp1
    from .noise.exp2 import Exp2
    from .noise.exp_inf import ExpInf
    from .noise.gaussian import Gaussian
    from .noise.general_gaussian import GeneralGaussian
    from .noise.laplace import Laplace
    from .noise.pareto import Pareto
    from .noise.uniform import Uniform
    from .runs import certify_dataset
    from .smoothing.smoothed import Certificate, InputRangeWarning, Prediction, Smoothed
    from .stats import binomial_pvalue, clopper_pearson_lower
    from .stats.median import MedianCertificate, certify_median
    from .stats.segmentation import PixelCertificates, certify_pixels, segmentation_radius

_LAZY = {
    "Certificate": ".smoothing.smoothed",
    "Denoised": ".denoisers",
    "DiscreteGaussian": ".noise.discrete_gaussian",
    "Ensemble": ".models.ensemble",
    "Exp1": ".noise.exp1",
    "Exp2": ".noise.exp2",
    "ExpInf": ".noise.exp_inf",
    "Gaussian": ".noise.gaussian",
    "GeneralGaussian": ".noise.general_gaussian",
    "InputRangeWarning": ".smoothing.smoothed",
    "Laplace": ".noise.laplace",
    "MedianCertificate": ".stats.median",
    "Pareto": ".noise.pareto",
    "PixelCertificates": ".stats.segmentation",
    "Prediction": ".smoothing.smoothed",
    "Smoothed": ".smoothing.smoothed",
    "Uniform": ".noise.uniform",
    "binomial_pvalue": ".stats",
    "certify_dataset": ".runs",
    "certify_median": ".stats.median",
    "certify_pixels": ".stats.segmentation",
    "clopper_pearson_lower": ".stats",
    "segmentation_radius": ".stats.segmentation",
}
"""Public name -> the module that defines it, imported when the name is first asked for."""


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

__all__ = [
    "Certificate",
    "Denoised",
    "DiscreteGaussian",
    "Ensemble",
    "Exp1",
    "Exp2",
    "ExpInf",
    "Gaussian",
    "GeneralGaussian",
    "InputRangeWarning",
    "Laplace",
    "MedianCertificate",
    "Pareto",
    "PixelCertificates",
    "Prediction",
    "Smoothed",
    "Uniform",
    "binomial_pvalue",
    "certify_dataset",
    "certify_median",
    "certify_pixels",
    "clopper_pearson_lower",
    "segmentation_radius",
    "SmoothcertError",
    "__version__",
]
