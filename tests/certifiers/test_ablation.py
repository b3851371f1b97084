"""The ``ablation`` certifier (Levine & Feizi): options, refusals, determinism, the ℓ0 rows.

The golden comparisons with the authors' code are in ``test_ablation_golden.py``, the exhaustive
patch search and the ℓ0 combinatorics in ``test_ablation_soundness.py``.
"""

import math

import pytest
import torch
from torch import nn

from smoothcert.certifiers import CERTIFIERS
from smoothcert.errors import SmoothcertError
from smoothcert.models.encodings import AblationEncoding
from smoothcert.runs import certify_dataset
from smoothcert.runs.records import read_manifest, read_records
from smoothcert.stats import clopper_pearson_lower
from smoothcert.stats.ablation import l0_radius


class Net64(nn.Module):
    """A fixed affine map of the encoded (2C, H, W) input to logits, in float64."""

    def __init__(self, weight, bias):
        super().__init__()
        self.register_buffer("weight", torch.as_tensor(weight, dtype=torch.float64))
        self.register_buffer("bias", torch.as_tensor(bias, dtype=torch.float64))

    def forward(self, encoded):
        return encoded.flatten(1).double() @ self.weight.T + self.bias


def encoded(net: nn.Module, shape=(1, 8, 8), encoding: bool = True) -> nn.Module:
    """``net`` behind the authors' encoding, marked as a model of ablation smoothing (what
    ``train --method ablation`` builds); without ``encoding``, a plain model of the same net."""
    model = nn.Sequential(AblationEncoding(), net) if encoding else nn.Sequential(net)
    model.input_shape, model.input_encoding = shape, "ablation" if encoding else None
    return model.eval()


def random_model(classes=4, shape=(1, 8, 8), seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    d = 2 * math.prod(shape)
    weight = torch.randn(classes, d, generator=g, dtype=torch.float64) * scale / math.sqrt(d)
    bias = torch.randn(classes, generator=g, dtype=torch.float64)
    return encoded(Net64(weight, bias), shape)


class Brightness(nn.Module):
    """Votes by the mean of the kept pixels: class c's logit is −scale·(mean − c/(K − 1))², read
    from the encoding (a kept pixel's two channels sum to 1, an ablated one's to 0)."""

    def __init__(self, classes=4, scale=40.0):
        super().__init__()
        self.classes, self.scale = classes, scale

    def forward(self, encoded):
        half = encoded.shape[1] // 2
        kept = encoded.flatten(1).sum(dim=1)
        mean = encoded[:, :half].flatten(1).sum(dim=1) / kept.clamp(min=1)
        centres = torch.linspace(0, 1, self.classes, dtype=encoded.dtype)
        return -self.scale * (mean[:, None] - centres) ** 2


def images(count=4, shape=(1, 8, 8), classes=4, seed=1, spread=0.5):
    """Images of class y: brightness y/(K − 1) plus uniform noise of width ``spread``, clipped."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(count) % classes
    level = labels.float()[:, None, None, None] / (classes - 1)
    xs = (level + (torch.rand((count, *shape), generator=g) - 0.5) * spread).clamp(0, 1)
    return torch.utils.data.TensorDataset(xs, labels)


def certify(model, data, classes=4, **kwargs):
    kwargs.setdefault("options", {"mode": "column", "size": 2})
    return certify_dataset(model, data, certifier="ablation", num_classes=classes, batch=64,
                           **kwargs)


def without_time(rows):
    return [{k: v for k, v in r.items() if k not in ("time", "seed")} for r in rows]


@pytest.mark.parametrize(("options", "says"), [
    ({"mode": "rows"}, "unknown mode 'rows'"),
    ({"mode": "column", "size": 0}, "needs size >= 1"),
    ({"mode": "block", "size": -2}, "needs size >= 1"),
    ({"mode": "pixels", "keep": 0}, "needs keep >= 1"),
    ({"mode": "column", "threshold": 1.5}, r"threshold is a softmax score in \[0, 1\]"),
    ({"mode": "pixels", "keep": 5, "size": 3}, "size is not an option of mode 'pixels'"),
    ({"mode": "pixels", "keep": 5, "threshold": 0.5}, "threshold is not an option of mode"),
    ({"mode": "column", "keep": 9}, "keep is not an option of mode 'column'"),
])
def test_bad_options_are_one_line(options, says):
    with pytest.raises(SmoothcertError, match=says) as err:
        CERTIFIERS["ablation"](**options)
    assert "\n" not in str(err.value)


def test_defaults_are_the_authors():
    c = CERTIFIERS["ablation"]()
    assert (c.mode, c.size, c.keep, c.threshold) == ("column", 4, 45, 0.2)
    assert c.radius_norm() == "patch side, pixels"
    assert CERTIFIERS["ablation"](mode="pixels").radius_norm() == "ℓ0, pixels changed"


@pytest.mark.parametrize("mode", ["column", "block"])
def test_patches_certify_identically_whatever_the_seed(mode, tmp_path):
    model, data = encoded(Brightness()), images(spread=1.2)
    options = {"mode": mode, "size": 2}
    a = certify(model, data, options=options, seed=0, out=tmp_path / "a.tsv")
    b = certify(model, data, options=options, seed=12345)
    assert without_time(a) == without_time(b)
    positions = 8 if mode == "column" else 64
    assert all(r["n"] == positions and r["n0"] == 0 and r["predict"] >= 0 for r in a)
    assert all(r["p_lower"] == r["nA"] / r["n"] for r in a)
    assert {r["radius"] for r in a} != {0}, "nothing certified: the test would prove little"
    identity = read_manifest(tmp_path / "a.tsv")["identity"]
    assert (identity["noise"], identity["sigma"]) == ("none", 0.0)  # no noise is pretended
    assert without_time(read_records(tmp_path / "a.tsv").rows()) == without_time(a)


def test_a_model_without_the_encoding_is_refused_before_any_file(tmp_path):
    plain = encoded(Net64(torch.zeros(4, 64), torch.zeros(4)), encoding=False)
    with pytest.raises(SmoothcertError, match="train it with --method ablation"):
        certify(plain, images(), out=tmp_path / "r.tsv")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("options", "says"), [
    ({"mode": "column", "size": 9}, "a band of 9 columns is wider than the image"),
    ({"mode": "block", "size": 9}, "a 9x9 block does not fit a 8x8 image"),
    ({"mode": "pixels", "keep": 65}, "keep=65 is more than the image's 64 pixels"),
])
def test_an_ablation_larger_than_the_image_is_refused_before_any_file(options, says, tmp_path):
    with pytest.raises(SmoothcertError, match=says):
        certify(random_model(), images(), options=options, out=tmp_path / "r.tsv")
    assert not list(tmp_path.iterdir())


def test_sigma_and_noise_mean_nothing_and_are_refused():
    for extra in ({"sigma": 0.5}, {"noise": "gaussian"}):
        with pytest.raises(SmoothcertError, match="draws no noise: drop --sigma and --noise"):
            certify(random_model(), images(), **extra)


def test_pixels_rows_are_certify_with_the_l0_bound():
    # CERTIFY's two segments with random pixel ablation: p_lower the Clopper–Pearson bound of
    # the selected class's count, radius the largest ρ of the ℓ0 bound (d = 64 pixels, k = 8).
    model, data = encoded(Brightness()), images(count=8, spread=1.5)
    rows = certify(model, data, options={"mode": "pixels", "keep": 8}, n0=20, n=400,
                   alpha=0.01, seed=4)
    kinds = set()
    for r in rows:
        assert (r["n0"], r["n"]) == (20, 400)
        assert r["p_lower"] == pytest.approx(clopper_pearson_lower(r["nA"], 400, 0.01), rel=1e-12)
        rho = l0_radius(r["p_lower"], 64, 8)
        assert (r["predict"] == -1) == (rho is None)
        assert r["radius"] == (0 if rho is None else rho)
        assert r["nB"] <= r["nA"] or r["predict"] == -1
        kinds.add("abstain" if rho is None else ("radius" if rho > 0 else "zero"))
    assert "radius" in kinds
    again = certify(model, data, options={"mode": "pixels", "keep": 8}, n0=20, n=400,
                    alpha=0.01, seed=4)
    assert without_time(again) == without_time(rows)  # the run's generators: reproducible
    other = certify(model, data, options={"mode": "pixels", "keep": 8}, n0=20, n=400,
                    alpha=0.01, seed=5)
    assert [r["nA"] for r in other] != [r["nA"] for r in rows]  # and random


def test_pixels_of_a_constant_model_are_certified_as_far_as_n_draws_allow():
    # Every draw votes class 2: nA = n, p_lower = α^(1/n) in closed form.
    net = Net64(torch.zeros(4, 128), torch.tensor([0.0, 0.0, 5.0, 0.0]))
    rows = certify(encoded(net), images(count=2), options={"mode": "pixels", "keep": 4},
                   n0=10, n=1000, alpha=0.001)
    p = 0.001 ** (1 / 1000)
    for r in rows:
        assert (r["predict"], r["nA"], r["nB"]) == (2, 1000, 0)
        assert r["p_lower"] == pytest.approx(p, rel=1e-12)
        assert r["radius"] == l0_radius(p, 64, 4) > 0


# ------------------------------------------- the certifier contract (test_certifier_contract.py)
@pytest.mark.parametrize("options", [{"mode": "block", "size": 3},
                                     {"mode": "pixels", "keep": 8}])
def test_resumes_after_a_kill_to_the_rows_of_an_uninterrupted_run(options, tmp_path,
                                                                   monkeypatch):
    from conftest import dying_writer

    model, data = encoded(Brightness()), images(count=6, spread=1.2)
    run = dict(options=options, n0=10, n=200, seed=3)
    whole = certify(model, data, out=tmp_path / "whole.tsv", **run)
    restore = dying_writer(monkeypatch, rows=3, torn="5\t1\t")
    with pytest.raises(KeyboardInterrupt):
        certify(model, data, out=tmp_path / "cut.tsv", **run)
    restore()
    resumed = certify(model, data, out=tmp_path / "cut.tsv", **run)
    assert without_time(resumed) == without_time(whole)


@pytest.mark.parametrize("options", [{"mode": "column", "size": 2},
                                     {"mode": "pixels", "keep": 8}])
def test_shards_merge_to_one_run(options, tmp_path):
    from smoothcert.runs.records import merge_records, shard_path

    model, data = encoded(Brightness()), images(count=5, spread=1.2)
    run = dict(options=options, n0=10, n=200, seed=3)
    whole = certify(model, data, **run)
    out = tmp_path / "s.tsv"
    for k in range(2):
        certify(model, data, out=out, shard=(k, 2), **run)
    merged = merge_records([shard_path(out, k, 2) for k in range(2)], tmp_path / "m.tsv")
    assert without_time(read_records(merged).rows()) == without_time(whole)


def test_no_class_above_the_threshold_anywhere_is_an_abstention():
    """A model whose softmax is flat (1/K = 0.25 for 4 classes) never reaches θ = 0.3: every
    count is 0. The authors' argmax of zeros would say class 0 (and count it correct on class-0
    images); the certifier abstains, with radius 0."""
    flat = encoded(Net64(torch.zeros(4, 128), torch.zeros(4)))
    rows = certify(flat, images(4), options={"mode": "column", "size": 2, "threshold": 0.3})
    assert [r["predict"] for r in rows] == [-1] * 4
    assert [r["correct"] for r in rows] == [0] * 4 and [r["radius"] for r in rows] == [0] * 4
    assert [(r["nA"], r["nB"]) for r in rows] == [(0, 0)] * 4
