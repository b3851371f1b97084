"""The :class:`Transformation` base class: a semantic transformation whose parameters are the
smoothing axis (Li et al., "TSS: Transformation-Specific Smoothing for Robustness
Certification", CCS 2021; authors' code AI-secure/semantic-randomized-smoothing), and the
registry :data:`TRANSFORMS` that ``--transform`` names.

A transformation maps an input x (C, H, W) in pixel space and a parameter vector θ ∈ R^P to
T(x, θ). Smoothing draws θ from the transformation's distribution (its options: σ's, a
distribution and its scale) and votes on f(T(x, θ)); the certificate is a set of parameters
around the identity — a brightness shift, a range of contrast factors, a blur variance, a shift
in pixels — computed from p_lower by the torch-free functions of :mod:`smoothcert.stats.tss`.
The transformations here are *resolvable* (TSS §4): composing T with the smoothing draw is
again a draw of T at another parameter, so the certificate needs no interpolation bound.

One object serves training (``methods/transform.py``: augmentation with the smoothing
distribution) and certification (``certifiers/tss.py``): the engine asks it for
``perturb_(out, x, generator)`` as it asks a noise, and every parameter comes from that
generator (:meth:`Transformation.draw`), on the generator's device, in float64, in a documented
order, so the engine's canonical chunks make the votes independent of batching.

A transformation is named by one text, ``FAMILY:KEY=VALUE,...`` (``brightness:sigma_b=0.2``),
built by :func:`build_transformation`; :func:`canonical_name` writes the one text of its
settings (every parameter, defaults included, in declaration order) that run identities and
checkpoints store.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import ClassVar

import torch

from ..errors import SmoothcertError, printable
from ..registry import Configurable, Registry

TRANSFORMS: Registry = Registry("transformation")
"""Family name (``--transform NAME:...``) -> :class:`Transformation` subclass."""


class Transformation(Configurable, abc.ABC):
    """A semantic transformation with a smoothing distribution over its parameters.

    Subclasses declare their parameters as the nested frozen dataclass ``Options`` (the
    distribution's scales and the bounds of the certified set, checked in ``__post_init__``),
    set :attr:`unit`, :attr:`parameters` and :attr:`example`, and implement :meth:`draw`,
    :meth:`apply` and :meth:`radius`; :meth:`perturb_` (what the engine calls) composes them.
    """

    plugin_kind = "transformation"
    option_word = "parameter"
    unit: ClassVar[str] = ""
    """What :meth:`radius` measures, shown by ``report`` (at most 40 characters)."""
    parameters: ClassVar[tuple[str, ...]] = ()
    """The names of the P columns of :meth:`draw`'s parameters, in order."""
    example: ClassVar[str] = ""
    """A full name to show in help and errors (``brightness:sigma_b=0.2``)."""
    norm = None  # no ℓp ball: the radius is in :attr:`unit` (``certifiers/tss.py``)
    sampled: ClassVar[bool] = False
    """True for a transformation certified at sampled parameters with an interpolation bound
    (rotation, scaling: ``sampled.py``); False for a resolvable one."""

    @abc.abstractmethod
    def draw(self, count: int, generator: torch.Generator | None,
             device: torch.device | str = "cpu") -> torch.Tensor:
        """(count, P) float64 parameters on ``device`` (the generator's), drawn from
        ``generator`` in the order the subclass documents."""

    @abc.abstractmethod
    def apply(self, x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """T(x, θ_b) for each row θ_b of ``params`` (B, P): (B, C, H, W) in x's dtype and
        device. ``x`` is one input (C, H, W), shared by every row, or a batch (B, C, H, W),
        row b transformed by θ_b."""

    @abc.abstractmethod
    def radius(self, p_lower: float) -> float:
        """The certified radius in :attr:`unit` when the top class has probability at least
        ``p_lower`` under the smoothing distribution; 0 where nothing is certified."""

    def certified_factors(self, p_lower: float) -> tuple[float, float]:
        """The contrast factors e^k the certificate covers, as (low, high) with low <= 1 <=
        high: (1, 1) for a transformation without a contrast factor (the records'
        ``factor_low``, ``factor_high``)."""
        return 1.0, 1.0

    def check_shape(self, shape) -> None:
        """Refuse inputs of ``shape`` (C, H, W) this transformation cannot smooth at (e.g. a
        shift's σ larger than the image) with one SmoothcertError line; none by default."""
        return None

    def check_input(self, x: torch.Tensor) -> None:
        """Refuse an input x (C, H, W) that is no floating-point image, or whose shape
        :meth:`check_shape` refuses."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 3:
            raise SmoothcertError(f"transformation {self.name!r} transforms one floating-point "
                                  "image (C, H, W) at a time")
        self.check_shape(tuple(x.shape))

    def perturb_(self, out: torch.Tensor, x: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """``out`` (B, C, H, W) <- T(x, θ_b), θ_b drawn from ``generator`` (B rows at once);
        returns ``out``. The Monte Carlo engine draws through this, as through a noise."""
        params = self.draw(out.shape[0], generator, out.device)
        return out.copy_(self.apply(x, params))

    def transform(self, x: torch.Tensor, generator: torch.Generator | None = None
                  ) -> torch.Tensor:
        """A batch x (B, C, H, W), each row transformed by its own draw (training)."""
        return self.apply(x, self.draw(x.shape[0], generator, x.device))


def register_transformation(name: str) -> Callable[[type[Transformation]], type[Transformation]]:
    """Class decorator: make a :class:`Transformation` selectable as ``--transform name``."""

    def register(cls: type[Transformation]) -> type[Transformation]:
        if not (isinstance(cls, type) and issubclass(cls, Transformation)):
            raise TypeError(f"transformation {name!r} must subclass Transformation")
        if not cls.unit or len(cls.unit) > 40 or not cls.parameters or not cls.example:
            raise TypeError(f"transformation {name!r} must set unit (<= 40 characters), "
                            "parameters and example")
        cls.name = name
        return TRANSFORMS.register(name)(cls)

    return register


def build_transformation(text: str) -> Transformation:
    """The transformation named by ``FAMILY[:KEY=VALUE,...]`` (each key once; values as text,
    typed by the family's options). An empty or malformed text, an unknown family or key, or a
    value out of range is one SmoothcertError line saying what is wrong and how to write it."""
    if not isinstance(text, str):
        raise SmoothcertError(f"a transformation is named by text NAME[:KEY=VALUE,...], got "
                              f"{type(text).__name__}")
    family, _, given = text.strip().partition(":")
    if not family:
        raise SmoothcertError(f"no transformation given: {how_to_name()}")
    cls = TRANSFORMS[family]  # an unknown family lists the known ones
    return cls(**_parameters(family, given))


def _parameters(family: str, text: str) -> dict[str, str]:
    """``KEY=VALUE,...`` as text values, each key once."""
    values: dict[str, str] = {}
    for item in text.split(",") if text.strip() else []:
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not key or not value or key in values:
            said = "repeats " + key if key in values else f"has item {printable(item)!r}"
            raise SmoothcertError(f"transformation {family!r}: {printable(text)!r} {said}; "
                                  f"write {family}:KEY=VALUE,... with each key once, e.g. "
                                  f"{TRANSFORMS[family].example}")
        values[key] = value
    return values


def canonical_name(transformation: Transformation) -> str:
    """The one text of a transformation's settings: ``FAMILY:KEY=VALUE,...`` with every
    parameter, defaults included, in declaration order (floats by ``repr``), so that equal
    settings have equal names however they were written; :func:`build_transformation` reads it
    back to the same settings."""
    items = ",".join(f"{key}={_text(value)}"
                     for key, value in transformation.option_values().items())
    return f"{transformation.name}:{items}" if items else transformation.name


def canonical_text(text: str) -> str:
    """:func:`canonical_name` of the transformation ``text`` names; empty text stays empty (a
    certifier or method built with its defaults is refused where it runs, not here)."""
    if isinstance(text, str) and not text.strip():
        return ""
    return canonical_name(build_transformation(text))


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def how_to_name() -> str:
    """How to name a transformation, with the registered families and an example (for the
    error of a missing one)."""
    families = ", ".join(TRANSFORMS)
    first = TRANSFORMS.get("brightness") or next(iter(TRANSFORMS.values()), None)
    example = first.example if first is not None else "brightness:sigma_b=0.2"
    return (f"pass --transform NAME[:KEY=VALUE,...] (or --opt transform=...) with NAME one of "
            f"{families}, e.g. {example}")
