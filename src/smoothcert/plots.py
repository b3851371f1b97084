"""Figures from record files (matplotlib, Agg canvas).

matplotlib is imported inside the functions, never at import of the package, and figures are
built on an explicit ``FigureCanvasAgg``: pyplot is not used, so no backend is switched and no
figure is left registered in global state.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .errors import SmoothcertError, check_positive_finite
from .metrics import certified_accuracy_curve
from .records import Records

MARGIN = 1.05  # the x axis runs 5% past the largest radius, so every curve visibly drops to 0


def plot_certified_accuracy(
    records_list: Sequence[Records], path, max_radius: float | None = None
) -> Path:
    """Plot certified accuracy against L2 radius, one exact step curve per file; save to ``path``.

    Files without a radius column (PREDICT files) are skipped; if none has one, SmoothcertError.
    The x axis spans ``[0, max_radius]`` (default: 5% past the largest certified radius). The
    format follows the suffix of ``path`` (PNG if none); the file is written through a temporary
    file in the same directory and a rename, so it is never half-written. Returns the path.
    """
    curves = {r.name: certified_accuracy_curve(r) for r in records_list if "radius" in r}
    if not curves:
        raise SmoothcertError("no record file has a radius column; nothing to plot")
    if max_radius is None:
        max_radius = MARGIN * max(float(r[-1]) for r, _ in curves.values()) or 1.0
    check_positive_finite("max_radius", max_radius)
    fig = _figure(curves, float(max_radius))
    return _save_atomic(fig, Path(path))


def _figure(curves: dict, max_radius: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, (radii, acc) in curves.items():
        x, y = _clip_steps(radii, acc, max_radius)
        ax.step(x, y, where="pre", label=name)  # value y[i] on (x[i-1], x[i]]
    ax.set_xlim(0.0, max_radius)
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("L2 radius")
    ax.set_ylabel("certified accuracy")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")
    return fig


def _clip_steps(radii: np.ndarray, acc: np.ndarray, max_radius: float):
    """Breakpoints up to ``max_radius``, plus that end point with its value (0 past the last)."""
    keep = radii < max_radius
    end_value = acc[np.searchsorted(radii, max_radius)] if max_radius <= radii[-1] else 0.0
    return np.append(radii[keep], max_radius), np.append(acc[keep], end_value)


def _save_atomic(fig, path: Path) -> Path:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise SmoothcertError(f"plot directory {parent} does not exist; create it first")
    fmt = path.suffix[1:].lower() or "png"
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        fig.savefig(tmp, format=fmt, dpi=150)
        os.replace(tmp, path)
    except ValueError as e:  # matplotlib: "Format 'xyz' is not supported"
        raise SmoothcertError(f"cannot write plot {path}: {e}") from e
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path
