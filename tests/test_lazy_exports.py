"""The names ``from smoothcert import ...`` offers (issue 45): the noises and certificates added
since ``Gaussian`` are importable the same way, lazily (``import smoothcert`` imports no torch,
and the torch-free statistics import none either), and each public function checks its
arguments: a probability in [0, 1], a level α in (0, 1), counts, types — one SmoothcertError
line where it returned a number (a bound of 0, a NaN) or raised another error."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import smoothcert
from smoothcert import SmoothcertError
from smoothcert.noise import NOISES

NOISE_NAMES = {"Gaussian": "gaussian", "Uniform": "uniform", "Laplace": "laplace",
               "Pareto": "pareto", "ExpInf": "exp-inf", "Exp1": "exp1", "Exp2": "exp2",
               "DiscreteGaussian": "discrete-gaussian", "GeneralGaussian": "general-gaussian"}
TORCH_FREE = ("certify_median", "MedianCertificate", "certify_pixels", "PixelCertificates",
              "segmentation_radius", "binomial_pvalue", "clopper_pearson_lower")


def run_python(script: str) -> None:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", sorted(NOISE_NAMES))
def test_each_noise_is_a_public_name_and_its_registered_class(name):
    assert name in smoothcert.__all__ and getattr(smoothcert, name) is NOISES[NOISE_NAMES[name]]


def test_the_statistics_are_public_names_that_import_no_torch():
    """``from smoothcert import certify_median`` (and the others of :data:`TORCH_FREE`) needs
    NumPy and SciPy only, as ``stats/`` itself."""
    names = ", ".join(TORCH_FREE)
    run_python(f"import sys; from smoothcert import {names}; "
               "assert 'torch' not in sys.modules, 'torch imported'; "
               f"import smoothcert; assert set({TORCH_FREE!r}) <= set(smoothcert.__all__)")


def test_import_smoothcert_imports_no_torch_until_a_noise_is_asked_for():
    run_python("import sys, smoothcert; assert 'torch' not in sys.modules; "
               "from smoothcert import Laplace, ExpInf; assert 'torch' in sys.modules; "
               "assert Laplace.__module__ == 'smoothcert.noise.laplace'")


def test_general_gaussian_takes_its_k_in_python():
    """``GeneralGaussian(σ, k=K)`` is the registered family at K (the class
    ``NOISES["general-gaussian:k=K"]``), the same noise the command line's string names."""
    from smoothcert import GeneralGaussian

    noise = GeneralGaussian(0.25, k=380)
    assert type(noise) is NOISES["general-gaussian:k=380"] and noise.name == \
        "general-gaussian:k=380" and isinstance(noise, GeneralGaussian)
    assert repr(noise) == "GeneralGaussian(sigma=0.25, k=380)"
    assert noise.radius(0.9, 784) == NOISES["general-gaussian:k=380"](0.25).radius(0.9, 784)
    assert type(NOISES["general-gaussian:k=380"](0.25, k=380)) is type(noise)
    for call, said in [(lambda: GeneralGaussian(0.25), "needs its parameter k"),
                       (lambda: GeneralGaussian(0.25, k=-1), "k must be a finite number >= 0"),
                       (lambda: GeneralGaussian(0.25, k="380"), "k must be a finite number"),
                       (lambda: NOISES["general-gaussian:k=380"](0.25, k=1), "has k = 380")]:
        with pytest.raises(SmoothcertError, match=said):
            call()


@pytest.mark.parametrize("call, said", [
    (lambda: smoothcert.clopper_pearson_lower(5, 3, 0.001), "k must be at most n"),
    (lambda: smoothcert.clopper_pearson_lower([1, 5], [3, 3], 0.001), "k must be at most n"),
    (lambda: smoothcert.clopper_pearson_lower(3, 5, 2.0), "alpha must lie strictly between"),
    (lambda: smoothcert.clopper_pearson_lower(3, 5, 0.0), "alpha must lie strictly between"),
    (lambda: smoothcert.clopper_pearson_lower(3, 5, "0.01"), "alpha must lie strictly"),
    (lambda: smoothcert.clopper_pearson_lower(-1, 5, 0.01), "k must be whole numbers >= 0"),
    (lambda: smoothcert.clopper_pearson_lower(2.5, 5, 0.01), "k must be whole numbers >= 0"),
    (lambda: smoothcert.clopper_pearson_lower(np.nan, 5, 0.01), "k must be whole numbers"),
    (lambda: smoothcert.clopper_pearson_lower("3", 5, 0.01), "k must be whole numbers"),
    (lambda: smoothcert.clopper_pearson_lower(3, np.inf, 0.01), "n must be whole numbers"),
    (lambda: smoothcert.binomial_pvalue(-3, 5), "top must be an integer >= 0"),
    (lambda: smoothcert.binomial_pvalue(2.7, 5), "top must be an integer >= 0"),
    (lambda: smoothcert.binomial_pvalue(3, None), "runner_up must be an integer >= 0"),
])
def test_the_binomial_statistics_refuse_what_is_no_count_or_level(call, said):
    """Before: ``clopper_pearson_lower(5, 3, α)`` was 0.0 (k > n), α = 2 gave NaN, a negative
    count a bound of 0; ``binomial_pvalue(2.7, 5)`` truncated 2.7 to 2."""
    with pytest.raises(SmoothcertError, match=said) as error:
        call()
    assert "\n" not in str(error.value)


def test_the_binomial_statistics_keep_their_values_on_counts():
    lower = smoothcert.clopper_pearson_lower
    assert lower(0, 10, 0.01) == 0.0 and lower(10, 10, 0.01) == 0.01 ** 0.1
    assert lower(np.int64(7), 10.0, np.float64(0.01)) == lower(7, 10, 0.01)  # whole floats
    np.testing.assert_array_equal(lower(np.array([0, 7, 10]), 10, 0.01),
                                  [0.0, lower(7, 10, 0.01), 0.01 ** 0.1])
    assert smoothcert.binomial_pvalue(np.int64(3), 0) == 0.25 and \
        smoothcert.binomial_pvalue(0, 0) == 1.0
