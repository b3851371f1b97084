"""Translation with cyclic (wrap-around) padding (Li et al., TSS, CCS
2021, §5.1 "translation"; the authors' ``Translational`` in ``semantic/transforms.py``).

The authors draw (dx, dy) ~ N(0, σ²I) (``gen_param``), round each to the nearest integer
(Python's ``round``: half to even, as ``torch.round``) and shift the image cyclically:
out[i, j] = x[(i + dx) mod H, (j + dy) mod W], dx along the rows, dy along the columns (their
``proc``, written with slices). Cyclic shifts by integers compose exactly, so the
transformation is resolvable and the certificate is Cohen et al.'s in the two dimensions of
the shift: with probability ≥ 1 − α the smoothed classifier predicts its class on every
cyclic shift of x by an integer vector (a, b) with ‖(a, b)‖₂ < ``radius`` = σ Φ⁻¹(p_lower)
(their ``TranslationTransformer.calc_radius``; :func:`smoothcert.stats.tss.translation_radius`).
The authors' black-padding variant (``BlackTranslational``) is not resolvable; it is certified
by enumeration, as in their code: the ``shift-enumeration`` certifier.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SmoothcertError, check_positive_finite
from ..registry import option
from ..stats.tss import translation_radius
from .base import Transformation, register_transformation


def cyclic_shift(x: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W): row b of ``x`` (B, C, H, W), or the one image x (C, H, W), shifted by the
    integers ``shifts[b]`` = (dx, dy): out[b, c, i, j] = x[c, (i + dx) mod H, (j + dy) mod W]
    (``torch.roll(x, (−dx, −dy), (1, 2))`` for one row)."""
    count = shifts.shape[0]
    batch = x.expand(count, *x.shape) if x.dim() == 3 else x
    c, h, w = batch.shape[1:]
    shifts = shifts.to(device=x.device, dtype=torch.long)
    rows = torch.remainder(torch.arange(h, device=x.device)[None, :] + shifts[:, :1], h)
    cols = torch.remainder(torch.arange(w, device=x.device)[None, :] + shifts[:, 1:], w)
    out = batch.gather(2, rows[:, None, :, None].expand(count, c, h, w))
    return out.gather(3, cols[:, None, None, :].expand(count, c, h, w))


@register_transformation("translation")
class Translation(Transformation):
    """Cyclic translation by (dx, dy) ~ N(0, σ²I) rounded to whole pixels (Li et al. 2021):
    certifies every shift of ℓ2 length < radius.

    The image wraps around its edges, as the authors' ``Translational``."""

    unit = "shift, pixels (l2 of (dx, dy))"
    parameters = ("dx", "dy")
    example = "translation:sigma=3"

    @dataclass(frozen=True)
    class Options:
        sigma: float = option(3.0, "σ, pixels: the std of each of dx and dy, at most the "
                                   "image's side (their MNIST example: 3)")

        def __post_init__(self):
            check_positive_finite("sigma", self.sigma)

    def draw(self, count, generator, device="cpu"):
        """(count, 2) float64 (dx, dy) = σ z, z one standard normal pair per row from
        ``generator`` (one call, row-major), unrounded (:meth:`apply` rounds)."""
        z = torch.randn((count, 2), generator=generator, dtype=torch.float64, device=device)
        return z.mul_(self.sigma)

    def apply(self, x, params):
        """The cyclic shift by (round(dx), round(dy)) of each row (half to even)."""
        return cyclic_shift(x, torch.round(params))

    def radius(self, p_lower):
        return translation_radius(p_lower, self.sigma)

    def check_shape(self, shape):
        """Refuse a σ larger than the image's shorter side (``shape`` (C, H, W))."""
        check_fits(self.sigma, tuple(shape)[-2:])


def check_fits(sigma: float, size) -> None:
    """One SmoothcertError line when a shift's σ exceeds the shorter side of an (H, W) image:
    such shifts wrap around it, and their radius says nothing of a shift within the image."""
    h, w = (int(s) for s in size)
    if sigma > min(h, w):
        raise SmoothcertError(f"translation sigma {sigma:g} pixels is larger than the "
                              f"{h}x{w} image; give sigma <= {min(h, w)}")

