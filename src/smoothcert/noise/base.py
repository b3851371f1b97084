"""The :class:`Noise` base class: one strategy object shared by training, certification and
attacks, and the registry :data:`NOISES` that ``--noise`` names.

Inputs live in pixel space [0, 1]; noise is added there, and σ is in pixel units. For every
distribution here σ is the *standard deviation* of each noise coordinate, so that the same
``--sigma`` means the same noise energy whatever the distribution.

Code outside this package never compares noise names: it asks a noise class for a capability
(:attr:`Noise.norm`, :attr:`Noise.per_sample_sigma`, :attr:`Noise.soft_radius`), and a plug-in
that needs one lists the noises that have it with :func:`noises_with` / :class:`NoisesWith`.
"""

from __future__ import annotations

import abc
import functools
import math
import numbers
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import torch

from ..errors import SmoothcertError
from ..registry import Registry

Sigma = float | torch.Tensor

class NoiseRegistry(Registry):
    """The noises by name. A family with :attr:`Noise.parameters` is also found as
    ``NAME:KEY=VALUE,...`` (``general-gaussian:k=380``): the family's class bound to those
    values (:meth:`Noise.bind`), whose ``name`` is that canonical text, so the one string a
    checkpoint, a run identity or a record stores names the whole distribution."""

    def __missing__(self, name):
        family, sep, given = name.partition(":") if isinstance(name, str) else (name, "", "")
        cls = self.get(family)
        if not sep or cls is None or not cls.parameters:
            return super().__missing__(name)
        return cls.bind(_parse_parameters(family, given, cls.parameters))


def _parse_parameters(family: str, text: str, known: dict) -> dict[str, float]:
    """``k=380,...`` as floats, every key one of ``known``, each once."""
    values = {}
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not eq or key not in known or key in values or not math.isfinite(number):
            raise SmoothcertError(f"noise {family!r}: expected {family}:KEY=VALUE with KEY one "
                                  f"of {', '.join(known)} (each once) and a finite number, "
                                  f"got {text!r}")
        values[key] = number
    return values


NOISES: Registry = NoiseRegistry("noise")
"""Noise name (``--noise``) -> :class:`Noise` subclass taking σ; checkpoints and run identities
store the name (with its parameters, ``NAME:KEY=VALUE``, for a family that has some)."""

NORMS = ("l2", "l1", "linf")
"""Norms a certified ball may be measured in: every record of a noise's certificate carries one
radius per norm (:meth:`Noise.radii`)."""

NORM_ORDER = {"l1": 1.0, "l2": 2.0, "linf": math.inf}
"""The p of each norm's ℓp."""


def checked_probability(p, noise: str = ""):
    """``p`` as float64 (a float for a number, else a numpy array) once every value is a
    probability in [0, 1]; anything else (NaN, 1.5, −0.1, text, a bool, a tensor numpy cannot
    read) is one :class:`SmoothcertError` naming the noise ``noise`` and the first bad value."""
    who = f"noise {noise!r}: " if noise else ""
    try:
        given = np.asarray(p)
    except (TypeError, ValueError, RuntimeError):
        given = np.asarray(None)
    if given.dtype.kind not in "iuf":
        raise SmoothcertError(f"{who}a radius takes a probability p (a number or an array of "
                              f"numbers in [0, 1]), got {type(p).__name__} {_shown(p)}")
    values = given.astype(np.float64)
    bad = ~((values >= 0.0) & (values <= 1.0))  # NaN too
    if bad.any():
        raise SmoothcertError(f"{who}a radius takes probabilities p in [0, 1], got "
                              f"{float(values[bad].flat[0])!r}")
    return float(values) if values.ndim == 0 else values


def check_draw_arguments(noise: str, tensors, generator) -> None:
    """Each of ``tensors`` a floating-point torch tensor and ``generator`` a
    ``torch.Generator`` or None, else one :class:`SmoothcertError` naming the noise."""
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            what = f"a {tensor.dtype} tensor" if isinstance(tensor, torch.Tensor) \
                else type(tensor).__name__
            raise SmoothcertError(f"noise {noise!r} draws on floating-point tensors, got "
                                  f"{what}: convert it first (x.float())")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise SmoothcertError(f"noise {noise!r} draws from a torch.Generator (or None), got "
                              f"{type(generator).__name__}")


def _shown(value) -> str:
    """``value``'s repr on one line, cut at 40 characters (for a message)."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 40 else text[:37] + "..."


def _named(noise) -> str:
    """The noise's registry name, or its class name where it has none (not registered)."""
    return noise.name or type(noise).__name__


def _checks_p(method):
    """``radius(p, dim)`` or ``direct_radius(norm, p, dim)`` with p checked first
    (:func:`checked_probability`)."""
    at = 1 if method.__name__ == "direct_radius" else 0  # p's position after self

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        if len(args) > at:
            args = (*args[:at], checked_probability(args[at], _named(self)), *args[at + 1:])
        elif "p" in kwargs:
            kwargs["p"] = checked_probability(kwargs["p"], _named(self))
        return method(self, *args, **kwargs)

    checked.arguments_checked = True
    return checked


def _checks_tensors(count: int):
    """A draw method's first ``count`` tensors (``like``, ``out``, ``x``) and its generator
    checked first (:func:`check_draw_arguments`)."""
    def wrap(method):
        @functools.wraps(method)
        def checked(self, *args, **kwargs):
            tensors = (*args[:count], *(kwargs[k] for k in ("like", "out", "x") if k in kwargs))
            generator = args[count] if len(args) > count else kwargs.get("generator")
            check_draw_arguments(_named(self), tensors, generator)
            return method(self, *args, **kwargs)

        checked.arguments_checked = True
        return checked

    return wrap


_CHECKED_METHODS = {"radius": _checks_p, "direct_radius": _checks_p,
                    "sample": _checks_tensors(1), "sample_": _checks_tensors(1),
                    "perturb": _checks_tensors(1), "perturb_": _checks_tensors(2)}
"""The methods whose arguments :class:`Noise` checks for every subclass, and how."""


class Noise(abc.ABC):
    """A noise distribution with one σ (the per-coordinate standard deviation) per input.

    ``sigma`` is a positive float, or — where :attr:`per_sample_sigma` — a tensor of shape (B,)
    giving one σ per sample of a batch (data-dependent smoothing); a tensor σ broadcasts over
    the non-batch dimensions. A subclass draws the noise (:meth:`sample`, :meth:`sample_`),
    turns a probability into a certified radius (:meth:`radius`), sets :attr:`norm`, and
    registers itself with :func:`register_noise`; everything else has a working default here.

    Capabilities (class attributes that other layers ask for instead of comparing names):

    * :attr:`norm`: the norm of the certified ball, one of :data:`NORMS`;
    * :attr:`per_sample_sigma`: whether a (B,) tensor σ is accepted;
    * :attr:`soft_radius`: the differentiable surrogate of the radius that data-dependent σ
      ascends (Alfarra et al.), or None when the noise has none — then data-dependent σ refuses
      the noise in training and certification.
    """

    name: ClassVar[str] = ""
    """The registry name, set by :func:`register_noise` (with the parameters of a bound
    family: ``general-gaussian:k=380``)."""
    family: ClassVar[str] = ""
    """The registered name without parameters: what a plug-in's list of noises names."""
    parameters: ClassVar[dict[str, str]] = {}
    """A family's parameters besides σ (KEY -> its meaning), given as ``NAME:KEY=VALUE``;
    empty for a noise that has none."""
    example: ClassVar[str] = ""
    """For a family with parameters: a full name that draws in any d >= 4 (what a test or a
    listing that tries every noise uses)."""
    norm: ClassVar[str]
    """The primary norm (one of :data:`NORMS`): the norm of the ball :meth:`radius` certifies,
    and of a record's ``radius`` column."""
    direct_norms: ClassVar[tuple[str, ...]] = ()
    """Every norm the noise certifies directly (:meth:`direct_radius`), the primary one first;
    empty means just (:attr:`norm`,). Other norms are reached by :func:`convert_radius`."""
    needs_dim: ClassVar[bool] = False
    """True if the radius (or λ from σ) depends on the input dimension d: then :meth:`radius`
    and :meth:`direct_radius` need ``dim``."""
    per_sample_sigma: ClassVar[bool] = True
    """True if σ may be a (B,) tensor (one σ per sample), as data-dependent training needs."""
    soft_radius: ClassVar[Callable[..., torch.Tensor] | None] = None
    """``soft_radius(sigma, psi_a, psi_b, clamp)`` -> R (B,): a smooth surrogate of the
    certified radius as a function of σ (B,) and the top two mean softmax scores ψ_A ≥ ψ_B
    (B,), differentiable in all three with torch; ``clamp`` = (low, high) bounds ψ where the
    formula needs it to stay finite. A noise that declares it also promises the
    reparameterization that :func:`~smoothcert.smoothing.sigma_optimization.optimize_sigma`
    relies on: its draws at σ are σ times its draws at σ = 1, for a float or per-sample σ.
    None: no soft radius (data-dependent σ refuses the noise)."""
    max_sigma: ClassVar[float] = math.inf
    """The largest σ the noise can draw at (pixel units); a larger σ is refused with the
    noise's :attr:`max_sigma_reason`, before any work (an exact sampler's table grows with σ)."""
    max_sigma_reason: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs):
        """Wrap the subclass's own ``radius``, ``direct_radius``, ``sample``, ``sample_``,
        ``perturb`` and ``perturb_`` in the checks of their arguments (class doc)."""
        super().__init_subclass__(**kwargs)
        for name, checked in _CHECKED_METHODS.items():
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "arguments_checked", False):
                setattr(cls, name, checked(method))

    def __init__(self, sigma: Sigma):
        self.sigma = _validated_sigma(sigma)
        self.check_sigma(self.sigma)
        if not self.per_sample_sigma and not isinstance(self.sigma, float):
            raise SmoothcertError(f"{type(self).__name__} needs one σ (a float), not per-sample σ")

    @classmethod
    def check_sigma(cls, sigma: Sigma) -> None:
        """Refuse a σ above :attr:`max_sigma` with one line saying the bound and why."""
        top = float(sigma.max()) if isinstance(sigma, torch.Tensor) else float(sigma)
        if top > cls.max_sigma:
            raise SmoothcertError(f"noise {cls.name!r} takes sigma <= {cls.max_sigma:g}, got "
                                  f"{top:g}: {cls.max_sigma_reason}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sigma={self.sigma_repr()})"

    @abc.abstractmethod
    def sample(self, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Noise with the shape, dtype and device of ``like`` (B, ...), drawn from ``generator``."""

    @abc.abstractmethod
    def sample_(self, out: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw noise into the preallocated buffer ``out`` (no allocation); returns ``out``."""

    @abc.abstractmethod
    def radius(self, p, dim: int | None = None):
        """The certified radius (in :attr:`norm`, float64) of a top-class probability p > ½: a
        float for a float p and a scalar σ, else a numpy array. ``dim`` is the input dimension
        d = C·H·W (needed where :attr:`needs_dim`)."""

    @_checks_p
    def direct_radius(self, norm: str, p, dim: int | None = None):
        """The radius the noise certifies directly in ``norm`` (one of :meth:`certified_norms`)
        for top-class probability p; by default only the primary norm, :meth:`radius`."""
        if norm != self.norm:
            raise SmoothcertError(f"noise {self.name!r} certifies {norm} only by conversion")
        return self.radius(p, dim)

    @classmethod
    def certified_norms(cls) -> tuple[str, ...]:
        """:attr:`direct_norms`, or (:attr:`norm`,) when none are declared."""
        return cls.direct_norms or (cls.norm,)

    def radii(self, p, dim: int) -> dict[str, object]:
        """The best certified radius in every norm of :data:`NORMS` (float64, shaped like p):
        the direct one where the noise has it, else the largest conversion of a direct one
        (:func:`convert_radius`; Yang et al. 2020, the ``_certify_lp_convert`` of rs4a)."""
        direct = {a: self.direct_radius(a, p, dim) for a in self.certified_norms()}
        out = {}
        for target in NORMS:
            if target in direct:
                out[target] = direct[target]
                continue
            converted = [convert_radius(r, a, target, dim) for a, r in direct.items()]
            best = np.maximum.reduce([np.asarray(c, dtype=np.float64) for c in converted])
            out[target] = float(best) if np.ndim(best) == 0 else best
        return out

    @classmethod
    def bind(cls, values: dict[str, float]) -> type[Noise]:
        """The family bound to its parameters ``values`` (a subclass named by the canonical
        ``NAME:KEY=VALUE`` text); a family with parameters overrides it to validate them."""
        raise SmoothcertError(f"noise {cls.family!r} takes no parameters")

    def sigma_repr(self):
        """σ as plain Python (a float, or a list for per-sample σ), for reprs and records."""
        return float(self.sigma) if isinstance(self.sigma, float) else self.sigma.tolist()

    def scalar_sigma(self) -> float:
        """σ as one float; refuses per-sample σ (which needs one noise object per input)."""
        if isinstance(self.sigma, float):
            return self.sigma
        if self.sigma.numel() == 1:
            return float(self.sigma.reshape(()))
        raise SmoothcertError("this operation needs a single σ; got a per-sample σ tensor")

    @_checks_tensors(1)
    def perturb(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """x + δ for a batch x of shape (B, ...)."""
        return x + self.sample(x, generator)

    @_checks_tensors(2)
    def perturb_(self, out: torch.Tensor, x: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """x + δ into the buffer ``out`` (rows shaped like the input x); returns ``out``. The
        Monte Carlo engine draws through this, so a noise may build its noisy inputs exactly
        (:class:`~smoothcert.noise.discrete_gaussian.DiscreteGaussian`)."""
        return self.sample_(out, generator).add_(x)

    def check_input(self, x: torch.Tensor) -> None:
        """Raise a :class:`SmoothcertError` if this noise cannot smooth at ``x`` (by default it
        can smooth at any x)."""
        return None

    def _sigma_float64(self):
        """σ for a radius computed in float64: the float, or a numpy array of per-sample σ."""
        return self.sigma if isinstance(self.sigma, float) else self.sigma.double().cpu().numpy()

    def _broadcast_sigma(self, like: torch.Tensor):
        """σ ready to multiply a batch shaped like ``like``: a float, or a tensor on its device
        and dtype shaped (B, 1, ..., 1)."""
        if isinstance(self.sigma, float):
            return self.sigma
        s = self.sigma.to(device=like.device, dtype=like.dtype)
        if s.numel() == 1:
            return s.reshape(())
        if s.shape[0] != like.shape[0]:
            raise SmoothcertError(
                f"per-sample σ has {s.shape[0]} entries but the batch has {like.shape[0]} inputs"
            )
        return s.reshape((-1,) + (1,) * (like.dim() - 1))


def register_noise(name: str) -> Callable[[type[Noise]], type[Noise]]:
    """Class decorator: make a :class:`Noise` subclass selectable as ``--noise name``.

    Checks the capabilities declared (a plug-in mistake is a TypeError at import): ``norm`` is
    one of :data:`NORMS`, and a soft radius comes with per-sample σ (data-dependent training
    needs both)."""

    def register(cls: type[Noise]) -> type[Noise]:
        if not (isinstance(cls, type) and issubclass(cls, Noise)):
            raise TypeError(f"noise {name!r} must subclass smoothcert.noise.Noise")
        if getattr(cls, "norm", None) not in NORMS:
            raise TypeError(f"noise {name!r} must set norm to one of {', '.join(NORMS)}")
        direct = cls.direct_norms or (cls.norm,)
        if direct[0] != cls.norm or not set(direct) <= set(NORMS):
            raise TypeError(f"noise {name!r}: direct_norms must start with its norm and name "
                            f"norms of {', '.join(NORMS)}")
        if cls.soft_radius is not None and not cls.per_sample_sigma:
            raise TypeError(f"noise {name!r} declares a soft radius but no per-sample σ")
        cls.name = cls.family = name
        return NOISES.register(name)(cls)

    return register


def convert_radius(radius, source: str, target: str, dim: int):
    """An ℓ_target radius inside the ℓ_source ball of ``radius`` in dimension ``dim``.

    ‖δ‖_p ≤ ‖δ‖_q for q ≤ p, and ‖δ‖_p ≤ d^(1/p − 1/q)·‖δ‖_q for q > p, so the ℓq ball of
    radius r / d^(1/p − 1/q) (q > p), or r (q ≤ p), lies in the ℓp ball of radius r."""
    p, q = NORM_ORDER[source], NORM_ORDER[target]
    if q <= p:
        return radius
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < 1:
        raise SmoothcertError(f"converting an {source} radius to {target} needs the input "
                              f"dimension d >= 1, got {dim!r}")
    penalty = float(dim) ** (1.0 / p - (0.0 if math.isinf(q) else 1.0 / q))
    r = np.asarray(radius, dtype=np.float64) / penalty
    return float(r) if np.ndim(r) == 0 else r


def float_or_array(r):
    """A float64 radius: a float where it is a scalar, else a numpy array."""
    r = np.asarray(r, dtype=np.float64)
    return float(r) if r.ndim == 0 else r


def require_dim(noise: str, dim, low: int = 1) -> int:
    """``dim`` as an int >= ``low``, or one SmoothcertError saying that noise ``noise`` needs
    the input dimension d = C·H·W for this radius (or for λ from σ)."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < low:
        raise SmoothcertError(f"noise {noise!r} needs the input dimension d = C*H*W >= {low} "
                              f"for its radius, got {dim!r}")
    return int(dim)


def noise_examples() -> tuple[str, ...]:
    """One usable name per registered noise: its name, or its family's :attr:`Noise.example`."""
    return tuple(cls.example or name for name, cls in NOISES.items())


def noises_with(capability: str) -> tuple[str, ...]:
    """The registered noise names whose class has ``capability`` (a true, non-None class
    attribute such as ``"soft_radius"`` or ``"per_sample_sigma"``), in registration order."""
    return tuple(name for name, cls in NOISES.items() if getattr(cls, capability, None))


class NoisesWith:
    """A class attribute that reads as :func:`noises_with` of ``capability`` when looked up, so
    a plug-in's ``noises`` list follows the registry (a noise registered later is included)."""

    def __init__(self, capability: str):
        self.capability = capability

    def __get__(self, obj, owner=None) -> tuple[str, ...]:
        return noises_with(self.capability)


def with_soft_radius(noise: str, user: str) -> type[Noise]:
    """The class of the noise named ``noise``, which ``user`` (e.g. "data-dependent σ") needs
    to have a soft radius. An unknown name or a noise without one raises one SmoothcertError
    naming the noise and the noises that have one."""
    cls = NOISES[noise]
    if cls.soft_radius is None:
        able = ", ".join(noises_with("soft_radius"))
        raise SmoothcertError(f"{user} needs a noise with a soft certified radius; noise "
                              f"{noise!r} has none (noises with one: {able})")
    return cls


def _validated_sigma(sigma: Sigma) -> Sigma:
    if isinstance(sigma, torch.Tensor):
        if sigma.dim() > 1 or sigma.numel() == 0:
            raise SmoothcertError(f"σ tensor must have shape (B,), got {tuple(sigma.shape)}")
        if not torch.isfinite(sigma).all() or (sigma <= 0).any():
            raise SmoothcertError("σ must be positive and finite for every sample")
        return sigma.detach()
    # numbers.Real: numpy's scalars (np.float32(0.25)) are numbers too; a bool is not a σ
    if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real):
        raise SmoothcertError(f"σ must be a number or a tensor, got {type(sigma).__name__}")
    if not math.isfinite(sigma) or sigma <= 0:
        raise SmoothcertError(f"σ must be a positive finite number, got {sigma!r}")
    return float(sigma)
