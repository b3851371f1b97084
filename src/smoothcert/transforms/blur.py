"""Gaussian blur (Li et al., TSS, CCS 2021, §5.1 "Gaussian blur"): the kernel's variance α is
the smoothing parameter.

The authors (``semantic/transforms.py``: ``Gaussian``, ``ExpGaussian``, ``FoldGaussian``) draw α
from U[0, s²] (``uniform``), from the exponential distribution of mean s (``exponential``) or
from |N(0, s²)| (``folded-gaussian``), s their ``--noise_sd`` (our ``scale``), and blur with
``cv2.GaussianBlur(img, (0, 0), sqrt(α), borderType=cv2.BORDER_REFLECT101)`` on a float32
image. Blurs compose by adding variances, so the transformation is resolvable: with
probability ≥ 1 − α the smoothed classifier predicts its class on every blur of x of variance
α' in [0, ``radius``) (:func:`smoothcert.stats.tss.blur_radius`; the authors' ``calc_radius``).

The certificate needs blurs that compose exactly: the smoothed classifier at a blurred input
blur(x, α') averages f(blur(blur(x, α'), α)), which must be f(blur(x, α' + α)). Two kernels:

* ``kernel=exact`` (default): the heat semigroup with reflected borders. Along each axis of N
  pixels, blur(·, α) = Cᵀ diag(exp(−α(πk/N)²/2)) C, C the orthonormal DCT-II (the cosine basis
  of the half-sample-symmetric extension ``cba|abc|cba``, OpenCV's ``BORDER_REFLECT``): the
  Gaussian of variance α (pixels²) of the continuous signal behind the pixels, so that
  blur(blur(x, a), b) = blur(x, a + b) holds exactly (up to float rounding: ~1e-15 in the
  float64 matrices, a float32 input's rounding after), and the certificate is a proof for it.
  A constant image stays constant (k = 0 keeps its weight 1).
* ``kernel=opencv``: the authors' blur, OpenCV's computed with torch: for σ = √α the kernel
  has ``round(8σ + 1) | 1`` taps (``createGaussianKernels`` for a non-8-bit image:
  ``cvRound(sigma * 4 * 2 + 1) | 1``; ``cvRound`` rounds half to even, as Python's ``round``),
  weights exp(−t²/(2σ²)) normalised to sum 1 (``getGaussianKernel``, in float64), along rows
  and columns with reflect-101 borders (``dcb|abcd|cba``, repeated for a kernel wider than the
  image, as ``borderInterpolate``). Truncated and reflected, it composes only approximately:
  its radius rests on the authors' assumption that it does, not on a proof (use it to compare
  with their numbers). ``tests/transforms/test_blur.py`` holds it to a direct convolution of
  the padded image and to numbers from ``cv2.GaussianBlur`` (OpenCV 4.14); a one-tap kernel
  (σ < 1/16) is the identity, as the authors' skip of α < 10⁻⁶ is.

Either is written as two matrices per row of a batch (each row has its own variance):
out = A x Bᵀ, one (N, N) matrix per image axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import check_positive_finite
from ..registry import option
from ..stats.tss import blur_radius
from .base import Transformation, register_transformation

DISTRIBUTIONS = ("uniform", "exponential", "folded-gaussian")
KERNELS = ("exact", "opencv")


def kernel_size(sigma: float) -> int:
    """OpenCV's taps for a Gaussian kernel of standard deviation ``sigma`` >= 0 on a float
    image: ``round(8σ + 1) | 1`` (1 for σ = 0)."""
    return int(round(sigma * 8.0 + 1.0)) | 1


def reflect101(index: torch.Tensor, size: int) -> torch.Tensor:
    """OpenCV's ``BORDER_REFLECT_101`` index into an axis of ``size`` pixels, for any index
    (periodic with period 2·size − 2: −1 → 1, size → size − 2; a single pixel is index 0)."""
    if size == 1:
        return torch.zeros_like(index)
    period = 2 * size - 2
    folded = torch.remainder(index, period)
    return torch.where(folded >= size, period - folded, folded)


def gaussian_kernels(variances: torch.Tensor) -> torch.Tensor:
    """(B, 2R + 1) float64 weights of each row's kernel, centred, zero beyond its own
    ``kernel_size`` (R the largest half-width of the batch)."""
    sigma = variances.to(torch.float64).clamp(min=0.0).sqrt()
    # kernel_size for every row at once: torch.round rounds half to even, as round does
    half = (torch.round(sigma * 8.0 + 1.0).long() | 1) // 2
    reach = int(half.max()) if half.numel() else 0  # one host synchronisation per batch
    t = torch.arange(-reach, reach + 1, device=variances.device, dtype=torch.float64)
    # exp(−t²/(2σ²)); a one-tap kernel (σ tiny or 0) keeps t = 0 only, where the weight is 1
    scale = (2.0 * sigma**2).clamp(min=torch.finfo(torch.float64).tiny)[:, None]
    weights = torch.exp(-(t[None, :] ** 2) / scale)
    weights = torch.where(t.abs()[None, :] <= half[:, None], weights, 0.0)
    return weights / weights.sum(dim=1, keepdim=True)


def blur_matrices(weights: torch.Tensor, size: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, size, size): each row's 1-D blur of an axis of ``size`` pixels as a matrix,
    reflect-101 borders folded in: M[b, i, m] = Σ_t w_b(t) [reflect(i + t) = m]."""
    reach = (weights.shape[1] - 1) // 2
    device = weights.device
    taps = torch.arange(-reach, reach + 1, device=device)
    source = reflect101(torch.arange(size, device=device)[:, None] + taps[None, :], size)
    one_hot = torch.nn.functional.one_hot(source, size).to(dtype)  # (size, T, size)
    return torch.einsum("bt,itm->bim", weights.to(dtype), one_hot)


def dct_matrix(size: int, device=None) -> torch.Tensor:
    """(size, size) float64 orthonormal DCT-II: row k is s_k cos(πk(i + ½)/N)."""
    k = torch.arange(size, device=device, dtype=torch.float64)
    c = torch.cos(torch.pi * k[:, None] * (k[None, :] + 0.5) / size)
    c[0] /= 2.0**0.5
    return c * (2.0 / size) ** 0.5


def heat_matrices(variances: torch.Tensor, size: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, size, size): Cᵀ diag(exp(−α_b (πk/N)²/2)) C, the blur of variance α_b along an
    axis of ``size`` pixels with reflected borders; exactly a semigroup in α (module doc)."""
    c = dct_matrix(size, variances.device)
    k = torch.arange(size, device=variances.device, dtype=torch.float64)
    decay = torch.exp(-variances.to(torch.float64)[:, None] * (torch.pi * k / size) ** 2 / 2)
    return torch.einsum("ki,bk,kj->bij", c, decay, c).to(dtype)


def gaussian_blur(x: torch.Tensor, variances: torch.Tensor,
                  kernel: str = "opencv") -> torch.Tensor:
    """Each row of ``x`` (B, C, H, W), or the one image x (C, H, W) once per variance, blurred
    by the Gaussian of variance ``variances[b]`` (pixels²) with ``kernel`` "exact" (the heat
    semigroup) or "opencv" (OpenCV's kernel and borders; module doc); (B, C, H, W) in x's
    dtype."""
    h, w = x.shape[-2:]
    variances = variances.to(x.device)
    if kernel == "exact":
        rows, cols = heat_matrices(variances, h, x.dtype), heat_matrices(variances, w, x.dtype)
    else:
        weights = gaussian_kernels(variances)
        rows = blur_matrices(weights, h, x.dtype)  # (B, H, H)
        cols = blur_matrices(weights, w, x.dtype)  # (B, W, W)
    return rows[:, None] @ x @ cols.transpose(1, 2)[:, None]


@register_transformation("blur")
class Blur(Transformation):
    """Gaussian blur of variance α ~ U[0, s²], Exp(mean s) or |N(0, s²)| (Li et al. 2021):
    certifies every blur of variance in [0, radius), blurs of this transformation's kernel.

    ``kernel=exact`` (default): the heat semigroup, whose blurs compose exactly, so that the
    certificate is a proof; ``kernel=opencv``: the authors' ``cv2.GaussianBlur`` (module doc).
    """

    unit = "blur variance, pixels²"
    parameters = ("variance",)
    example = "blur:distribution=exponential,scale=2"

    @dataclass(frozen=True)
    class Options:
        distribution: str = option("exponential", "how the blur's variance α is drawn: "
                                   "uniform U[0, scale²], exponential of mean scale, or "
                                   "folded-gaussian |N(0, scale²)| (the authors' gaussian, "
                                   "expgaussian, foldgaussian)", choices=DISTRIBUTIONS)
        scale: float = option(2.0, "s > 0: the distribution's scale (the authors' --noise_sd; "
                                   "their MNIST example: exponential, 2)")
        kernel: str = option("exact", "exact: the heat semigroup with reflected borders, "
                                      "whose blurs compose (the certificate holds); opencv: "
                                      "the authors' truncated cv2 kernel, reflect-101 (only "
                                      "approximately composing)", choices=KERNELS)

        def __post_init__(self):
            check_positive_finite("scale", self.scale)

    def draw(self, count, generator, device="cpu"):
        """(count, 1) float64 variances from ``generator``: ``count`` uniforms (U[0, s²]),
        exponentials of rate 1/s, or standard normals whose |·| is scaled by s."""
        out = torch.empty((count, 1), dtype=torch.float64, device=device)
        if self.distribution == "uniform":
            return out.uniform_(0.0, self.scale**2, generator=generator)
        if self.distribution == "exponential":
            return out.exponential_(1.0 / self.scale, generator=generator)
        return out.normal_(generator=generator).abs_().mul_(self.scale)

    def apply(self, x, params):
        return gaussian_blur(x, params[:, 0], self.kernel)

    def radius(self, p_lower):
        return blur_radius(p_lower, self.distribution, self.scale)

