"""Scaling about the centre and TSS's bound on its error between sampled factors (Li et al.,
"TSS: Transformation-Specific Smoothing for Robustness Certification", CCS 2021, §5.2 and
appendix; authors' ``semantic/transforms.py: Resize.proc`` and ``semantic/
strict_resize_aliasing_analyze.py``: ``get_local_maps`` and its main loop).

The transformation. Output pixel p = (i, j) of T(x, s) samples x bilinearly at
c + (p − c)/s, c = ((H − 1)/2, (W − 1)/2). Write t = 1/s: the sample point moves on a line,
linearly in t, at speed r_p = |p − c| pixels per unit of t. A pixel whose sample point leaves
the image is 0 (the black border of a zoom-out): pixel p is inside the box exactly when
s ≥ e_p = max(1 − 2 min(i, H−1−i)/(H−1), 1 − 2 min(j, W−1−j)/(W−1)) (the authors'
``imgymin..imgymax`` × ``imgxmin..imgxmax``, written per pixel), its *entry factor*. The
distinct entry factors in (0, 1] are the authors' *dividing points* (``dvdpts``): T jumps there,
and is continuous (from the right at a dividing point) everywhere else.

The bound on one slice [a, b] of factors, from the authors. The slice holds at most one
dividing point d (more: refused, as theirs). Points s > d are measured from the right end
(e(s) = ‖T(x, s) − T(x, b)‖²), points s < d from the left end (‖T(x, s) − T(x, a)‖²), s = d
from the nearer of the two; without a dividing point every point is measured from b. On
R sub-intervals uniform in t (width δ) e is L-Lipschitz in t on each side of d, so a
sub-interval [s', s] on one side has max e ≤ (e(s') + e(s))/2 + L·δ/2, and the one holding d
has max e ≤ max(e(s) + L_r (1/d − 1/s), e(s') + L_l (1/s' − 1/d)) (each side from its own
end). M_j² is the largest of these.

The Lipschitz constant (their ``get_local_maps``). On a side of d the pixels inside the box do
not change; for such a pixel dT_p/dt = ∇B · (p − c), B the bilinear interpolant, whose gradient
in a cell is at most √2 times the cell's range of values; so |dT_p/dt| ≤ √2 r_p range. With
values ≥ 0, |T_p(t) − T_p(t₀)| ≤ max(T_p(t), T_p(t₀)) ≤ the largest cell value, and
|de/dt| ≤ 2 Σ_p |T_p(t) − T_p(t₀)|·|dT_p/dt| ≤ L = 2√2 Σ_p r_p Σ_c maxv_c(p)·maxd_c(p), maxv
and maxd the largest value and range over the cells p's sample point visits. A cell is named
by its *upper* corner, (⌈y⌉, ⌈x⌉), in an (H + 1)×(W + 1) map whose border entries hold the
edge pixels and 0 (range = value there). A coordinate moving over [y₁, y₂], y₁ < y₂, crosses
the open cells of indices ⌊y₁⌋ + 1 .. ⌈y₂⌉ (⌈y₁⌉ .. ⌈y₂⌉ unless y₁ is an integer, where the
cell below is never entered); one that does not move (the centre row) stays in ⌈y₁⌉, either
cell holding it bounding the derivative across. So a sample point visits only cells in the
rectangle of those row and column indices. **Difference from theirs:** they take the two end
cells (⌈y₁⌉, ⌈x₁⌉) and (⌈y₂⌉, ⌈x₂⌉) only, at the side's ends nudged inwards by their
EPS = 10⁻⁵ (which is what excludes the cell below an integer end); a point crossing a row line
and a column line in one slice visits a third, off-diagonal cell they miss. Ours takes all four
corners of the rectangle, which is the whole rectangle when each coordinate moves at most one
pixel per slice: max(cy, cx)·(1/a − 1/b) ≤ 1, which :func:`check_slices` enforces. Ours ≥
theirs but at knife edges (an end within EPS of a grid line); equal where no sample point
crosses both kinds of line in a slice (every compared slice of the golden fixture).

Floating point: everything in float64, finished with ``interpolation.raised_for_rounding``
(an over-estimate of the bound computed exactly).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import SmoothcertError
from .interpolation import _CHUNK_VALUES, bilinear, centre, distances, raised_for_rounding


def _entries_1d(n: int, device=None) -> torch.Tensor:
    """(n,) float64: the factor at which each row (column) of n enters the box, as theirs."""
    k = torch.arange(n, device=device, dtype=torch.float64)
    if n == 1:
        return torch.zeros(1, device=device, dtype=torch.float64)
    return 1.0 - 2.0 * torch.minimum(k, (n - 1) - k) / (n - 1.0)


def entry_factors(h: int, w: int, device=None) -> torch.Tensor:
    """(H, W) float64 e_p: pixel p is inside the box of T(x, s) exactly when s ≥ e_p."""
    return torch.maximum(_entries_1d(h, device)[:, None], _entries_1d(w, device)[None, :])


def dividing_points(h: int, w: int) -> torch.Tensor:
    """The distinct entry factors in (0, 1], increasing (their ``dvdpts``)."""
    values = torch.cat([_entries_1d(h), _entries_1d(w)])
    return torch.unique(values[values > 0.0])


def sources(h: int, w: int, factors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, 1) rows and (B, 1, W) columns where each output pixel samples the input:
    (p − c)/s + c for ``factors`` (B,) float64."""
    cy, cx = centre(h, w)
    s = factors.to(torch.float64)
    rows = torch.arange(h, device=s.device, dtype=torch.float64)
    cols = torch.arange(w, device=s.device, dtype=torch.float64)
    return ((rows[None, :] - cy) / s[:, None] + cy)[:, :, None], \
        ((cols[None, :] - cx) / s[:, None] + cx)[:, None, :]


def scale(x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) float64: x (C, H, W) (or row b of a batch) scaled by ``factors[b]`` about
    its centre, bilinearly, 0 outside the box (module docstring; factor 1 is x itself)."""
    h, w = x.shape[-2:]
    factors = factors.to(device=x.device, dtype=torch.float64)
    rows, cols = sources(h, w, factors)
    count = factors.shape[0]
    out = bilinear(x, rows.expand(count, h, w), cols.expand(count, h, w))
    inside = factors[:, None, None] >= entry_factors(h, w, x.device)
    return out * inside[:, None]


def check_slices(edges: torch.Tensor, size) -> None:
    """Refuse slices too wide for the bound at this image size (a sample point would move more
    than one pixel per coordinate), or holding two dividing points (one SmoothcertError line)."""
    h, w = size
    reach = max(centre(h, w))
    steps = 1.0 / edges[:-1] - 1.0 / edges[1:]
    step = float(steps.max())
    if reach * step > 1.0:
        need = math.ceil(reach * float(steps.sum()))
        raise SmoothcertError(
            f"slices of {step:.6g} in 1/scale are too wide for a {h}x{w} image: the bound on "
            f"the interpolation error needs each pixel to move at most one pixel per slice; "
            f"give at least {need} slices")
    points = dividing_points(h, w).to(edges.device)
    held = (points[None, :] >= edges[:-1, None]) & (points[None, :] <= edges[1:, None])
    many = torch.nonzero(held.sum(dim=1) > 1)
    if many.numel():
        j = int(many[0, 0])
        found = ", ".join(f"{float(p):.6g}" for p in points[held[j]])
        raise SmoothcertError(
            f"slice [{float(edges[j]):.6g}, {float(edges[j + 1]):.6g}] holds several factors "
            f"at which pixels of a {h}x{w} image cross the border ({found}); the bound takes "
            f"one per slice: give more slices")


def slice_dividers(edges: torch.Tensor, size) -> tuple[torch.Tensor, torch.Tensor]:
    """(S,) bool whether slice j holds a dividing point, and (S,) float64 the point (their
    ``local_sl − 10`` where it holds none: below the slice, so every point is right of it)."""
    points = dividing_points(*size).to(edges.device)
    held = (points[None, :] >= edges[:-1, None]) & (points[None, :] <= edges[1:, None])
    has = held.any(dim=1)
    chosen = torch.where(held, points[None, :], torch.zeros_like(points)[None, :]).amax(dim=1)
    return has, torch.where(has, chosen, edges[:-1] - 10.0)


def cell_maps(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, H + 1, W + 1) float64 maps: at (a, b) the largest value and the range of the cell
    of rows {a − 1, a}, columns {b − 1, b} (their ``map_maxv``, ``map_maxd``): off the image
    the value is 0 (and the range the largest value, on the map's border)."""
    img = x.to(torch.float64)
    high = F.max_pool2d(F.pad(img[None], (1, 1, 1, 1), value=0.0), 2, stride=1)[0]
    high = high.clamp(min=0.0)
    low = torch.zeros_like(high)
    low[:, 1:-1, 1:-1] = -F.max_pool2d(-img[None], 2, stride=1)[0]
    return high, high - low


def lipschitz(x: torch.Tensor, near: torch.Tensor, far: torch.Tensor,
              inside: torch.Tensor) -> torch.Tensor:
    """(K,) float64 L_k (per unit of 1/s) for the sides [near_k, far_k] (either order) of
    slices, counting the pixels ``inside`` (K, H, W) the box there (module docstring)."""
    c, h, w = x.shape
    maxv, maxd = (m.reshape(c, -1) for m in cell_maps(x))
    weight = distances(h, w, x.device)

    def span(one, two, n):
        low, high = torch.minimum(one, two), torch.maximum(one, two)
        first = torch.where(low < high, torch.floor(low) + 1.0, torch.ceil(low))
        return first.clamp_(0, n).long(), torch.ceil(high).clamp_(0, n).long()

    (ry1, cx1), (ry2, cx2) = sources(h, w, near), sources(h, w, far)
    rows, cols = span(ry1, ry2, h), span(cx1, cx2, w)
    count = near.shape[0]
    best_v = best_d = None
    for r in rows:
        for q in cols:
            index = (r * (w + 1) + q).expand(count, h, w).reshape(-1)
            v = maxv[:, index].reshape(c, count, h, w)
            d = maxd[:, index].reshape(c, count, h, w)
            best_v = v if best_v is None else torch.maximum(best_v, v)
            best_d = d if best_d is None else torch.maximum(best_d, d)
    per_pixel = (best_v * best_d).sum(dim=0) * inside * weight
    return per_pixel.sum(dim=(1, 2)) * (2.0 * math.sqrt(2.0))


def sub_points(low: torch.Tensor, high: torch.Tensor, subslices: int) -> torch.Tensor:
    """(K, R + 1) float64: each slice's ends and R − 1 points between, uniform in 1/s, from
    the right end down (their ``1/(local_k (local_c + k))``), the ends exact."""
    k = (1.0 / low - 1.0 / high) / subslices
    c = subslices / (high / low - 1.0)
    steps = torch.arange(subslices + 1, dtype=torch.float64, device=low.device)
    points = 1.0 / (k[:, None] * (c[:, None] + steps[None, :]))
    points = torch.minimum(torch.maximum(points, low[:, None]), high[:, None])
    points[:, 0], points[:, -1] = high, low
    return points


def _anchor_errors(x, points):
    """(K, R + 1) squared distances of T at ``points`` from T at the right end (column 0) and
    from T at the left end (the last column)."""
    count, width = points.shape
    images = scale(x, points.reshape(-1)).reshape(count, width, -1)
    right = ((images - images[:, :1]) ** 2).sum(dim=2)
    left = ((images - images[:, -1:]) ** 2).sum(dim=2)
    return right, left


def _combine(points, right, left, divider, lip_r, lip_l, subslices):
    """(K,) the largest bound over each slice's sub-intervals (module docstring)."""
    d = divider[:, None]
    e = torch.where(points > d, right, torch.where(points < d, left,
                                                   torch.minimum(right, left)))
    s_hi, s_lo = points[:, :-1], points[:, 1:]
    lr, ll = lip_r[:, None], lip_l[:, None]
    one_sided = torch.maximum(e[:, :-1] + lr * (1.0 / d - 1.0 / s_hi),
                              e[:, 1:] + ll * (1.0 / s_lo - 1.0 / d))
    delta = ((1.0 / points[:, -1] - 1.0 / points[:, 0]) / subslices)[:, None]
    middle = (e[:, :-1] + e[:, 1:]) / 2.0 + torch.where(s_lo > d, lr, ll) * delta / 2.0
    straddle = (s_lo <= d) & (d <= s_hi)
    return torch.where(straddle, one_sided, middle).max(dim=1).values


def slice_lipschitz(x, low, high, has, divider):
    """(K,) L_r, the right side's constant on [max(a, d), b], and (K,) L_l, the left side's on
    [a, d] (0 where the slice holds no dividing point)."""
    h, w = x.shape[-2:]
    entries = entry_factors(h, w, x.device)
    inside_r = high[:, None, None] >= entries
    lip_r = lipschitz(x, high, torch.maximum(low, divider), inside_r)
    lip_l = lipschitz(x, low, torch.where(has, divider, low), low[:, None, None] >= entries)
    return lip_r, torch.where(has, lip_l, torch.zeros_like(lip_l))


def slice_bounds(x: torch.Tensor, edges: torch.Tensor, subslices: int) -> torch.Tensor:
    """(S,) float64 M_j² for the slices between ``edges`` (S + 1,) increasing (module
    docstring; raised for float64 rounding). Call :func:`check_slices` first."""
    has, divider = slice_dividers(edges, tuple(x.shape[-2:]))
    chunk = max(1, _CHUNK_VALUES // ((subslices + 1) * x.numel()))
    out = []
    for start in range(0, edges.shape[0] - 1, chunk):
        stop = min(start + chunk, edges.shape[0] - 1)
        low, high = edges[start:stop], edges[start + 1:stop + 1]
        points = sub_points(low, high, subslices)
        right, left = _anchor_errors(x, points)
        lip_r, lip_l = slice_lipschitz(x, low, high, has[start:stop], divider[start:stop])
        out.append(_combine(points, right, left, divider[start:stop], lip_r, lip_l, subslices))
    return raised_for_rounding(torch.cat(out), x.numel())
