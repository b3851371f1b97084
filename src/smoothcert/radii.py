"""The one grammar of radius grids: ``start:stop:step`` or a comma list (report tables, attack
distances, the sequential certifier's grid)."""

from __future__ import annotations

import math

from .errors import SmoothcertError

MAX_RADII = 10_000  # a radius grid longer than this is a typo, not a table
# Inputs lie in [0, 1]^d, so no two are farther apart than d (L1) or √d (L2): a larger radius
# certifies nothing more than the whole input space. 1e12 keeps every image size (d ≤ 1e12)
# and keeps r / σ finite in float64 for any σ above 1e-296 (Φ(r/σ) then needs no overflow).
MAX_RADIUS = 1e12


def parse_radii(text: str) -> tuple[float, ...]:
    """Radii from ``"start:stop:step"`` (stop included, within rounding) or ``"0,0.5,1"``.

    Grid points are ``round(start + i·step, 10)``, so ``"0:0.5:0.1"`` gives exactly
    0, 0.1, 0.2, 0.3, 0.4, 0.5 (no accumulated floating-point error). Radii must be finite,
    non-negative, at most :data:`MAX_RADIUS` and distinct (−0 reads as 0); anything else raises
    SmoothcertError.
    """
    text = str(text).strip()
    if not text:
        raise SmoothcertError("radii are empty; give 'start:stop:step' (e.g. 0:1:0.25) or '0,1'")
    radii = _parse_range(text) if ":" in text else tuple(_number(p, text) for p in text.split(","))
    _check_radii(radii, text)
    return radii


def _parse_range(text: str) -> tuple[float, ...]:
    parts = text.split(":")
    if len(parts) != 3:
        raise SmoothcertError(f"radii {text!r}: a range needs exactly 'start:stop:step'")
    start, stop, step = (_number(p, text) for p in parts)
    if step <= 0:
        raise SmoothcertError(f"radii {text!r}: step must be positive, got {step!r}")
    if stop < start:
        raise SmoothcertError(f"radii {text!r}: stop {stop!r} is below start {start!r}")
    steps = (stop - start) / step + 1e-9  # 1e-9: stop counts despite rounding; inf: step ≪ span
    if steps >= MAX_RADII:  # (floor(steps) + 1 radii: checked before floor, which refuses inf)
        raise SmoothcertError(f"radii {text!r} give more than {MAX_RADII} radii; at most "
                              f"{MAX_RADII} allowed")
    count = math.floor(steps) + 1
    return tuple(round(start + i * step, 10) for i in range(count))


def _number(part: str, text: str) -> float:
    try:
        value = float(part)
    except ValueError:
        raise SmoothcertError(f"radii {text!r}: {part.strip()!r} is not a number") from None
    if not math.isfinite(value):
        raise SmoothcertError(f"radii {text!r}: {part.strip()!r} is not a finite number")
    if value > MAX_RADIUS:
        raise SmoothcertError(f"radii {text!r}: {part.strip()} is above {MAX_RADIUS:g}, farther "
                              "than two inputs in [0, 1]^d can lie apart (d in L1, √d in L2)")
    return value + 0.0  # -0.0 -> 0.0


def _check_radii(radii: tuple[float, ...], text: str) -> None:
    negative = [r for r in radii if r < 0]
    if negative:
        raise SmoothcertError(f"radii {text!r}: a radius cannot be negative, got {negative[0]!r}")
    if len(set(radii)) != len(radii):
        raise SmoothcertError(f"radii {text!r}: each radius may appear only once")
