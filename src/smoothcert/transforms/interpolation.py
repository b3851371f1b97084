"""Bilinear resampling and TSS's bound on its error between sampled parameters (Li et al.,
"TSS: Transformation-Specific Smoothing for Robustness Certification", CCS 2021, §5.2 and
appendix, "sampling-based certification"; authors' code AI-secure/semantic-randomized-smoothing,
``semantic/transforms.py: Rotation.raw_proc`` and ``semantic/strict_rotation_aliasing_analyze.py:
get_finer_lipschitz_bound`` and its main loop).

Rotation and scaling are not resolvable: a rotated image rotated again is not a rotation of the
original (bilinear interpolation blurs, corners are cut). TSS certifies them with a classifier
smoothed by additive Gaussian noise only, at S sampled parameters θ_j: if, for every parameter
θ in the slice [θ_j, θ_{j+1}], the transformed image lies within ℓ2 distance M_j of the sample
T(x, θ_j), and the smoothed classifier is certified at T(x, θ_j) for an ℓ2 radius above M_j,
then it keeps its class at every T(x, θ), θ in the slice. This file computes M_j² for an image.

The bound on one slice, from the authors: e(θ) = ‖T(x, θ) − T(x, θ_j)‖² is L-Lipschitz in θ on
the slice, so on each of R sub-intervals [a, b] of width d its maximum is at most
(e(a) + e(b))/2 + L·d/2 (the two lines of slope ±L through the ends meet no higher); M_j² is
the largest of the R values. For rotation (image values in [0, 1], pixels masked to the
inscribed disc, angles in degrees) |e'(θ)| ≤ 2 Σ_p |T_p(θ) − T_p(θ_j)|·|∂T_p/∂θ|, where pixel
p at distance r_p from the centre samples the image on a circle of radius r_p (speed r_p per
radian) and the bilinear interpolant's gradient in a cell is at most √2 times the cell's range
of values, and |T_p(θ) − T_p(θ_j)| is at most the larger value (both are ≥ 0):
L = 2√2 · π/180 · Σ_p r_p Σ_c maxv_c(p) · maxd_c(p), with maxv and maxd the largest value and
the largest range of the 2×2 cells within one cell of where p samples at the slice's two ends
(the authors' 3×3 neighbourhood). That neighbourhood holds every cell p samples in the slice
only when the sample moves at most one pixel: r_p · (θ_{j+1} − θ_j) in radians ≤ 1, which
:func:`check_rotation_step` enforces.

Floating point. Everything is computed in float64 (the authors' in float32, so theirs differ
from these in the 7th digit; ``tests/transforms/test_interpolation_golden.py``). A sum of n
squares of values in [0, 1] rounds by at most n·ε relative and a few ε absolute per term, so
each M_j² is raised by 2nε relative and 4nε absolute (:func:`raised_for_rounding`): an
over-estimate, never an under-estimate, of the bound computed exactly.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

from ..errors import SmoothcertError

DEGREE = math.pi / 180.0
_EPS = sys.float_info.epsilon
_CHUNK_VALUES = 1 << 24  # float64 values per resampled block (128 MiB): memory, not results


def centre(h: int, w: int) -> tuple[float, float]:
    """The centre ((H − 1)/2, (W − 1)/2) of an H×W image in pixel indices (the authors')."""
    return (h - 1) / 2.0, (w - 1) / 2.0


def disc_mask(h: int, w: int, device=None) -> torch.Tensor:
    """(H, W) float64: 1 on the pixels within (min(H, W) − 1)/2 of the centre, 0 outside (the
    authors' ``Rotation.mask`` of a square image: rotation moves no pixel out of it)."""
    cy, cx = centre(h, w)
    radius = (min(h, w) - 1) / 2.0
    i = torch.arange(h, device=device, dtype=torch.float64)[:, None]
    j = torch.arange(w, device=device, dtype=torch.float64)[None, :]
    return (((i - cy) ** 2 + (j - cx) ** 2) <= radius**2).to(torch.float64)


def distances(h: int, w: int, device=None) -> torch.Tensor:
    """(H, W) float64: each pixel's distance from the centre, in pixels."""
    cy, cx = centre(h, w)
    i = torch.arange(h, device=device, dtype=torch.float64)[:, None]
    j = torch.arange(w, device=device, dtype=torch.float64)[None, :]
    return torch.sqrt((i - cy) ** 2 + (j - cx) ** 2)


def rotation_sources(h: int, w: int, degrees: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each output pixel (i, j) of a rotation by θ degrees samples the input: (B, H, W)
    rows and columns, for ``degrees`` (B,) float64. The authors' ``raw_proc``: the pixel at
    angle α and distance r from the centre samples at angle α + θ and the same distance, i.e.
    (cy + u cos θ + v sin θ, cx + v cos θ − u sin θ) with (u, v) = (i − cy, j − cx)."""
    cy, cx = centre(h, w)
    theta = degrees.to(torch.float64)[:, None, None] * DEGREE
    cos, sin = torch.cos(theta), torch.sin(theta)
    u = torch.arange(h, device=degrees.device, dtype=torch.float64)[None, :, None] - cy
    v = torch.arange(w, device=degrees.device, dtype=torch.float64)[None, None, :] - cx
    return cy + u * cos + v * sin, cx + v * cos - u * sin


def bilinear(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) float64: x (C, H, W), or row b of a batch (B, C, H, W), sampled bilinearly
    at (rows[b], cols[b]) (B, H, W). As the authors': the cell's corner is the floor of the
    position clamped into the image, the far corner one more clamped too, and the weights are
    the position's offsets from the clamped corner (so a position outside the image repeats
    the border; rotation and scaling mask or blank those pixels)."""
    count, (h, w) = rows.shape[0], x.shape[-2:]
    flat = x.to(torch.float64).expand(count, *x.shape[-3:]).reshape(count, -1, h * w)
    y0 = torch.floor(rows).clamp_(0, h - 1)
    x0 = torch.floor(cols).clamp_(0, w - 1)
    fy, fx = rows - y0, cols - x0
    y0l, x0l = y0.long(), x0.long()
    y1l, x1l = (y0l + 1).clamp_(max=h - 1), (x0l + 1).clamp_(max=w - 1)

    def corner(yi, xi):
        index = (yi * w + xi).reshape(count, 1, h * w).expand(-1, flat.shape[1], -1)
        return flat.gather(2, index).reshape(count, -1, h, w)

    fy, fx = fy[:, None], fx[:, None]
    return ((1.0 - fy) * (1.0 - fx) * corner(y0l, x0l) + (1.0 - fy) * fx * corner(y0l, x1l)
            + fy * (1.0 - fx) * corner(y1l, x0l) + fy * fx * corner(y1l, x1l))


def rotate(x: torch.Tensor, degrees: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) float64: x (C, H, W) (or row b of a batch) rotated by ``degrees[b]`` about
    its centre, bilinearly, masked to the inscribed disc (the authors' ``Rotation.proc``; an
    angle of exactly 0 returns the masked image, as theirs)."""
    h, w = x.shape[-2:]
    rows, cols = rotation_sources(h, w, degrees.to(x.device))
    return bilinear(x, rows, cols) * disc_mask(h, w, x.device)


def check_rotation_step(step_degrees: float, size) -> None:
    """Refuse slices so wide that a pixel of the disc moves more than one pixel within one (the
    bound's neighbourhood would miss cells it samples): r_max · step (radians) ≤ 1."""
    reach = (min(size) - 1) / 2.0
    if reach * step_degrees * DEGREE > 1.0:
        raise SmoothcertError(
            f"slices of {step_degrees:.6g} degrees are too wide for a {size[0]}x{size[1]} "
            f"image: the bound on the interpolation error needs each pixel to move at most one "
            f"pixel per slice, slices of at most {1.0 / (reach * DEGREE):.6g} degrees; give "
            f"more slices")


def _cell_maps(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, H, W) float64 maps: at (i, j) the largest value, and the largest range, of the 2×2
    cells with corner (i', j'), |i' − i| ≤ 1 and |j' − j| ≤ 1 (cells cut at the last row and
    column). The authors' ``map_nb_maxv`` and ``map_nb_maxd``."""
    img = x.to(torch.float64)[None]
    low_right = (0, 1, 0, 1)
    high = F.max_pool2d(F.pad(img, low_right, value=-math.inf), 2, stride=1)
    low = -F.max_pool2d(F.pad(-img, low_right, value=-math.inf), 2, stride=1)
    around = (1, 1, 1, 1)
    near_high = F.max_pool2d(F.pad(high, around, value=-math.inf), 3, stride=1)[0]
    near_range = F.max_pool2d(F.pad(high - low, around, value=-math.inf), 3, stride=1)[0]
    return near_high, near_range


def rotation_lipschitz(x: torch.Tensor, lows: torch.Tensor, highs: torch.Tensor) -> torch.Tensor:
    """(S,) float64: L_j, a Lipschitz constant (per degree) of θ ↦ ‖T(x, θ) − T(x, θ_j)‖² on
    each slice [lows[j], highs[j]] (degrees) of a rotation of x (C, H, W), values in [0, 1]
    (the authors' ``get_finer_lipschitz_bound``; module docstring)."""
    c, h, w = x.shape
    near_high, near_range = _cell_maps(x)
    weight = (distances(h, w, x.device) * disc_mask(h, w, x.device)).reshape(-1)

    def cells(degrees):
        rows, cols = rotation_sources(h, w, degrees.to(x.device))
        y0 = torch.floor(rows).clamp_(0, h - 1).long()
        x0 = torch.floor(cols).clamp_(0, w - 1).long()
        index = (y0 * w + x0).reshape(-1)
        return (near_high.reshape(c, -1)[:, index].reshape(c, -1, h * w),
                near_range.reshape(c, -1)[:, index].reshape(c, -1, h * w))

    (v_low, d_low), (v_high, d_high) = cells(lows), cells(highs)
    per_pixel = (torch.maximum(v_low, v_high) * torch.maximum(d_low, d_high)).sum(dim=0)
    return (per_pixel * weight).sum(dim=1) * (2.0 * math.sqrt(2.0) * DEGREE)


def slice_bounds(x: torch.Tensor, transform, edges: torch.Tensor, subslices: int,
                 lipschitz: torch.Tensor) -> torch.Tensor:
    """(S,) float64 M_j² ≥ max over θ in [edges[j], edges[j+1]] of ‖T(x, θ) − T(x, edges[j])‖²,
    from ``subslices`` equal sub-intervals per slice and the slices' Lipschitz constants
    (module docstring; raised for float64 rounding). ``transform(x, params)`` is T, (B,)
    parameters to (B, C, H, W) float64."""
    count = edges.shape[0] - 1
    per_slice = (subslices + 1) * x.numel()
    chunk = max(1, _CHUNK_VALUES // per_slice)
    fractions = torch.arange(subslices + 1, dtype=torch.float64, device=edges.device) / subslices
    out = []
    for start in range(0, count, chunk):
        stop = min(start + chunk, count)
        low, high = edges[start:stop], edges[start + 1:stop + 1]
        params = low[:, None] + (high - low)[:, None] * fractions[None, :]
        params[:, -1] = high  # the slice's own end, not a rounded sum
        images = transform(x, params.reshape(-1)).reshape(low.shape[0], subslices + 1, -1)
        errors = ((images - images[:, :1]) ** 2).sum(dim=2)
        out.append(((errors[:, :-1] + errors[:, 1:]) / 2.0).max(dim=1).values)
    width = (edges[1:] - edges[:-1]) / subslices
    return raised_for_rounding(torch.cat(out) + width * lipschitz / 2.0, x.numel())


def raised_for_rounding(bound: torch.Tensor, terms: int) -> torch.Tensor:
    """``bound`` raised by 2nε relative and 4nε absolute (n = ``terms``): the float64 rounding
    of a sum of n squares of values in [0, 1] (module docstring)."""
    return bound * (1.0 + 2.0 * terms * _EPS) + 4.0 * terms * _EPS
