"""The Gaussian blur of ``blur`` is OpenCV's ``GaussianBlur`` with reflect-101 borders, as the
authors call it: against a direct 2-D convolution of the padded image with the stated kernel,
against numbers from OpenCV itself (tests/fixtures/opencv/), and the identity at variance 0."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from smoothcert.transforms import build_transformation
from smoothcert.transforms.blur import gaussian_blur, kernel_size, reflect101

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "opencv" / "gaussian_blur.json"


def stated_kernel(variance: float) -> np.ndarray:
    """The kernel the module states: round(8σ + 1) | 1 taps, exp(−t²/(2σ²)) normalised."""
    sigma = math.sqrt(variance)
    taps = int(round(8 * sigma + 1)) | 1
    t = np.arange(taps) - (taps - 1) / 2
    w = np.exp(-(t**2) / (2 * variance)) if taps > 1 else np.ones(1)
    return w / w.sum()


def direct_blur(x: np.ndarray, variance: float) -> np.ndarray:
    """The 2-D convolution of x (C, H, W), padded by reflection without the edge (NumPy's
    "reflect" = OpenCV's BORDER_REFLECT_101, repeated for pads wider than the image), with the
    outer product of the stated kernel, summed pixel by pixel in float64."""
    w = stated_kernel(variance)
    kernel, r = np.outer(w, w), (len(w) - 1) // 2
    c, h, wd = x.shape
    padded = np.pad(x.astype(np.float64), ((0, 0), (r, r), (r, r)), mode="reflect")
    out = np.zeros((c, h, wd))
    for i in range(h):
        for j in range(wd):
            out[:, i, j] = (padded[:, i:i + 2 * r + 1, j:j + 2 * r + 1] * kernel).sum(axis=(1, 2))
    return out


def test_the_kernel_size_is_opencvs_for_float_images():
    """``cvRound(sigma * 4 * 2 + 1) | 1`` (createGaussianKernels, depth != CV_8U); cvRound
    rounds half to even: σ = 1/16 gives 1.5 → 2 → 3 taps."""
    assert [kernel_size(s) for s in (0.0, 0.0624, 0.0625, 0.1875, 0.25, 0.5, 1.0, 1.3, 2.0)] \
        == [1, 1, 3, 3, 3, 5, 9, 11, 17]


def test_reflect101_repeats_the_mirror_without_the_edge():
    idx = torch.arange(-9, 14)  # dcb|abcde|dcb, again and again
    assert reflect101(idx, 5).tolist() == np.pad(np.arange(5), 9, mode="reflect").tolist()
    assert reflect101(torch.tensor([-1, 5, -4, 8, 9]), 5).tolist() == [1, 3, 4, 0, 1]
    assert reflect101(idx, 1).tolist() == [0] * len(idx)


@pytest.mark.parametrize("shape", [(1, 6, 7), (3, 5, 4), (1, 1, 6), (2, 3, 2)])
@pytest.mark.parametrize("variance", [0.004, 0.3, 1.0, 2.7, 40.0])
def test_blur_is_the_direct_convolution_of_the_reflect101_padded_image(shape, variance):
    x = torch.rand(shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=torch.float64)
    ours = gaussian_blur(x, torch.tensor([variance], dtype=torch.float64))[0]
    np.testing.assert_allclose(ours.numpy(), direct_blur(x.numpy(), variance), rtol=0, atol=1e-12)


def test_where_the_pad_fits_it_is_torchs_reflect_padding_and_a_conv2d():
    x = torch.rand(3, 12, 10, generator=torch.Generator().manual_seed(1))
    w = torch.tensor(stated_kernel(1.2), dtype=torch.float32)
    r = (len(w) - 1) // 2
    padded = F.pad(x[None], (r, r, r, r), mode="reflect")
    expected = F.conv2d(padded, torch.outer(w, w).expand(3, 1, -1, -1), groups=3)[0]
    ours = gaussian_blur(x, torch.tensor([1.2]))[0]
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)


def test_blur_matches_opencv_on_the_authors_call():
    """cv2.GaussianBlur(img, (0, 0), sqrt(α), borderType=BORDER_REFLECT101) on float32 images,
    variances on both sides of a kernel-size step and far wider than the image; float32
    rounding apart (the sums run in another order)."""
    doc = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert len(doc["cases"]) == 28
    for case in doc["cases"]:
        x = torch.tensor(case["x"], dtype=torch.float32)
        ours = gaussian_blur(x, torch.tensor([case["variance"]], dtype=torch.float64))[0]
        torch.testing.assert_close(ours, torch.tensor(case["blurred"]), rtol=0, atol=2e-6)


def test_variance_zero_and_one_tap_kernels_are_the_identity():
    x = torch.rand(2, 5, 5, generator=torch.Generator().manual_seed(2))
    out = gaussian_blur(x, torch.tensor([0.0, 1e-7, 0.0039], dtype=torch.float64))
    assert all(torch.equal(row, x) for row in out)


def test_each_row_of_a_batch_gets_its_own_kernel():
    t = build_transformation("blur:distribution=exponential,scale=3")
    params = t.draw(6, torch.Generator().manual_seed(3))
    batch = torch.rand(6, 1, 6, 6, generator=torch.Generator().manual_seed(4))
    out = t.apply(batch, params)
    for i, variance in enumerate(params[:, 0].tolist()):
        torch.testing.assert_close(
            out[i], gaussian_blur(batch[i], torch.tensor([variance]), "exact")[0])
    one = t.apply(batch[0], params)  # one image, many kernels
    torch.testing.assert_close(one[0], out[0])


def test_blur_keeps_a_constant_image_and_its_mean_is_a_weighted_average():
    x = torch.full((1, 7, 7), 0.3, dtype=torch.float64)
    out = gaussian_blur(x, torch.tensor([0.5, 5.0, 300.0], dtype=torch.float64))
    torch.testing.assert_close(out, x.expand(3, 1, 7, 7), rtol=0, atol=1e-15)


# --------------------------------------------------------------------------- the exact kernel
@pytest.mark.parametrize("a, b", [(0.3, 1.7), (2.0, 2.0), (0.05, 40.0)])
def test_exact_blurs_compose_by_adding_variances(a, b):
    """What the certificate needs (module doc): blur(blur(x, a), b) = blur(x, a + b). The
    OpenCV kernel does not (the control): its sampled kernels of small σ miss by far."""
    x = torch.rand(2, 9, 11, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    def blur(image, v, kernel):
        return gaussian_blur(image, torch.tensor([v], dtype=torch.float64), kernel)[0]
    twice = blur(blur(x, a, "exact"), b, "exact")
    torch.testing.assert_close(twice, blur(x, a + b, "exact"), rtol=0, atol=1e-13)
    cv = blur(blur(x, 0.15, "opencv"), 0.15, "opencv") - blur(x, 0.3, "opencv")
    assert cv.abs().max() > 1e-2


def test_exact_blur_is_the_identity_at_zero_keeps_constants_and_is_a_gaussian_inside():
    """Variance 0 is the identity and a constant image stays constant; far from the borders
    of a wide image the exact blur of a dot is the sampled Gaussian of that variance."""
    x = torch.rand(1, 6, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    zero = gaussian_blur(x, torch.tensor([0.0], dtype=torch.float64), "exact")[0]
    torch.testing.assert_close(zero, x, rtol=0, atol=1e-14)
    flat = gaussian_blur(torch.full((1, 5, 5), 0.4, dtype=torch.float64),
                         torch.tensor([3.0], dtype=torch.float64), "exact")[0]
    torch.testing.assert_close(flat, torch.full((1, 5, 5), 0.4, dtype=torch.float64),
                               rtol=0, atol=1e-14)
    dot = torch.zeros(1, 1, 201, dtype=torch.float64)
    dot[0, 0, 100] = 1.0
    out = gaussian_blur(dot, torch.tensor([4.0], dtype=torch.float64), "exact")[0, 0, 0]
    t = torch.arange(-6, 7, dtype=torch.float64)
    # the blur of a pixel: the continuous Gaussian integrated over unit cells, ≈ sampled
    sampled = torch.exp(-t**2 / 8.0) / (8.0 * torch.pi) ** 0.5
    torch.testing.assert_close(out[94:107], sampled, rtol=0, atol=3e-3)
