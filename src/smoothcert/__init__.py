"""smoothcert: randomized smoothing — train, certify and evaluate certifiably robust classifiers."""

from .denoisers import Denoised
from .errors import SmoothcertError
from .models.ensemble import Ensemble
from .noise.gaussian import Gaussian
from .noise.uniform import Uniform
from .runs import certify_dataset
from .smoothing.smoothed import Certificate, InputRangeWarning, Prediction, Smoothed
from .stats import binomial_pvalue, clopper_pearson_lower
from .version import __version__

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
