"""Statistical soundness of every ℓp certificate (Yang et al. 2020; Teng et al. 2020), with an
unsound control that the same test catches.

For a shift s of the input, the Neyman–Pearson lemma gives the worst classifier: the class-B
region of noise measure 1 − p with the largest density ratio q(z − s)/q(z). Its probability at
x + s is E_q[1_B·q(z − s)/q(z)] plus the mass the shifted noise puts where q = 0, estimated
here by importance weights over 10⁵ draws of **our sampler** (fixed generator), with log-densities
written from the paper's formulas. A certificate of radius r is sound when, for every shift
with ‖s‖ < r, that probability stays ≤ ½ (the top class keeps > ½). We shift to 0.98·r along
each norm's worst direction (a coordinate for ℓ1 and ℓ2, the diagonal (1, …, 1) for ℓ∞) and
require ≤ ½ + 4 standard errors; the control shifts to 1.2·r and must exceed ½ + 4 standard
errors (at p = 0.6, where every direct certificate here is within 20 % of the worst case).
Converted radii (‖·‖_q ≤ d^(1/q − 1/p)‖·‖_p) are checked along both directions, without a control
(a conversion is loose by design).
"""

import math

import pytest
import torch

from smoothcert.noise import NOISES
from smoothcert.noise.base import NORMS
from smoothcert.noise.pareto import SHAPE

DIM, N, SIGMA = 4, 100_000, 0.5


def log_density(name: str, z: torch.Tensor, lam: float) -> torch.Tensor:
    """log q(z) up to a constant, per row of z (n, d), from each paper's density."""
    if name == "laplace":
        return -z.abs().sum(1) / lam
    if name == "pareto":
        return -(SHAPE + 1.0) * torch.log1p(z.abs() / lam).sum(1)
    if name == "exp-inf":
        return -z.abs().amax(1) / lam
    if name == "exp1":
        return -(z.abs().sum(1) / lam) ** 2
    if name == "exp2":
        return -z.norm(dim=1) / lam
    if name == "uniform":
        inside = z.abs().amax(1) <= lam
        return torch.where(inside, 0.0, -math.inf).to(z.dtype)
    raise KeyError(name)


def worst_case_b(name, z, lam, shift, p):
    """(P(class B at x + shift), its standard error) for the worst class-B set of measure
    1 − p at x, from draws z of the noise (importance weights; module doc)."""
    llr = log_density(name, z - shift, lam) - log_density(name, z, lam)
    top = torch.argsort(llr, descending=True)[: round((1.0 - p) * z.shape[0])]
    weights = torch.zeros_like(llr)
    weights[top] = torch.exp(llr[top])
    # where the noise at x has no mass but the shifted noise has: free for class B
    weights += (log_density(name, z + shift, lam) == -math.inf).to(z.dtype)
    return float(weights.mean()), float(weights.std() / math.sqrt(z.shape[0]))


def direction(norm: str, kind: str) -> torch.Tensor:
    u = torch.zeros(DIM, dtype=torch.float64)
    if kind == "coordinate":
        u[0] = 1.0
    else:
        u[:] = 1.0
    return u / torch.linalg.vector_norm(u, ord={"l1": 1, "l2": 2, "linf": math.inf}[norm])


@pytest.fixture(scope="module")
def draws():
    """10⁵ draws of each noise at σ = 0.5 in d = 4, from a fixed generator."""
    out = {}
    for name in ("laplace", "pareto", "exp-inf", "exp1", "exp2", "uniform"):
        g = torch.Generator().manual_seed(7)
        out[name] = NOISES[name](SIGMA).sample(torch.zeros(N, DIM, dtype=torch.float64), g)
    return out


WORST = {"l1": "coordinate", "l2": "coordinate", "linf": "diagonal"}
DIRECT = [(name, norm) for name in ("laplace", "pareto", "exp-inf", "exp1", "exp2", "uniform")
          for norm in NOISES[name].certified_norms()]


@pytest.mark.parametrize("name, norm", DIRECT)
def test_direct_certificates_hold_and_a_larger_radius_breaks(name, norm, draws):
    noise = NOISES[name](SIGMA)
    lam = noise.scale(DIM)
    u = direction(norm, WORST[norm])
    for p in (0.6, 0.9):
        r = noise.direct_radius(norm, p, DIM)
        b, se = worst_case_b(name, draws[name], lam, 0.98 * r * u, p)
        assert b <= 0.5 + 4 * se, (p, r, b, se)
    r = noise.direct_radius(norm, 0.6, DIM)
    b, se = worst_case_b(name, draws[name], lam, 1.2 * r * u, 0.6)
    assert b > 0.5 + 4 * se, (r, b, se)  # the unsound control is caught


CONVERTED = [(name, norm) for name in ("laplace", "pareto", "exp-inf", "exp1", "exp2", "uniform")
             for norm in NORMS if norm not in NOISES[name].certified_norms()]


@pytest.mark.parametrize("name, norm", CONVERTED)
def test_converted_radii_hold_along_a_coordinate_and_the_diagonal(name, norm, draws):
    noise = NOISES[name](SIGMA)
    r = noise.radii(0.9, DIM)[norm]
    for kind in ("coordinate", "diagonal"):
        shift = 0.98 * r * direction(norm, kind)
        b, se = worst_case_b(name, draws[name], noise.scale(DIM), shift, 0.9)
        assert b <= 0.5 + 4 * se, (kind, r, b, se)


def test_the_wrong_lambda_is_caught():
    """A Laplace ℓ1 radius computed with λ = σ (forgetting the √2) is unsound: the worst
    class-B set at 0.98 of that radius gains more than ½."""
    noise = NOISES["laplace"](SIGMA)
    z = noise.sample(torch.zeros(N, DIM, dtype=torch.float64), torch.Generator().manual_seed(3))
    wrong = -SIGMA * math.log(2 * (1 - 0.9))
    b, se = worst_case_b("laplace", z, noise.scale(), 0.98 * wrong * direction("l1", "coordinate"),
                         0.9)
    assert b > 0.5 + 4 * se
