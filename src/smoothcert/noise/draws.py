"""Generator-driven draws shared by the ℓp noise families (Yang et al. 2020): gamma radii,
Laplace coordinates, random signs and uniform directions on the unit ℓ1 / ℓ2 / ℓ∞ spheres.

Every draw comes from the ``torch.Generator`` passed in, on the device of the tensor filled,
in a documented order, so a noise object reproduces its draws for a given generator state.
``torch.distributions.Gamma`` (``torch._standard_gamma``) takes no generator, so gamma radii
are drawn here by Marsaglia & Tsang's method (2000) from generator-driven normals and
uniforms. A "sample" of a batch (B, ...) is one row: its dimension is d = numel / B.
"""

from __future__ import annotations

import math

import torch


def sample_dims(like: torch.Tensor) -> tuple[int, ...]:
    """The non-batch dimensions of ``like`` (B, ...), for reductions over one sample."""
    return tuple(range(1, like.dim()))


def sample_dim(like: torch.Tensor) -> int:
    """d = the number of coordinates of one sample of the batch ``like`` (B, ...)."""
    return like[0].numel() if like.shape[0] else math.prod(like.shape[1:])


def standard_gamma(alpha: float, count: int, generator: torch.Generator | None,
                   device: torch.device) -> torch.Tensor:
    """``count`` draws of Gamma(alpha, 1) in float64, by Marsaglia & Tsang (2000).

    For a ≥ 1, with a' = a − 1/3 and c = 1/√(9a'): X ~ N(0, 1), U ~ U[0, 1), V = (1 + cX)³;
    a'·V is accepted when V > 0 and log U < X²/2 + a' − a'V + a'·log V, which happens with
    probability > 0.95 for every a ≥ 1; rejected entries are redrawn, in index order. For
    a < 1, Gamma(a) = Gamma(a + 1)·U^(1/a) with one more uniform per draw. Draws from
    ``generator``: per round one normal and one uniform per open entry (normals first).
    """
    boost = alpha < 1.0
    a = alpha + 1.0 if boost else alpha
    shape = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * shape)
    out = torch.empty(count, dtype=torch.float64, device=device)
    todo = torch.arange(count, device=device)
    while todo.numel():
        x = torch.randn(todo.numel(), generator=generator, dtype=torch.float64, device=device)
        u = torch.rand(todo.numel(), generator=generator, dtype=torch.float64, device=device)
        v = (1.0 + c * x) ** 3
        # log of a negative V is NaN, and a comparison with NaN is False: rejected
        ok = (v > 0) & (torch.log(u) < 0.5 * x * x + shape - shape * v + shape * torch.log(v))
        out[todo[ok]] = shape * v[ok]
        todo = todo[~ok]
    if boost:
        u = torch.rand(count, generator=generator, dtype=torch.float64, device=device)
        out.mul_(u.pow_(1.0 / alpha))
    return out


def laplace_(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Standard Laplace draws (density ½e^(−|z|)) into ``out``, as E₁ − E₂ of two standard
    exponentials (``out``'s first, then a temporary's). Returns ``out``."""
    other = torch.empty_like(out).exponential_(generator=generator)
    return out.exponential_(generator=generator).sub_(other)


def random_signs_(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Multiply each entry of ``out`` by an independent fair sign ±1 (one Bernoulli draw per
    entry into a temporary); returns ``out``."""
    signs = torch.empty_like(out).bernoulli_(0.5, generator=generator)
    return out.mul_(signs.mul_(2.0).sub_(1.0))


def l1_directions_(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Rows uniform on the unit ℓ1 sphere: a Laplace vector over its ℓ1 norm (its density
    depends on ‖z‖₁ only, so its direction is uniform on the cross-polytope's surface)."""
    laplace_(out, generator)
    return out.div_(out.abs().sum(dim=sample_dims(out), keepdim=True))


def l2_directions_(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Rows uniform on the unit ℓ2 sphere: a standard normal vector over its ℓ2 norm."""
    out.normal_(generator=generator)
    return out.div_(torch.linalg.vector_norm(out, dim=sample_dims(out), keepdim=True))


def linf_directions_(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Rows uniform on the surface of the cube [−1, 1]^d: every coordinate U[−1, 1), then one
    coordinate per row, chosen uniformly, set to a fair ±1 (the 2d faces have equal area).
    Draws: the uniforms, then the coordinates (``randint``), then the signs."""
    rows, dim = out.shape[0], sample_dim(out)
    out.uniform_(-1.0, 1.0, generator=generator)
    if rows == 0:
        return out
    face = torch.randint(0, dim, (rows,), generator=generator, device=out.device)
    sign = torch.empty(rows, dtype=out.dtype, device=out.device).bernoulli_(
        0.5, generator=generator).mul_(2.0).sub_(1.0)
    index = (torch.arange(rows, device=out.device),) + torch.unravel_index(face, out.shape[1:])
    out[index] = sign
    return out


def scale_rows_(out: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Multiply row b of ``out`` (B, ...) by ``scale[b]`` (float64 (B,), cast to out's dtype)."""
    return out.mul_(scale.to(out.dtype).reshape((-1,) + (1,) * (out.dim() - 1)))
