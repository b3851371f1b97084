"""Figures from record files (matplotlib, Agg canvas).

matplotlib is imported inside the functions, never at import of the package, and figures are
built on an explicit ``FigureCanvasAgg``: pyplot is not used, so no backend is switched and no
figure is left registered in global state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import SmoothcertError, check_positive_finite
from ..io import atomic_write
from ..runs.records import Records
from .metrics import attack_curve, certified_accuracy_curve, envelope_curve, pa_ecdf

MARGIN = 1.05  # the x axis runs 5% past the largest radius, so every curve visibly drops to 0
LEGEND_INSIDE_MAX = 6  # curves whose legend fits inside the axes; more go beside them


def plot_certified_accuracy(
    records_list: Sequence[Records], path, max_radius: float | None = None,
    envelope: bool = False, norm: str | None = None,
) -> Path:
    """Plot certified accuracy (in %) against radius, one exact step curve per file; save to
    ``path``. The figure is :func:`certified_accuracy_figure`'s.

    The format follows the suffix of ``path`` (PNG if none); the file is written through a
    temporary file in the same directory and a rename, so it is never half-written. Returns the
    path.
    """
    return _save_atomic(certified_accuracy_figure(records_list, max_radius, envelope, norm),
                        Path(path))


def certified_accuracy_figure(records_list: Sequence[Records], max_radius: float | None = None,
                              envelope: bool = False, norm: str | None = None):
    """The figure of :func:`plot_certified_accuracy` (a matplotlib ``Figure``), ready to paste:

    * y: certified accuracy in percent, as the tables show it; x: the certificate's radius in
      the norm of the files' noise (L2 for Gaussian, L1 for uniform), one for all files.
    * The run parameters σ, n, α that all files share go into the title; those that differ go
      into each file's legend entry, after its name.
    * For CERTIFY files, a dotted vertical line marks the largest radius their ``n`` draws can
      certify, σΦ⁻¹(α^(1/n)) for Gaussian noise (all n votes for the class: p_lower =
      α^(1/n)); no curve can pass it, whatever the model.

    Files without a radius column (PREDICT files) are skipped; if none has one, SmoothcertError.
    With ``envelope`` the σ-envelope of the files (the best of them at each radius) is drawn on
    top as a dashed black curve. The x axis spans ``[0, max_radius]`` (default: 5% past the
    largest certified radius or marked limit). ``norm``: the files' ``radius`` columns hold the
    radius in that norm (``report --norm``, :func:`~.norms.in_norm`); the axis says it, and the
    n-limited radius is taken in it. A certifier's own unit (a patch side) is said on the axis.
    Without ``norm``, files of different norms are refused in one line (one axis, one norm).
    """
    certified = [r for r in records_list if "radius" in r]
    if not certified:
        raise SmoothcertError("no record file has a radius column; nothing to plot")
    axis = _radius_axis(certified, norm, envelope)  # before any work: one line if refused
    curves = [(r.name, certified_accuracy_curve(r)) for r in certified]  # names may repeat
    params = [run_parameters(r) for r in certified]
    limits = [n_limited_radius(r, norm) for r in certified]
    if max_radius is None:
        largest = max([float(r[-1]) for _, (r, _) in curves]
                      + [lim for lim in limits if lim is not None])
        max_radius = MARGIN * largest or 1.0
    check_positive_finite("max_radius", max_radius)
    fig, ax = _figure(axis, "certified accuracy (%)")
    common = {k: v for k, v in params[0].items() if all(p.get(k) == v for p in params)}
    colors = []
    for (name, (radii, acc)), own in zip(curves, params):
        x, y = _clip_steps(radii, acc, max_radius)
        extra = _parameter_text({k: v for k, v in own.items() if k not in common})
        label = f"{name} ({extra})" if extra else name
        (line,) = ax.step(x, 100 * y, where="pre", label=label)  # value y[i] on (x[i-1], x[i]]
        colors.append(line.get_color())
    if envelope:
        x, y = _clip_steps(*envelope_curve(records_list), max_radius)
        ax.step(x, 100 * y, where="pre", label="envelope", color="black", linestyle="--",
                linewidth=1.6)
    _mark_limits(ax, limits, colors)
    if common:
        ax.set_title(_parameter_text(common), fontsize="medium")
    _finish(ax, max_radius, "upper right", y_max=102.0, curves=len(curves) + envelope)
    return fig


def _mark_limits(ax, limits: Sequence[float | None], colors: Sequence) -> None:
    """A dotted vertical line at each distinct n-limited radius, in the color of its curve
    (grey where several curves share it), with one legend entry for all of them."""
    distinct = sorted({lim for lim in limits if lim is not None})
    for lim in distinct:
        owners = [c for c, other in zip(colors, limits) if other == lim]
        ax.axvline(lim, color=owners[0] if len(owners) == 1 else "grey", linestyle=":",
                   linewidth=1.2)
    if distinct:  # the legend's sample in grey: it stands for every line
        ax.plot([], [], color="grey", linestyle=":", linewidth=1.2,
                label="largest radius n draws can certify")


PARAMETERS = (("sigma", "σ"), ("n", "n"), ("alpha", "α"))  # record column, symbol


def run_parameters(records: Records) -> dict[str, float]:
    """σ, n and α of a record file, by column name: each column's value where all its rows
    agree, else the manifest identity's (e.g. a sequential run's n_max); omitted where neither
    says (Cohen et al.'s files). A run that drew no noise (identity noise "none": ablation,
    a semantic transformation) has no σ to say."""
    identity = (records.manifest or {}).get("identity", {})
    found = {}
    for column, _ in PARAMETERS:
        if column == "sigma" and identity.get("noise") == "none":  # smoothing.ablation.NO_NOISE
            continue
        values = np.unique(records[column]) if column in records and len(records) else ()
        if len(values) == 1:
            found[column] = values[0].item()
        elif isinstance(identity.get(column), (int, float)):
            found[column] = identity[column]
    return found


def n_limited_radius(records: Records, norm: str | None = None) -> float | None:
    """The largest radius CERTIFY can return with the file's n draws at level α, the noise's
    radius at p_lower = α^(1/n) (σΦ⁻¹(α^(1/n)) for Gaussian noise), in ``norm`` (None: the
    noise's own; another: ``noise.radii``); None unless the file is a CERTIFY file (its
    manifest's certifier, or the CERTIFY columns ``n0``, ``p_lower`` without a manifest) with
    one σ, n and α, and where the radius needs the input dimension d, a dataset that fixes
    it."""
    from ..certifiers.certify import input_dim
    from ..noise.base import NOISES

    identity = (records.manifest or {}).get("identity")
    if identity is not None and identity.get("certifier") != "certify":
        return None
    if identity is None and not ("n0" in records and "p_lower" in records):
        return None
    params = run_parameters(records)
    if len(params) < len(PARAMETERS):
        return None
    noise = NOISES[(identity or {}).get("noise", "gaussian")](float(params["sigma"]))
    p_lower = float(params["alpha"]) ** (1.0 / int(params["n"]))
    dim = input_dim((identity or {}).get("dataset"))
    if norm is None or norm == noise.norm:
        return None if noise.needs_dim and dim is None else float(noise.radius(p_lower, dim))
    return None if dim is None else float(noise.radii(p_lower, dim)[norm])


def _parameter_text(params: dict) -> str:
    """``σ=0.25, n=100000, α=0.001`` for the parameters given, in that order."""
    return ", ".join(f"{symbol}={params[column]:g}" if column != "n" else
                     f"{symbol}={int(params[column])}"
                     for column, symbol in PARAMETERS if column in params)


def _radius_axis(records_list: Sequence[Records], norm: str | None,
                 envelope: bool = False) -> str:
    """The x axis's label: ``L∞ radius`` for a chosen norm or files of ℓ∞ noise (``L2``,
    ``L1``: of theirs), ``radius (patch side, pixels)`` when the files' certifier gives its
    radius that unit, ``radius`` for a noise this smoothcert does not know; files of several
    norms are refused in one line (:func:`~.norms.radius_units`), a certifier's unit beside
    another is said: ``radius (units differ by file)`` (the table's ``radius in`` tells), but
    refused for an ``envelope`` (the best file at each radius needs one unit)."""
    from .norms import radius_units

    if envelope:
        _radius_norm(records_list, norm, "--envelope")
    if len(radius_units(records_list, norm)) > 1:
        return "radius (units differ by file)"
    return _radius_text(_radius_norm(records_list, norm))


def _radius_text(unit: str | None) -> str:
    """``L2 radius``, ``radius (patch side, pixels)``, or ``radius`` (None: unknown)."""
    if unit in AXIS_NORMS.values():
        return f"{unit} radius"
    return "radius" if unit is None else f"radius ({unit})"


AXIS_NORMS = {"l1": "L1", "l2": "L2", "linf": "L∞"}
"""How the plots' axes write each norm (as the papers' figures do: "L2 radius")."""


def _radius_norm(records_list: Sequence[Records], norm: str | None = None,
                 flag: str = "--plot") -> str | None:
    """What the files' radii are read in, as an axis writes it: ``norm``'s (``L∞``), else the
    norm of the files' noise (``L1`` for uniform noise; Cohen et al.'s files: ``L2``), else
    their certifier's unit; None for a noise this smoothcert does not know. Files of several
    units are refused in one line naming ``flag`` (:func:`~.norms.one_unit`)."""
    from .norms import one_unit

    unit = one_unit(records_list, norm, flag)
    return AXIS_NORMS.get(unit, unit)


def plot_pa_ecdf(records_list: Sequence[Records], path) -> Path:
    """Write :func:`pa_ecdf_figure` to ``path`` (atomically, as
    :func:`plot_certified_accuracy`)."""
    return _save_atomic(pa_ecdf_figure(records_list), Path(path))


ECDF_PAD = 0.03  # the p̂_A axis runs this far past 0 and 1, so no step sits on the border


def pa_ecdf_figure(records_list: Sequence[Records]):
    """The empirical CDF of p̂_A, one step curve per CERTIFY file (Sun, Mao, Müller &
    Vechev 2024, Fig. 3).

    x: p̂_A, the frequency of the true label among the noisy draws
    (:func:`smoothcert.evaluation.metrics.pa_hat` says how it is read from records); y: the
    fraction of examples with p̂_A ≤ x. The dotted line at ½ separates hard from easy examples;
    the height of a curve just below ½ is the fraction of hard ones. The axes run
    :data:`ECDF_PAD` past [0, 1] on both scales, and each curve on to their ends (0 before
    p̂_A = 0, 1 from p̂_A = 1 on), so its first and last steps (the jump of the examples at
    p̂_A = 1, often the largest) are drawn inside the axes, not on their frame.
    """
    fig, ax = _figure("p̂_A (frequency of the true label under noise)",
                      "fraction of examples with p̂_A ≤ x")
    for r in records_list:
        points, cdf = pa_ecdf(r)
        # right-continuous: 0 before the first value, F(t) from each value t on, 1 from 1 on
        ax.step(np.concatenate([[-ECDF_PAD], points, [1.0, 1.0 + ECDF_PAD]]),
                np.concatenate([[0.0], cdf, [1.0, 1.0]]), where="post", label=r.name)
    ax.axvline(0.5, color="grey", linestyle=":", linewidth=1)
    _finish(ax, 1.0, "upper left")
    ax.set_xlim(-ECDF_PAD, 1.0 + ECDF_PAD)
    ax.set_ylim(-ECDF_PAD, 1.0 + ECDF_PAD)
    return fig


SIGMA_BINS = 30  # bins of the σ histogram, shared by every file


def plot_sigma_histogram(records_list: Sequence[Records], path) -> Path:
    """Plot the histogram of each file's per-example σ (its ``sigma`` column: σ_x for
    data-dependent files, one σ for the others), one step outline per file over
    :data:`SIGMA_BINS` bins shared by all files; save to ``path`` (atomically, as
    :func:`plot_certified_accuracy`).

    x: σ (the noise's standard deviation); y: the fraction of the file's examples in each bin,
    so that files of different sizes compare. A fixed-σ file is one bar at its σ. A file
    without a sigma column, or none with a row, is one SmoothcertError.
    """
    values = []
    for r in records_list:
        if "sigma" not in r or not len(r):
            raise SmoothcertError(f"the σ histogram needs rows with a sigma column; {r.path} "
                                  "has none")
        values.append(np.asarray(r["sigma"], dtype=np.float64))
    low, high = min(v.min() for v in values), max(v.max() for v in values)
    pad = (0.05 * abs(high) or 0.05) if low == high else 0.0  # one σ for all: a bar around it
    edges = np.linspace(low - pad, high + pad, SIGMA_BINS + 1)
    fig, ax = _figure("σ (per example)", "fraction of examples")
    peak = 0.0
    for r, v in zip(records_list, values):
        heights, _, _ = ax.hist(v, bins=edges, weights=np.full(v.size, 1.0 / v.size),
                                histtype="step", label=r.name)
        peak = max(peak, float(np.max(heights)))
    margin = 0.1 * (edges[-1] - edges[0])  # the bins, with some room on both sides
    _finish(ax, edges[-1] + margin, "best", y_max=1.05 * peak)
    ax.set_xlim(max(0.0, edges[0] - margin), edges[-1] + margin)
    return _save_atomic(fig, Path(path))


def plot_attack_curve(records_list: Sequence[Records], path) -> Path:
    """Plot the attack curves of attack record files: the fraction of attacked examples whose
    smoothed prediction was flipped within each L2 distance (Campbell et al., Figs. 2 and 5);
    save to ``path`` (atomically). A curve ends at its success rate."""
    curves = {r.name: attack_curve(r) for r in records_list}
    end = MARGIN * max(float(d[-1]) for d, _ in curves.values()) or 1.0
    fig, ax = _figure("L2 distance", "fraction of attacked examples flipped")
    for name, (distances, flipped) in curves.items():
        # right-continuous: the value at d[i] holds on [d[i], d[i+1])
        ax.step(np.append(distances, end), np.append(flipped, flipped[-1]), where="post",
                label=name)
    _finish(ax, end, "lower right")
    return _save_atomic(fig, Path(path))


def line_styles():
    """The curves' (color, linestyle) cycle: the ten tab10 colors solid, then dashed, dotted and
    dash-dotted, so up to 40 curves stay distinct (the default cycle repeats after ten, and a
    study's σ = 0.5 figure has twelve)."""
    from cycler import cycler
    from matplotlib import colormaps

    return (cycler(linestyle=["-", "--", ":", "-."])
            * cycler(color=[colormaps["tab10"](i) for i in range(10)]))


def _figure(xlabel: str, ylabel: str):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_prop_cycle(line_styles())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return fig, ax


def _finish(ax, x_max: float, legend: str, y_max: float = 1.02,
            curves: int | None = None) -> None:
    """Axes limits, grid and legend: inside the axes unless more than LEGEND_INSIDE_MAX
    ``curves`` (default: every legend entry) would hide them."""
    ax.set_xlim(0.0, x_max)
    ax.set_ylim(0.0, y_max)
    ax.grid(alpha=0.3)
    if curves is None:
        curves = len(ax.get_legend_handles_labels()[1])
    if curves > LEGEND_INSIDE_MAX:  # a long legend would hide the curves: put it beside
        ax.figure.set_size_inches(8.0, 3.5)
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    else:
        ax.legend(loc=legend, fontsize="small")


def _clip_steps(radii: np.ndarray, acc: np.ndarray, max_radius: float):
    """Breakpoints up to ``max_radius``, plus that end point with its value (0 past the last)."""
    keep = radii < max_radius
    end_value = acc[np.searchsorted(radii, max_radius)] if max_radius <= radii[-1] else 0.0
    return np.append(radii[keep], max_radius), np.append(acc[keep], end_value)


def plot_cost_frontier(records_list: Sequence[Records], path, radius: float, *,
                       norm: str | None = None) -> Path:
    """Write :func:`cost_figure` to ``path``, atomically, as :func:`plot_certified_accuracy`."""
    return _save_atomic(cost_figure(records_list, radius, norm=norm), Path(path))


def cost_figure(records_list: Sequence[Records], radius: float, *, norm: str | None = None):
    """Certified accuracy (in %) at ``radius`` against forward passes per example
    (:func:`~smoothcert.evaluation.metrics.forward_passes`: an ensemble's count its members';
    log scale), one labelled point per file (files at the same point share it and its label);
    the files no cheaper file matches or beats are joined by a line (the Pareto frontier of the
    run's choices). Every file needs a radius column and a count of its passes, and a count
    above 0 (a log axis has no 0): SmoothcertError otherwise.

    Layout: the labels sit beside their points, each at the first of a few offsets where it
    stays inside the axes and clear of the other labels and points (:func:`_place_labels`);
    the legend sits below the axes, never over a point. ``radius`` is in ``norm``, or the
    files' one norm, as :func:`certified_accuracy_figure`'s axis; the y axis says which."""
    points = _cost_points(records_list, radius)
    where = _radius_text(_radius_norm(records_list, norm, "--plot-cost"))  # one unit
    fig, ax = _figure("forward passes per example (log scale)",
                      f"certified accuracy at {where} {radius:g} (%)")
    fig.set_size_inches(6.4, 4.4)
    groups: dict = {}  # (x, y) -> the names of the files there
    for x, y, name in points:
        groups.setdefault((x, y), []).append(name)
    for x, y in groups:
        ax.scatter([x], [y], zorder=3, s=30)
    frontier, best = [], -np.inf
    for x, y, _ in sorted(points, key=lambda p: (p[0], -p[1])):
        if y > best:
            frontier.append((x, y))
            best = y
    (line,) = ax.plot(*zip(*frontier), color="black", lw=1, ls="--", label="Pareto frontier")
    ax.set_xscale("log")
    _cost_limits(ax, [x for x, _ in groups], [y for _, y in groups])
    ax.grid(alpha=0.3)
    fig.legend(handles=[line], loc="outside lower center", fontsize="small", frameon=False)
    _place_labels(ax, [(x, y, "\n".join(names)) for (x, y), names in groups.items()])
    return fig


def _cost_points(records_list: Sequence[Records], radius) -> list:
    """(mean forward passes, certified accuracy % at ``radius``, name) of every file."""
    from .metrics import certified_accuracy, forward_passes

    if not (isinstance(radius, (int, float)) and 0 <= radius < float("inf")):
        raise SmoothcertError(f"the cost plot's radius must be a finite number >= 0, got "
                              f"{radius!r}")
    points = []
    for r in records_list:
        passes = forward_passes(r)
        if passes is None or "radius" not in r:
            lacks = "radius" if passes is not None else (
                "member_passes (a K-consensus ensemble's file from before that column)"
                if "n" in r else "n")
            raise SmoothcertError(f"--plot-cost needs radius and n columns; {r.path} lacks "
                                  f"{lacks}")
        mean = float(np.mean(passes)) if len(passes) else 0.0
        if not mean > 0:
            raise SmoothcertError(
                f"--plot-cost cannot place {r.path} on its log axis: it records 0 forward "
                "passes per example (an ensemble's lbound-heuristic file written before clean "
                "passes were counted); certify it again, or leave it out")
        points.append((mean, 100 * float(certified_accuracy(r, [radius])[0]), r.name))
    return points


def _cost_limits(ax, xs: Sequence[float], ys: Sequence[float]) -> None:
    """Axis limits with room around the points for their labels: a quarter of the span (at
    least a quarter of a decade) on both sides of the log x axis, 12% (at least 3 points of
    accuracy) above and below, within [0, 100] plus that room."""
    low, high = np.log10(min(xs)), np.log10(max(xs))
    pad = max(0.25 * (high - low), 0.25)
    ax.set_xlim(10 ** (low - pad), 10 ** (high + pad))
    bottom, top = min(ys), max(ys)
    room = max(0.12 * (top - bottom), 3.0)
    ax.set_ylim(max(bottom - room, -room / 2), min(top + room, 100 + room / 2))


LABEL_OFFSETS = ((6, 5, "left", "bottom"), (6, -5, "left", "top"), (-6, 5, "right", "bottom"),
                 (-6, -5, "right", "top"), (0, 8, "center", "bottom"),
                 (0, -8, "center", "top"), (8, 0, "left", "center"), (-8, 0, "right", "center"),
                 (0, 20, "center", "bottom"), (0, -20, "center", "top"))
"""(dx, dy in points, horizontal and vertical alignment) of a point's label, in the order
:func:`_place_labels` tries them: above right first."""


def _place_labels(ax, labelled: Sequence[tuple]) -> None:
    """Annotate each (x, y, text) at the first of :data:`LABEL_OFFSETS` whose box lies inside
    the axes and overlaps no label placed before it and no point (else at the offset with the
    least overlap). The layout is fixed first, so the boxes are the ones drawn; the labels are
    left out of the layout (they stay inside the axes)."""
    fig = ax.figure
    fig.draw_without_rendering()  # constrained layout: the axes' final place
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    clear = CLEARANCE * fig.dpi / 72  # around another point, in pixels
    dots = {(x, y): ax.transData.transform((x, y)) for x, y, _ in labelled}
    placed: list = []
    for x, y, text in sorted(labelled, key=lambda p: (p[0], -p[1])):
        others = [_square(*dot, clear) for key, dot in dots.items() if key != (x, y)]
        own = _square(*dots[(x, y)], 3 * fig.dpi / 72)  # the marker itself
        best = None
        for dx, dy, ha, va in LABEL_OFFSETS:
            label = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy),
                                ha=ha, va=va, fontsize=8, annotation_clip=False)
            label.set_in_layout(False)
            box = label.get_window_extent(renderer)
            cost = _overlap_cost(box, inside, [*placed, *others, own])
            if best is not None and cost >= best[0]:
                label.remove()
                continue
            if best is not None:
                best[1].remove()
            best = (cost, label, box)
            if cost == 0:
                break
        placed.append(best[2])


CLEARANCE = 9  # points kept free around another file's point, so a label names its own


def _square(x: float, y: float, half: float):
    from matplotlib.transforms import Bbox

    return Bbox.from_extents(x - half, y - half, x + half, y + half)


def _overlap_cost(box, inside, boxes: list) -> float:
    """Pixels² of ``box`` outside the axes (weighted up: a cut label is worst) and over
    ``boxes`` (earlier labels, points and the room kept around them)."""
    from matplotlib.transforms import Bbox

    clipped = Bbox.intersection(box, inside)
    outside = box.width * box.height - (clipped.width * clipped.height if clipped else 0.0)
    cost = 10 * outside
    for other in boxes:
        common = Bbox.intersection(box, other)
        cost += common.width * common.height if common else 0.0
    return cost


def _save_atomic(fig, path: Path) -> Path:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise SmoothcertError(f"plot directory {parent} does not exist; create it first")
    fmt = path.suffix[1:].lower() or "png"
    try:
        with atomic_write(path, binary=True) as f:
            fig.savefig(f, format=fmt, dpi=150)
    except ValueError as e:  # matplotlib: "Format 'xyz' is not supported"
        raise SmoothcertError(f"cannot write plot {path}: {e}") from e
    return path
