"""Generalized Gaussian noise, density ∝ ‖z‖₂^(−2k)·exp(−‖z‖₂²/2s²), and its Neyman–Pearson ℓ2
certificate (Zhang et al. 2020; the P of Li et al. 2022's DSRS, llylly/DSRS ``GeneralGaussian``)."""

from __future__ import annotations

import functools
import math
from typing import ClassVar

import numpy as np
import torch

from ..errors import SmoothcertError, check_nonnegative
from ..stats.radial_dual import Problem, RadialLaw, certified_radius
from .base import Noise, float_or_array, register_noise, require_dim
from .draws import l2_directions_, sample_dim, scale_rows_, standard_gamma


@register_noise("general-gaussian")
class GeneralGaussian(Noise):
    """Generalized Gaussian noise of parameter k ≥ 0 (``--noise general-gaussian:k=380``) and
    its ℓ2 certificate (Zhang et al. 2020; Li et al. 2022).

    Density ∝ ‖z‖^(−2k)·exp(−‖z‖²/2s²) in d = C·H·W dimensions: the direction is uniform
    and ‖z‖²/s² ~ χ² with m = d − 2k degrees of freedom (needs m ≥ 2). σ is each
    coordinate's standard deviation, as for every noise here: E‖z‖² = s²·m = d·σ², so
    s = σ·√(d/m) (the authors' ``sigma = sqrt(d/(d − 2k))·scale``); k = 0 is the Gaussian.
    The authors take k = d/2 − 12 on MNIST (380), d/2 − 6 on CIFAR-10 (1530), d/2 − 4 on
    ImageNet (75260): most of the mass near the sphere of radius σ√d, as the Gaussian's, but
    with a heavier core.

    If the smoothed classifier's top class has probability at least p > ½, its prediction is
    constant within the ℓ2 ball of the Neyman–Pearson radius of this P
    (:func:`~smoothcert.stats.radial_dual.certified_radius`: a sound lower bound of the
    largest radius where the worst classifier keeps P_δ-mass above ½, within 1e-4·σ).
    """

    norm = "l2"
    needs_dim = True
    per_sample_sigma = False
    parameters: ClassVar[dict[str, str]] = {
        "k": "the power of ‖z‖^(−2k), >= 0 with d − 2k >= 2 (the authors: d/2 − 12 on MNIST)"}
    k: ClassVar[float | None] = None
    example: ClassVar[str] = "general-gaussian:k=1"

    def __new__(cls, sigma=None, *, k=None):
        """``GeneralGaussian(σ, k=K)`` is the family bound to K (:meth:`bind`: the class
        ``NOISES["general-gaussian:k=K"]``), at σ; a bound class takes no other k."""
        if k is None or k == cls.k:
            return super().__new__(cls)
        if cls.k is not None:
            raise SmoothcertError(f"noise {cls.name!r} has k = {cls.k:g}; got k={k!r}")
        return super().__new__(cls.bind({"k": check_nonnegative("k", k)}))

    def __init__(self, sigma, *, k=None):
        if self.k is None:
            raise SmoothcertError("noise 'general-gaussian' needs its parameter k, e.g. "
                                  "--noise general-gaussian:k=380 (Python: "
                                  "GeneralGaussian(0.25, k=380))")
        super().__init__(sigma)

    def __repr__(self) -> str:
        return f"GeneralGaussian(sigma={self.sigma_repr()}, k={self.k:g})"

    @classmethod
    def bind(cls, values: dict[str, float]) -> type[Noise]:
        """The family at ``k`` (``general-gaussian:k=K``; k ≥ 0, an integer as the authors')."""
        k = values.get("k")
        if k is None or k < 0:
            raise SmoothcertError(f"noise 'general-gaussian' takes k >= 0 "
                                  f"(general-gaussian:k=K), got {k if k is not None else 'none'}")
        return _bound(float(k))

    def dof(self, dim) -> float:
        """m = d − 2k, checked ≥ 2."""
        d = require_dim(self.name, dim, 2)
        m = d - 2.0 * self.k
        if m < 2:
            raise SmoothcertError(f"noise {self.name!r} needs d - 2k >= 2, got d = {d}")
        return m

    def scale(self, dim) -> float:
        """s = σ·√(d/m)."""
        return self.scalar_sigma() * math.sqrt(dim / self.dof(dim))

    def sample(self, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.sample_(torch.empty_like(like), generator)

    def sample_(self, out: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """s·√(2G)·u into ``out`` (B, ...), G ~ Gamma(m/2) and u uniform on the unit sphere:
        the directions first, then the B radii (as the authors' sampler, Gamma then sphere)."""
        dim = sample_dim(out)
        s = self.scale(dim)
        l2_directions_(out, generator)
        radii = standard_gamma(self.dof(dim) / 2.0, out.shape[0], generator, out.device)
        return scale_rows_(out, radii.mul_(2.0).sqrt_().mul_(s))

    def radius(self, p, dim: int | None = None):
        """The certified ℓ2 radius of top-class probability p (class doc), float64; inf at
        p = 1 (P has a density everywhere: a class of P-mass 1 keeps it under every shift)."""
        m, s = self.dof(dim), self.scale(dim)
        p = np.asarray(p, dtype=np.float64)
        radii = [s * _unit_radius(int(dim), self.k, float(v)) if v < 1.0 else math.inf
                 for v in p.ravel()]
        return float_or_array(np.asarray(radii, dtype=np.float64).reshape(p.shape)) if m else 0.0


@functools.lru_cache(maxsize=65536)
def _unit_radius(d: int, k: float, p: float) -> float:
    """The Neyman–Pearson radius in units of s, to 1e-4·σ (cached: a run repeats its
    counts)."""
    return certified_radius(Problem(RadialLaw(d, k)), p, tol=1e-4 * math.sqrt((d - 2 * k) / d))


@functools.cache
def _bound(k: float) -> type[GeneralGaussian]:
    """The subclass of ``general-gaussian`` at k, named by its canonical text."""
    text = f"{k:g}" if k != int(k) else str(int(k))
    return type("GeneralGaussianK", (GeneralGaussian,),
                {"k": k, "name": f"general-gaussian:k={text}", "__doc__": GeneralGaussian.__doc__})
