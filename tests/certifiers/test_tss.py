"""The ``tss`` certifier (``certifiers/tss.py``, Li et al. 2021) through ``certify_dataset``:
models whose smoothed probabilities under each transformation are closed forms (a threshold of
the mean brightness, a threshold of one pixel, of the centre after a blur), so that every
certificate is checked against the exact robust set; abstention; the record columns and the
identity; a kill and a resume, shards and a merge, any batch; refusals before any file.

The golden numbers of the radii (against the authors' code) are the statistics' tests
(tests/stats/test_tss_*.py); here the certifier around them."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn

from conftest import dying_writer
from smoothcert.certifiers import CERTIFIERS
from smoothcert.errors import SmoothcertError
from smoothcert.models.encodings import AblationEncoding
from smoothcert.runs import certify_dataset
from smoothcert.runs.records import merge_records, read_manifest, read_records, shard_path
from smoothcert.stats.tss import brightness_radius
from smoothcert.transforms import build_transformation

# Inputs centred on 0 (the brightness oracle's threshold) lie off [0, 1] on purpose: the radius
# is exact on all of R^d; the warning that says so to a user is expected here.
pytestmark = pytest.mark.filterwarnings(
    "ignore::smoothcert.smoothing.smoothed.InputRangeWarning")

N0, N, ALPHA = 50, 2000, 0.001


class MeanThreshold(nn.Module):
    """f(x) = [mean(x) > t], as two logits. Under x → e^k (x + b) its class is [e^k (m + b) >
    t], m = mean(x): for t = 0 contrast does not matter and P(class 1) = Φ(m/σ_b)."""

    def __init__(self, t=0.0, shape=(1, 4, 4)):
        super().__init__()
        self.t, self.input_shape = t, shape

    def forward(self, x):
        z = x.flatten(1).double().mean(dim=1) - self.t
        return torch.stack([-z, z], dim=1)


def brightness_data(means, shape=(1, 4, 4)):
    """Images of mean ``means[i]`` (a fixed pattern of mean 0 added), labelled by sign."""
    pattern = torch.linspace(-0.2, 0.2, math.prod(shape), dtype=torch.float64).reshape(shape)
    xs = torch.stack([pattern - pattern.mean() + m for m in means])
    return torch.utils.data.TensorDataset(xs, (torch.tensor(means) > 0).long())


def run(model, data, transform, **kwargs):
    kwargs = {"n0": N0, "n": N, "alpha": ALPHA, "batch": 500, "seed": 1, "num_classes": 2,
              **kwargs}
    return certify_dataset(model, data, certifier="tss", options={"transform": transform},
                           **kwargs)


# --------------------------------------------------------------------------- brightness
MEANS = (-0.4, -0.12, 0.05, 0.2, 0.33)


@pytest.mark.parametrize("transform", ["brightness:sigma_b=0.25",
                                       "brightness:sigma_b=0.25,sigma_k=0.3,k_low=0.9,"
                                       "k_high=1.1"])
def test_brightness_radius_is_within_the_exact_robust_shift(transform):
    """p_A = Φ(|m|/σ_b) exactly, and the class changes at the shift b' = −m, at every contrast:
    each certificate's p_lower is below p_A and its radius below |m| = σ_b Φ⁻¹(p_A) (a
    contrast range costs margin: the input nearest the threshold then abstains)."""
    t = build_transformation(transform)
    rows = run(MeanThreshold(), brightness_data(MEANS), transform)
    answered = [(row, m) for row, m in zip(rows, MEANS) if row["predict"] != -1]
    assert len(answered) >= 3
    for row, m in answered:
        assert row["predict"] == int(m > 0) and row["correct"] == 1
        assert row["p_lower"] <= norm.cdf(abs(m) / 0.25) and 0 < row["radius"] < abs(m)
        assert row["radius"] == brightness_radius(row["p_lower"], t.sigma_k, 0.25, t.k_low,
                                                  t.k_high)
        assert (row["factor_low"], row["factor_high"]) == (t.k_low, t.k_high)
    if t.sigma_k == 0:  # Cohen's radius in the one dimension of b
        assert len(answered) == len(MEANS)
        assert all(r["radius"] == pytest.approx(0.25 * norm.ppf(r["p_lower"]), rel=1e-12)
                   for r in rows)
        assert max(r["radius"] / abs(m) for r, m in zip(rows, MEANS)) > 0.8  # not vacuous


def test_a_probability_of_one_half_abstains():
    rows = run(MeanThreshold(), brightness_data([0.0]), "brightness:sigma_b=0.25")
    (row,) = rows
    assert (row["predict"], row["radius"], row["correct"]) == (-1, 0.0, 0)
    assert (row["factor_low"], row["factor_high"]) == (1.0, 1.0) and row["p_lower"] < 0.5


def smoothed_probability(m, t, c, sigma_k, sigma_b, nodes=80):
    """P(e^k (c m + b) > t), k ~ N(0, σ_k²), b ~ N(0, σ_b²): Gauss–Hermite over k."""
    z, w = np.polynomial.hermite_e.hermegauss(nodes)
    return float(np.sum(w * norm.cdf((c * m - t * np.exp(-sigma_k * z)) / sigma_b))
                 / np.sqrt(2 * np.pi))


def test_the_certified_contrast_range_keeps_the_class_at_every_factor():
    """Under contrast c·x the exact smoothed probability at c·x is a 1-D integral: for t ≠ 0
    the class changes at some factor; every factor of [factor_low, factor_high] keeps it."""
    t, sk, sb = 0.3, 0.2, 0.2
    means = (0.5, 0.7, 0.1, -0.2)
    rows = run(MeanThreshold(t), brightness_data(means), f"contrast:sigma_k={sk},sigma_b={sb}")
    certified = 0
    for row, m in zip(rows, means):
        p_a = smoothed_probability(m, t, 1.0, sk, sb)
        top = int(p_a > 0.5)
        assert row["predict"] in (-1, top) and row["p_lower"] <= max(p_a, 1 - p_a)
        if row["predict"] == -1:
            continue
        certified += 1
        lo, hi = row["factor_low"], row["factor_high"]
        assert lo < 1 < hi and row["radius"] == pytest.approx(min(1 - lo, hi - 1), abs=1e-15)
        for c in np.linspace(lo, hi, 41):
            p = smoothed_probability(m, t, c, sk, sb)
            assert (p if top else 1 - p) > 0.5, (m, c)
    assert certified >= 3


# --------------------------------------------------------------------------- translation
class ReadPixel(nn.Module):
    """f(x) = [x at (r, c) > ½]: under a cyclic shift by (a, b) it reads x[(r + a) % H,
    (c + b) % W]."""

    def __init__(self, r, c, shape):
        super().__init__()
        self.r, self.c, self.input_shape = r, c, shape

    def forward(self, x):
        z = x[:, 0, self.r, self.c].double() - 0.5
        return torch.stack([-z, z], dim=1)


def shift_mass(sigma, size, reach=12):
    """P(round(σ z) ≡ a mod size) for a = 0..size−1 (ties have probability 0)."""
    a = np.arange(-int(reach * sigma) - 1, int(reach * sigma) + 2)
    mass = norm.cdf((a + 0.5) / sigma) - norm.cdf((a - 0.5) / sigma)
    return np.bincount(np.mod(a, size), weights=mass, minlength=size)


def translated_probability(image, r, c, sigma):
    """P(f(shift(image)) = 1) for ReadPixel(r, c): a sum over the wrapped integer shifts."""
    h, w = image.shape[-2:]
    rows, cols = shift_mass(sigma, h), shift_mass(sigma, w)
    bright = (image[0] > 0.5).double().numpy()
    return float(sum(rows[a] * cols[b] * bright[(r + a) % h, (c + b) % w]
                     for a in range(h) for b in range(w)))


def broken_shifts(image, r, c, sigma, top, radius):
    """The integer shifts of ℓ2 length below ``radius`` at which the smoothed classifier's
    exact probability of class ``top`` is not above ½."""
    reach = int(radius) + 1
    broken = []
    for a, b in itertools.product(range(-reach, reach + 1), repeat=2):
        if math.hypot(a, b) < radius:
            p = translated_probability(torch.roll(image, (-a, -b), dims=(1, 2)), r, c, sigma)
            if (p if top else 1 - p) <= 0.5:
                broken.append((a, b))
    return broken


def test_every_shift_within_the_translation_radius_keeps_the_class():
    """Exact probabilities at every integer shift of the image: each shift of ℓ2 length below
    the radius keeps the predicted class (and p_lower is below the exact p_A). The unsound
    control, 2.5 times each radius, is caught: some shift within it changes the class."""
    sigma, shape, (r, c) = 1.2, (1, 9, 9), (4, 4)
    images = torch.zeros(3, *shape)
    images[0, 0, 2:7, 2:7] = 1.0  # a 5×5 block over the read pixel: class 1, p_A ≈ 0.92
    images[1, 0, 3:6, 1:8] = 1.0  # a bar: class 1 at a smaller p_A
    images[2, 0, 0:2, :] = 1.0  # bright rows away from it: class 0
    labels = torch.tensor([1, 1, 0])
    rows = run(ReadPixel(r, c, shape), torch.utils.data.TensorDataset(images, labels),
               f"translation:sigma={sigma}", n=4000)
    for row, image in zip(rows, images):
        p_one = translated_probability(image, r, c, sigma)
        top = int(p_one > 0.5)
        assert row["predict"] == top and row["p_lower"] <= max(p_one, 1 - p_one)
        assert row["radius"] > 0
        assert broken_shifts(image, r, c, sigma, top, row["radius"]) == []
        assert broken_shifts(image, r, c, sigma, top, 2.5 * row["radius"])  # the control


# --------------------------------------------------------------------------- blur
class CentreThreshold(nn.Module):
    """f(x) = [centre pixel > t]."""

    def __init__(self, t, shape):
        super().__init__()
        self.t, self.input_shape = t, shape

    def forward(self, x):
        h, w = x.shape[-2:]
        z = x[:, 0, h // 2, w // 2].double() - self.t
        return torch.stack([-z, z], dim=1)


def test_the_blur_radius_is_within_the_exact_one_of_the_smoothed_classifier():
    """A dot at the centre of a 15×15 image: the blurred centre falls with the variance (no
    border is reached below variance 2), so class 1 holds exactly for α < α*, and under
    α ~ Exp(mean s) p_A = 1 − e^{−α*/s}: p_lower is below it, and the radius below the exact
    radius of blurs that compose, α* − s·ln 2."""
    shape, s = (1, 15, 15), 0.4
    dot = torch.zeros(shape, dtype=torch.float64)
    dot[0, 7, 7] = 1.0
    blur = build_transformation("blur")

    def centre(variance):
        return float(blur.apply(dot, torch.tensor([[variance]], dtype=torch.float64))[0, 0, 7, 7])

    grid = np.linspace(0.0, 2.0, 201)
    values = [centre(v) for v in grid]
    assert all(a >= b for a, b in zip(values, values[1:]))  # monotone on the range used
    star, t = 1.2, centre(1.2)
    rows = run(CentreThreshold(t, shape), torch.utils.data.TensorDataset(dot[None].float(),
                                                                          torch.tensor([1])),
               f"blur:distribution=exponential,scale={s}", n=4000)
    (row,) = rows
    p_a = 1 - math.exp(-star / s)
    assert row["predict"] == 1 and row["p_lower"] <= p_a
    assert 0 < row["radius"] <= star - s * math.log(2)
    assert row["radius"] > 0.8 * (star - s * math.log(2))


# --------------------------------------------------------------------------- records
def test_records_identity_and_unit(tmp_path):
    out = tmp_path / "r.tsv"
    run(MeanThreshold(), brightness_data(MEANS[:2]), " brightness:sigma_k=0, sigma_b=0.25",
        out=out)
    manifest = read_manifest(out)
    identity = manifest["identity"]
    assert identity["certifier"] == "tss" and identity["noise"] == "none"
    assert identity["sigma"] == 0.0 and identity["n0"] == N0
    assert identity["options"] == {
        "transform": "brightness:sigma_b=0.25,sigma_k=0.0,k_low=1.0,k_high=1.0"}
    assert manifest["columns"] == list(CERTIFIERS["tss"].columns)
    assert list(read_records(out).rows()[0])[:6] == ["idx", "label", "predict", "radius",
                                                     "correct", "time"]
    # the same run spelled otherwise resumes the file: one identity
    again = run(MeanThreshold(), brightness_data(MEANS[:2]), "brightness:sigma_b=0.25",
                out=out)
    assert len(again) == 2


@pytest.mark.parametrize(("transform", "unit"), [
    ("brightness", "brightness shift, pixel units"), ("contrast", "contrast factor, 1 ± radius"),
    ("blur", "blur variance, pixels²"), ("translation", "shift, pixels (l2 of (dx, dy))")])
def test_the_radius_is_in_the_transformations_unit(transform, unit):
    assert CERTIFIERS["tss"](transform=transform).radius_norm() == unit


def test_rows_do_not_depend_on_the_batch():
    data = brightness_data(MEANS[:3])
    rows = [[{k: v for k, v in r.items() if k != "time"} for r in
             run(MeanThreshold(), data, "contrast", batch=batch)] for batch in (7, 1000)]
    assert rows[0] == rows[1]


def without_time(rows):
    return [{k: v for k, v in row.items() if k != "time"}
            for row in sorted(rows, key=lambda r: r["idx"])]


def test_resumes_after_a_kill_and_shards_merge_to_one_run(tmp_path, monkeypatch):
    data, transform = brightness_data(MEANS), "translation:sigma=1.5"
    model = MeanThreshold()
    whole = run(model, data, transform, n=400, out=tmp_path / "whole.tsv")
    restore = dying_writer(monkeypatch, rows=2, torn="3\t1\t")
    with pytest.raises(KeyboardInterrupt):
        run(model, data, transform, n=400, out=tmp_path / "cut.tsv")
    restore()
    assert without_time(run(model, data, transform, n=400, out=tmp_path / "cut.tsv")) == \
        without_time(whole)
    out = tmp_path / "s.tsv"
    for k in range(2):
        run(model, data, transform, n=400, out=out, shard=(k, 2))
    merged = merge_records([shard_path(out, k, 2) for k in range(2)], tmp_path / "m.tsv")
    assert without_time(read_records(merged).rows()) == without_time(whole)


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("kwargs", "says"), [
    ({"options": {}}, "certifier 'tss' needs a transformation: pass --transform NAME"),
    ({"options": {"transform": "translation:sigma=5"}},
     "translation sigma 5 pixels is larger than the 4x4 image"),
    ({"options": {"transform": "brightness:sigma_b=0"}},
     "certifier 'tss': transformation 'brightness': sigma_b must be a positive finite"),
    ({"options": {"transform": "brightness"}, "sigma": 0.25},
     "certifier 'tss' draws no noise: drop --sigma and --noise"),
])
def test_refusals_are_one_line_before_any_file(kwargs, says, tmp_path):
    out = tmp_path / "r.tsv"
    with pytest.raises(SmoothcertError) as err:
        certify_dataset(MeanThreshold(), brightness_data(MEANS[:2]), certifier="tss",
                        num_classes=2, n=100, out=out, **kwargs)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not list(tmp_path.iterdir())


def test_a_model_of_ablated_inputs_is_refused(tmp_path):
    model = nn.Sequential(AblationEncoding(), nn.Flatten(), nn.Linear(32, 2))
    model.input_encoding, model.input_shape = "ablation", (1, 4, 4)
    with pytest.raises(SmoothcertError, match="reads ablation-encoded inputs"):
        run(model, brightness_data(MEANS[:2]), "brightness", out=tmp_path / "r.tsv")
    assert not list(tmp_path.iterdir())


def test_a_plot_of_a_tss_file_says_no_sigma(tmp_path):
    """No pixel noise is drawn: the curves' title gives n and α, not "σ=0"."""
    from smoothcert.evaluation.plots import run_parameters
    from smoothcert.runs import certify_dataset
    from smoothcert.runs.records import read_records

    data = torch.utils.data.TensorDataset(torch.full((2, 1, 4, 4), 0.6),
                                          torch.zeros(2, dtype=torch.long))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
    out = tmp_path / "r.tsv"
    certify_dataset(model, data, certifier="tss", options={"transform": "brightness"},
                    n0=10, n=20, batch=20, num_classes=2, out=out)
    assert run_parameters(read_records(out)) == {"n": 20, "alpha": 0.001}
