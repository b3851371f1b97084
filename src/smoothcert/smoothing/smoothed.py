"""The smoothed classifier g(x) = argmax_c P(f(x + δ) = c) and its two algorithms.

PREDICT and CERTIFY follow Cohen, Rosenfeld & Kolter, "Certified Adversarial Robustness via
Randomized Smoothing" (ICML 2019), Algorithms 1 and 2 (pseudocode) and their ``core.py``.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import SmoothcertError, check_count, check_probability
from ..noise.base import NORMS, Noise
from ..noise.gaussian import Gaussian
from ..stats import binomial_pvalue, clopper_pearson_lower
from ..tensors import eval_mode, input_dtype, model_device
from .engine import BatchedVotes, Draws


class InputRangeWarning(UserWarning):
    """An input with values outside [0, 1]. Its certificate still holds for the x given (the
    theorems are about g on all of R^d), but the noise and the radius are then in the units of
    x, not in pixels: an image in [0, 255] gets radii 255 times too small to compare, a
    normalized one radii in standard deviations. A warning, not a refusal, because inputs off
    [0, 1] can be meant (closed-form oracles; a user who certifies in another unit on
    purpose, who may silence it with ``warnings.filterwarnings``)."""


RANGE_SLACK = 1e-6
"""How far past 0 or 1 a value may lie unremarked: float32 rounding of a resize or of a
normalization round trip (~1e-7); one 8-bit level is 1/255 ≈ 0.004."""


def outside_unit_range(x: torch.Tensor) -> tuple[float, float] | None:
    """(min, max) of ``x`` when a value lies outside [0, 1] (by more than :data:`RANGE_SLACK`),
    else None; one pass over x (NaN is refused elsewhere and passes here)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
        return None  # refused with its own message by prepare_input
    low, high = (float(v) for v in torch.aminmax(x.detach()))
    return (low, high) if low < -RANGE_SLACK or high > 1 + RANGE_SLACK else None


def unit_range_message(low: float, high: float) -> str:
    """The one line that says an input spans [low, high] and how to put it in [0, 1]."""
    return (f"input values span [{low:.3g}, {high:.3g}], outside [0, 1]: smoothcert draws noise "
            "and certifies radii in pixel space, so these radii are in the input's units; "
            "scale images to [0, 1] (x / 255) and put any normalization inside the model "
            "(NormalizeLayer)")


@dataclass(frozen=True)
class Prediction:
    """Result of PREDICT. ``prediction`` is None exactly when ``abstained``."""

    prediction: int | None
    abstained: bool
    count: int  # votes for the top class
    runner_up_count: int  # votes for the second class
    pvalue: float  # two-sided binomial test of count vs runner_up_count at p = 1/2
    n: int
    alpha: float


@dataclass(frozen=True)
class Certificate:
    """Result of CERTIFY.

    Unless ``abstained``, with probability ≥ 1−α over the Monte Carlo draws the smoothed classifier
    predicts ``prediction`` at every point of the ball of ``radius`` around x, in the norm of the
    noise (``noise.norm``: L2 for :class:`~smoothcert.noise.Gaussian`, L1 for
    :class:`~smoothcert.noise.Uniform`). On abstention ``prediction`` is None and ``radius`` is 0.
    ``sigma`` is the noise's standard deviation. ``radii`` holds the certified radius in every
    norm of :data:`~smoothcert.noise.base.NORMS` under the same event (``noise.radii(p_lower,
    d)``, d = C·H·W: direct where the noise has a certificate in that norm, else converted; all
    0 on abstention); ``radii[noise.norm]`` is ``radius``.
    """

    prediction: int | None
    radius: float
    p_lower: float  # Clopper–Pearson lower bound on p_A at level α
    abstained: bool
    count: int  # n_A: votes for the selected class among the n estimation draws
    n0: int
    n: int
    alpha: float
    sigma: float
    radii: Mapping[str, float] = field(default_factory=dict)


def noise_radii(noise: Noise, p_lower: float, dim: int) -> dict[str, float]:
    """The certified radius in every norm of :data:`~smoothcert.noise.base.NORMS` for a
    top-class probability bound ``p_lower`` >= ½ at an input of ``dim`` = C·H·W coordinates:
    ``noise.radii(p_lower, dim)`` (direct or converted, Yang et al. 2020), each a float >= 0."""
    return {norm: max(float(r), 0.0) for norm, r in noise.radii(p_lower, dim).items()}


NO_RADII = {norm: 0.0 for norm in NORMS}
"""An abstention's radii: 0 in every norm."""


class Smoothed:
    """The smoothed classifier of a base ``model`` under ``noise``.

    ``model`` is an ``nn.Module`` that maps a batch (B, C, H, W) of pixel-space inputs in
    [0, 1] to logits (B, num_classes); ``noise`` a :class:`~smoothcert.noise.Noise` object, or a
    number: the σ of :class:`~smoothcert.noise.Gaussian` noise. Inputs ``x`` to :meth:`predict`
    and :meth:`certify` are single examples (C, H, W), moved to the model's device, where all
    noise is drawn and votes counted. ``generator`` is a ``torch.Generator`` on that device, an
    integer seed (a generator on the model's device seeded with it) or None (torch's global
    one). Counts (``n``, ``n0``, ``batch_size``) and levels may be numpy scalars too.
    """

    def __init__(self, model: nn.Module, noise, num_classes: int,
                 engine: BatchedVotes | None = None):
        if not isinstance(model, nn.Module):
            raise SmoothcertError("model must be a torch nn.Module mapping pixels in [0, 1] to "
                                  f"logits, got {type(model).__name__} (wrap a function in an "
                                  "nn.Module)")
        self.model = model
        self.noise = _noise(noise)
        self.num_classes = check_count("num_classes", plain(num_classes), minimum=2)
        self.engine = engine if engine is not None else BatchedVotes()

    def predict(self, x, n, alpha, batch_size, generator=None) -> Prediction:
        """PREDICT: the top class of n noisy votes, or abstain.

        Returns a class other than g(x) with probability at most α (Cohen et al., Thm. 2): it
        abstains when the two-sided binomial test of the top two counts has p-value > α.
        An x outside [0, 1] is warned about (:class:`InputRangeWarning`).
        """
        _warn_outside_unit_range(x)
        return self._run_one(self.predict_program(x, n, alpha, generator), plain(batch_size))

    def certify(self, x, n0, n, alpha, batch_size, generator=None) -> Certificate:
        """CERTIFY: a class and a radius that hold with probability ≥ 1−α, or abstain.

        Step 1 picks ĉ_A from n0 selection draws; step 2 counts n_A among n *fresh* draws; then
        p_lower is the one-sided Clopper–Pearson bound at level α, and the certificate is
        (ĉ_A, noise.radius(p_lower, d)) if p_lower ≥ ½, else an abstention with radius 0; d =
        x.numel() is the input dimension C·H·W. The radius is σ·Φ⁻¹(p_lower) in L2 for Gaussian
        noise, 2λ·(p_lower − ½) in L1 for uniform noise; ``radii`` holds it in every norm.
        An x outside [0, 1] is warned about (:class:`InputRangeWarning`): the radius is then in
        x's units.
        """
        _warn_outside_unit_range(x)
        return self._run_one(self.certify_program(x, n0, n, alpha, generator), plain(batch_size))

    def predict_program(self, x, n, alpha, generator=None):
        """:meth:`predict` as an engine program (``sampling.Draws`` in, counts back)."""
        n, alpha = check_count("n", plain(n)), check_probability("alpha", plain(alpha))
        x, generator = self.prepare(x, generator)
        (counts,) = yield Draws(x, self.noise, (n,), generator)
        top2 = torch.topk(torch.from_numpy(counts), 2)
        c1, c2 = (int(v) for v in top2.values)
        pvalue = binomial_pvalue(c1, c2)
        abstained = pvalue > alpha
        prediction = None if abstained else int(top2.indices[0])
        return Prediction(prediction, abstained, c1, c2, pvalue, n, alpha)

    def certify_program(self, x, n0, n, alpha, generator=None):
        """:meth:`certify` as an engine program. The n0 selection draws and the n estimation
        draws are one request of two segments: every class is counted in both, so the
        estimation draws need not wait for the selection (ĉ_A only picks which count to read)."""
        n0, n = check_count("n0", plain(n0)), check_count("n", plain(n))
        alpha = check_probability("alpha", plain(alpha))
        self.noise.scalar_sigma()  # per-sample σ is refused before any draw
        x, generator = self.prepare(x, generator)
        selection, estimation = yield Draws(x, self.noise, (n0, n), generator)
        c_hat = int(selection.argmax())
        n_a = int(estimation[c_hat])
        p_lower = clopper_pearson_lower(n_a, n, alpha)
        return certificate(self.noise, c_hat, p_lower, n_a, n0, n, alpha, x.numel())

    def with_noise(self, noise) -> Smoothed:
        """The same base model and engine smoothed with another noise (e.g. at a σ per input)."""
        return Smoothed(self.model, noise, self.num_classes, self.engine)

    def votes_program(self, x, n: int, generator=None):
        """The counts (num_classes,) int64 array of argmax f(x + δ) over n draws, as an engine
        program (what a certifier with its own class selection needs)."""
        n = check_count("n", plain(n))
        x, generator = self.prepare(x, generator)
        (counts,) = yield Draws(x, self.noise, (n,), generator)
        return counts

    def soft_scores(self, x, n: int, batch_size: int, generator=None) -> torch.Tensor:
        """(1/n)·Σ_i softmax f(x + δ_i), float64 (num_classes,) on the model's device: the Monte
        Carlo estimate of the soft smoothed classifier E[softmax f(x + δ)] (Salman et al. 2019);
        see ``sampling.BatchedVotes.soft_scores``."""
        n, batch_size = check_count("n", plain(n)), plain(batch_size)
        x, generator = self.prepare(x, generator)
        with eval_mode(self.model):
            return self.engine.soft_scores(self.model, x, self.noise, n, self.num_classes,
                                           batch_size, generator)

    def run(self, programs, batch_size: int):
        """Drive many ``(key, program)`` pairs through the engine, batches filled across inputs;
        yields ``sampling.Finished`` as programs end."""
        check_count("batch_size", batch_size)
        with eval_mode(self.model):
            yield from self.engine.run(self.model, programs, self.num_classes, batch_size)

    def prepare(self, x, generator=None) -> tuple[torch.Tensor, torch.Generator | None]:
        """(x, generator) ready to draw: :meth:`prepare_input`'s x, and the generator, an
        integer seed made a generator on the model's device."""
        generator = self.as_generator(generator)
        return self.prepare_input(x, generator), generator

    def as_generator(self, generator) -> torch.Generator | None:
        """``generator`` as a ``torch.Generator`` (or None): an integer seed (≥ 0, numpy's
        too) seeds a new generator on the model's device; anything else is refused."""
        if generator is None or isinstance(generator, torch.Generator):
            return generator
        if isinstance(generator, numbers.Integral) and not isinstance(generator, bool) \
                and 0 <= generator < 2**64:
            return torch.Generator(device=model_device(self.model)).manual_seed(int(generator))
        raise SmoothcertError("generator must be a torch.Generator, an integer seed in "
                              f"[0, 2**64) or None, got {generator!r}")

    def prepare_input(self, x, generator=None) -> torch.Tensor:
        """``x`` checked (a finite (C, H, W) float tensor of the model's input shape) and moved to
        the model's device; ``generator`` must be a ``torch.Generator`` on that device, or None.

        Noise is drawn and added in x's dtype, which is float32, or float64 where both x and
        the model are (a float64 x of a lower-precision model is cast to float32, a float16 x
        up to it: noise rounded to 16 bits is not the noise certified); the engine casts the
        noisy batch to the model's dtype (``BatchedVotes.forward``)."""
        device = model_device(self.model)
        x = self._validated_input(x)
        wide = torch.promote_types(input_dtype(self.model) or x.dtype, torch.float32)
        dtype = torch.float64 if x.dtype == torch.float64 == wide else torch.float32
        x = x.to(device=device, dtype=dtype)
        self.noise.check_input(x)  # the sound noises need 8-bit inputs: refused before any draw
        if generator is not None and not isinstance(generator, torch.Generator):
            raise SmoothcertError(f"generator must be a torch.Generator or None, got "
                                  f"{type(generator).__name__}")
        if generator is not None and generator.device.type != device.type:
            raise SmoothcertError(
                f"the generator is on {generator.device} but the model is on {device}; "
                "create it with torch.Generator(device=...)"
            )
        return x

    def _run_one(self, program, batch_size: int):
        (done,) = self.run([(None, program)], batch_size)
        return done.result

    def _validated_input(self, x) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise SmoothcertError("x must be a floating-point tensor of shape (C, H, W)")
        expected = getattr(self.model, "input_shape", None)
        if x.dim() != 3 or (expected is not None and tuple(x.shape) != tuple(expected)):
            want = tuple(expected) if expected is not None else "(C, H, W)"
            raise SmoothcertError(f"input shape {tuple(x.shape)} does not match the model's {want}")
        if not torch.isfinite(x).all():
            raise SmoothcertError("input contains NaN or Inf")
        return x


def certificate(noise: Noise, c_hat: int, p_lower: float, n_a: int, n0: int, n: int,
                alpha: float, dim: int) -> Certificate:
    """CERTIFY's answer for class ``c_hat`` with bound ``p_lower`` at an input of ``dim`` = C·H·W
    coordinates: an abstention (radius 0 in every norm) when p_lower < ½, else the radius
    ``noise.radius(p_lower, dim)`` in the noise's norm and :func:`noise_radii` in every norm."""
    sigma = noise.scalar_sigma()
    if p_lower < 0.5:
        return Certificate(None, 0.0, p_lower, True, n_a, n0, n, alpha, sigma, dict(NO_RADII))
    radii = noise_radii(noise, p_lower, dim)
    radius = float(noise.radius(p_lower, dim))
    radii[noise.norm] = radius  # the primary norm's column is ``radius``, to the last bit
    return Certificate(c_hat, radius, p_lower, False, n_a, n0, n, alpha, sigma, radii)


def _warn_outside_unit_range(x) -> None:
    """:class:`InputRangeWarning` at the line that called ``predict`` or ``certify``."""
    span = outside_unit_range(x)
    if span is not None:
        warnings.warn(unit_range_message(*span), InputRangeWarning, stacklevel=3)


def plain(value):
    """A numpy scalar as the Python number it stands for (np.int64 → int, np.float32 → float),
    so that the checks, which refuse bools, accept every integer and real type; anything else
    is returned as it is, for the checks to refuse."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _noise(noise) -> Noise:
    """The noise object; a number is the σ of Gaussian noise (``Smoothed(model, 0.25, 10)``).
    Values that cannot be a noise (None, a bool, text, a container, a tensor) are refused; any
    other object is taken as a noise (duck-typed, as plug-ins and test doubles are)."""
    if isinstance(noise, numbers.Real) and not isinstance(noise, bool):
        return Gaussian(noise)
    if not isinstance(noise, (bool, str, bytes, list, tuple, dict, set, torch.Tensor)) and \
            noise is not None:
        return noise
    raise SmoothcertError("noise must be a Noise object (e.g. Gaussian(0.25), Uniform(0.5)) or "
                          f"a number, the σ of Gaussian noise; got {type(noise).__name__}")
