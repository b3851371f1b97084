"""smoothcert: randomized smoothing — train, certify and evaluate certifiably robust classifiers.

The public names are imported on first use (PEP 562), so that ``import smoothcert`` — which
the ``smoothcert`` command does before parsing — does not import torch:
``from smoothcert import Smoothed`` imports it then."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import SmoothcertError
from .version import __version__

if TYPE_CHECKING:  # what the names are, for type checkers and IDEs
    from .denoisers import Denoised
    from .models.ensemble import Ensemble
    from .noise.gaussian import Gaussian
    from .noise.uniform import Uniform
    from .runs import certify_dataset
    from .smoothing.smoothed import Certificate, InputRangeWarning, Prediction, Smoothed
    from .stats import binomial_pvalue, clopper_pearson_lower

_LAZY = {
    "Certificate": ".smoothing.smoothed",
    "Denoised": ".denoisers",
    "Ensemble": ".models.ensemble",
    "Gaussian": ".noise.gaussian",
    "InputRangeWarning": ".smoothing.smoothed",
    "Prediction": ".smoothing.smoothed",
    "Smoothed": ".smoothing.smoothed",
    "Uniform": ".noise.uniform",
    "binomial_pvalue": ".stats",
    "certify_dataset": ".runs",
    "clopper_pearson_lower": ".stats",
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
    "Ensemble",
    "Gaussian",
    "InputRangeWarning",
    "Prediction",
    "Smoothed",
    "Uniform",
    "SmoothcertError",
    "binomial_pvalue",
    "certify_dataset",
    "clopper_pearson_lower",
    "__version__",
]
