"""Data-dependent smoothing (Alfarra et al.): OptimizeSigma on a toy with a known boundary, the
memory of Algorithm 3 (the three cases of Figure 2, and its invariant under random orders), and
the data-dependent certifiers end to end through the CLI, with resume."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn

from conftest import Halfspace, write_checkpoint
from smoothcert import SmoothcertError
from smoothcert.certifiers.data_dependent import Memory
from smoothcert.cli.app import main
from smoothcert.runs.records import manifest_path, read_records
from smoothcert.smoothing.sigma_optimization import CLAMP, optimize_sigma, soft_radius

DISTANCES = torch.tensor([0.25, 0.5, 1.0, 2.0])
# the ascent step is deterministic while ψ_A is clamped (Gaussian) or 1 (uniform), so σ_x at
# least reaches the σ where that stops: d / Φ⁻¹(0.98), resp. λ = d, i.e. σ = d / √3
THRESHOLD = {"gaussian": float(norm.ppf(CLAMP[1])), "uniform": math.sqrt(3.0)}


def toy_points(distances=DISTANCES):
    """2-D inputs (B, 1, 1, 2) at signed distance d from the boundary x₀ = 0."""
    return torch.stack([torch.tensor([float(d), 0.3]) for d in distances]).reshape(-1, 1, 1, 2)


def toy_model():
    """Softmax of ±10·x₀: a sharp but smooth boundary, so the reparameterized gradient exists."""
    return Halfspace((10.0, 0.0), input_shape=(1, 1, 2))


# --------------------------------------------------------------------------- Algorithm 1
@pytest.mark.parametrize("noise", ["gaussian", "uniform"])
def test_sigma_grows_with_distance_and_raises_the_soft_radius(noise):
    model, x, sigma0 = toy_model(), toy_points(), 0.1
    g = torch.Generator().manual_seed(0)
    sigma_x = optimize_sigma(model, x, sigma0, num_steps=100, step_size=0.01, num_samples=256,
                             generator=g, noise=noise)
    assert (sigma_x.diff() > 0).all(), sigma_x  # monotone in the distance to the boundary
    assert (sigma_x >= 0.9 * DISTANCES / THRESHOLD[noise]).all(), sigma_x
    # the soft radius, estimated with common random numbers, rises well above its value at σ0
    before = soft_radius(model, x, sigma0, num_samples=20_000,
                         generator=torch.Generator().manual_seed(1), noise=noise)
    after = soft_radius(model, x, sigma_x, num_samples=20_000,
                        generator=torch.Generator().manual_seed(1), noise=noise)
    far = DISTANCES >= 0.5
    assert (after[far] > 2 * before[far]).all(), (before, after)
    assert (after <= DISTANCES + 0.05).all()  # and never beyond the true distance (d here)


class Training(nn.Module):
    """A halfspace with a trainable weight, to check modes and gradients are left alone."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([10.0, 0.0]))

    def forward(self, x):
        z = x.flatten(1) @ self.w
        return torch.stack([-z, z], dim=1)


def test_optimize_sigma_leaves_the_model_alone_and_is_reproducible():
    model = Training().train()
    x, sigma0 = toy_points(), torch.tensor([0.1, 0.2, 0.3, 0.4])
    run = [optimize_sigma(model, x, sigma0, num_steps=10, step_size=0.01, num_samples=8,
                          generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    torch.testing.assert_close(run[0], run[1], rtol=0, atol=0)
    assert run[0].shape == (4,) and not run[0].requires_grad and (run[0] > 0).all()
    assert model.training and model.w.requires_grad and model.w.grad is None
    same = optimize_sigma(model, x, sigma0, num_steps=0, step_size=0.01, num_samples=8,
                          generator=torch.Generator())
    torch.testing.assert_close(same, sigma0)  # K = 0: σ0 itself (as a fresh tensor)
    with pytest.raises(SmoothcertError, match="σ0 has 3 entries"):
        optimize_sigma(model, x, torch.ones(3), num_steps=1, step_size=0.1, num_samples=1,
                       generator=None)
    with pytest.raises(SmoothcertError, match="unknown noise 'no-such-noise'"):
        optimize_sigma(model, x, 0.1, num_steps=1, step_size=0.1, num_samples=1,
                       generator=None, noise="no-such-noise")


class Slab(nn.Module):
    """Class 0 on |x₀| < 0.1: at x = 0 the soft radius falls with σ beyond σ ≈ 0.05."""

    def forward(self, x):
        z = 50.0 * (0.1 - x.flatten(1)[:, :1].abs())
        return torch.cat([z, -z], dim=1)


def test_sigma_is_kept_positive():
    x = torch.zeros(1, 1, 1, 2)
    g = torch.Generator().manual_seed(4)
    sigma = optimize_sigma(Slab(), x, 0.08, num_steps=1, step_size=100.0, num_samples=64,
                           generator=g, min_sigma=1e-3)
    assert float(sigma) == pytest.approx(1e-3)


# --------------------------------------------------------------------------- Algorithm 3
def pt(*coords):
    return torch.tensor(coords, dtype=torch.float64)


def test_figure_2_left_same_class_overlap_is_kept():
    memory = Memory()
    assert memory.certify(pt(0.0, 0.0), 0, 1.0).case == "kept"
    out = memory.certify(pt(1.5, 0.0), 0, 1.0)  # the balls overlap, but agree
    assert (out.prediction, out.radius, out.adjusted, out.case) == (0, 1.0, False, "kept")
    assert len(memory) == 2


def test_figure_2_middle_inside_a_ball_of_another_class_takes_its_class():
    memory = Memory()
    memory.certify(pt(0.0, 0.0), 0, 1.0)
    out = memory.certify(pt(0.6, 0.0), 1, 0.8)  # x lies in B((0,0), 1) of class 0
    assert (out.prediction, out.adjusted, out.case) == (0, True, "inside")
    assert out.radius == pytest.approx(0.4)  # min(0.8, 1 − 0.6): inside both balls
    small = memory.certify(pt(-0.2, 0.0), 1, 0.3)
    assert (small.prediction, small.radius) == (0, 0.3)  # min(0.3, 0.8): radii never grow
    abstained = memory.certify(pt(0.0, 0.5), None, 0.0)  # the memory does predict there
    assert (abstained.prediction, abstained.radius, abstained.adjusted) == (0, 0.0, True)
    assert list(memory.classes) == [0, 0, 0, 0]


def test_figure_2_right_intersecting_ball_of_another_class_is_shrunk():
    memory = Memory()
    memory.certify(pt(0.0, 0.0), 0, 1.0)
    memory.certify(pt(0.0, 3.0), 2, 1.5)
    out = memory.certify(pt(1.5, 0.0), 1, 1.0)  # meets the class-0 ball only
    assert (out.prediction, out.adjusted, out.case) == (1, True, "shrunk")
    assert out.radius == pytest.approx(0.5)  # 1.5 − 1
    near_both = memory.certify(pt(0.0, 1.45), 1, 2.0)  # 0.45 from ball 0, 0.05 from ball 2
    assert (near_both.case, near_both.radius) == ("shrunk", pytest.approx(0.05))
    touching = memory.certify(pt(-1.0, 0.0), 3, 0.5)  # on the sphere: not inside, radius 0
    assert (touching.prediction, touching.radius, touching.case) == (3, 0.0, "shrunk")
    outside = memory.certify(pt(5.0, 5.0), None, 0.0)  # an abstention far away is no claim
    assert outside.prediction is None and not outside.adjusted and len(memory) == 5


def test_l1_memory_uses_l1_balls():
    memory = Memory("l1")
    memory.certify(pt(0.0, 0.0), 0, 1.0)
    out = memory.certify(pt(0.6, 0.6), 1, 1.0)  # L2 distance 0.85 < 1, but L1 distance 1.2
    assert out.case == "shrunk" and out.radius == pytest.approx(0.2)


def pairwise_ok(memory, tol=1e-12):
    """No two stored balls of different classes intersect: ‖x_i − x_j‖ ≥ R_i + R_j."""
    c, r = memory.classes, memory.radii
    dist = torch.cdist(memory.centers, memory.centers).numpy()
    differ = c[:, None] != c[None, :]
    return bool(np.all(dist[differ] >= (r[:, None] + r[None, :])[differ] - tol))


@pytest.mark.parametrize("norm_name", ["l2", "l1"])
def test_invariant_holds_after_every_insertion_in_random_orders(norm_name):
    """60 random points in the unit square with radii up to 0.4 (so overlaps abound), 3 classes
    and some abstentions, inserted in 30 random orders: after every insertion no two balls of
    different classes intersect, and no certificate's radius grows."""
    rng = np.random.default_rng(0)
    num = 60
    points = torch.from_numpy(rng.random((num, 2)))
    classes = rng.integers(0, 3, num)
    radii = rng.random(num) * 0.4
    abstain = rng.random(num) < 0.15
    adjusted = 0
    for _ in range(30):
        memory = Memory(norm_name)
        for i in rng.permutation(num):
            pred = None if abstain[i] else int(classes[i])
            out = memory.certify(points[i], pred, 0.0 if abstain[i] else radii[i])
            assert out.radius <= (0.0 if abstain[i] else radii[i])
            adjusted += out.adjusted
            c = memory.classes
            if norm_name == "l2":
                assert pairwise_ok(memory)
            else:
                dist = torch.cdist(memory.centers, memory.centers, p=1).numpy()
                r, differ = memory.radii, c[:, None] != c[None, :]
                assert np.all(dist[differ] >= (r[:, None] + r[None, :])[differ] - 1e-12)
    assert adjusted > 100  # the toy really exercises the adjustments


def test_memory_rebuilt_from_its_entries_decides_alike():
    rng = np.random.default_rng(1)
    points = torch.from_numpy(rng.random((30, 2)))
    first = Memory()
    results = [first.certify(p, int(c), r) for p, c, r in
               zip(points[:20], rng.integers(0, 2, 20), rng.random(20) * 0.3, strict=True)]
    rebuilt = Memory()
    for p, res in zip(points[:20], results, strict=True):
        if res.prediction is not None:
            rebuilt.add(p, res.prediction, res.radius)
    for p in points[20:]:
        assert first.certify(p, 1, 0.3) == rebuilt.certify(p, 1, 0.3)


# --------------------------------------------------------------------------- CLI, end to end
RUN = ["--n0", "10", "--n", "100", "--batch", "50", "--max", "5", "--no-progress",
       "--device", "cpu"]
DD = [*RUN, "--opt", "num_steps=5", "--opt", "step_size=0.01", "--opt", "num_samples=4"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("dd") / "checkpoint.pt", method="gaussian")


def certify(checkpoint, out, *extra):
    return main(["certify", str(checkpoint), "--certifier", "data-dependent", *DD,
                 "--out", str(out), *extra])


def without_time(path):
    return [{k: v for k, v in r.items() if k != "time"} for r in read_records(path).rows()]


def test_data_dependent_certify_records_sigma_x_and_resumes(checkpoint, tmp_path):
    out = tmp_path / "dd.tsv"
    assert certify(checkpoint, out) == 0
    rec = read_records(out)
    assert list(rec["idx"]) == list(range(5))
    assert rec.columns_order[:6] == ("idx", "label", "predict", "radius", "correct", "time")
    for col in ("sigma", "predict_mc", "radius_mc", "adjusted", "p_lower", "nA"):
        assert col in rec
    assert np.all(rec["sigma"] > 0) and np.any(rec["sigma"] != 0.25)  # σ_x, not the run's σ
    assert np.all(rec["radius"] <= rec["radius_mc"]) and set(rec["adjusted"]) <= {0, 1}
    assert rec.manifest["identity"]["options"] == {
        "num_steps": 5, "step_size": 0.01, "num_samples": 4, "memory": True}
    before = out.read_text()
    assert certify(checkpoint, out) == 0  # a finished run: nothing to add
    assert out.read_text() == before


def test_packed_rows_equal_the_algorithm_run_on_each_example_alone(checkpoint, tmp_path):
    """The engine packs several inputs' CERTIFY draws into one forward batch (batch 250 holds
    the 110 draws of two inputs and part of a third); each row still equals OptimizeSigma and
    CERTIFY at σ_x run on that example alone, with its own generator."""
    from smoothcert.data.datasets import load_dataset
    from smoothcert.models.checkpoint import model_from_checkpoint
    from smoothcert.noise.gaussian import Gaussian
    from smoothcert.rng import example_generator
    from smoothcert.smoothing.smoothed import Smoothed

    out = tmp_path / "packed.tsv"
    assert certify(checkpoint, out, "--batch", "250", "--opt", "memory=false") == 0
    model, _ = model_from_checkpoint(checkpoint)
    data = load_dataset("digits", "test")
    for row in read_records(out).rows():
        x, label = data.example(int(row["idx"]))
        gen = example_generator(0, int(row["idx"]))
        sigma_x = optimize_sigma(model, x.unsqueeze(0), 0.25, num_steps=5, step_size=0.01,
                                 num_samples=4, generator=gen)
        c = Smoothed(model, Gaussian(float(sigma_x[0])), 10).certify(x, 10, 100, 0.001, 250, gen)
        assert row["sigma"] == pytest.approx(float(sigma_x[0]), rel=1e-6)
        assert (row["predict"], row["nA"]) == (-1 if c.abstained else c.prediction, c.count)
        assert row["radius"] == pytest.approx(c.radius, rel=1e-9, abs=1e-12)


def test_interrupted_run_rebuilds_the_memory_and_equals_the_uninterrupted_one(
        checkpoint, tmp_path, monkeypatch):
    from smoothcert.certifiers import data_dependent as certifier
    from smoothcert.runs import records

    full, cut = tmp_path / "full.tsv", tmp_path / "cut.tsv"
    assert certify(checkpoint, full) == 0
    original, calls = records.RecordWriter.write, {"n": 0}

    def dying_write(self, row):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        original(self, row)

    monkeypatch.setattr(records.RecordWriter, "write", dying_write)
    assert certify(checkpoint, cut) == 130
    monkeypatch.setattr(records.RecordWriter, "write", original)
    sizes, build = [], certifier._rebuilt_memory

    def spy(run, norm):
        memory = build(run, norm)
        sizes.append(len(memory))
        return memory

    monkeypatch.setattr(certifier, "_rebuilt_memory", spy)
    assert certify(checkpoint, cut) == 0
    assert sizes == [int(np.sum(read_records(full)["predict"][:3] >= 0))]  # the 3 rows written
    assert without_time(cut) == without_time(full)


def test_memory_certifier_refuses_shards_and_leaves_no_file(checkpoint, tmp_path, capsys):
    out = tmp_path / "s.tsv"
    assert certify(checkpoint, out, "--num-shards", "2", "--shard-index", "0") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run it without --num-shards" in err
    assert list(tmp_path.iterdir()) == []
    assert certify(checkpoint, out, "--num-shards", "2", "--shard-index", "0",
                   "--opt", "memory=false") == 0
    shard = tmp_path / "s.shard0-of-2.tsv"
    assert list(read_records(shard)["idx"]) == [0, 2, 4] and manifest_path(shard).exists()
    assert set(read_records(shard)["adjusted"]) == {0}


@pytest.mark.parametrize("certifier", ["certify", "data-dependent"])
def test_uniform_noise_certifiers_write_l1_radii(certifier, checkpoint, tmp_path):
    out = tmp_path / "u.tsv"
    extra = DD if certifier.startswith("data") else RUN
    assert main(["certify", str(checkpoint), "--certifier", certifier, "--noise", "uniform",
                 *extra, "--sigma", "0.5", "--out", str(out)]) == 0
    rec = read_records(out)
    ok = rec["predict"] >= 0
    radius_mc = rec["radius_mc"] if "radius_mc" in rec else rec["radius"]
    expected = 2 * math.sqrt(3.0) * rec["sigma"] * (rec["p_lower"] - 0.5)
    np.testing.assert_allclose(radius_mc[ok], expected[ok], rtol=1e-12)
    if certifier == "certify":
        assert np.all(rec["sigma"] == 0.5)


def test_unknown_option_is_refused(checkpoint, tmp_path, capsys):
    assert certify(checkpoint, tmp_path / "x.tsv", "--opt", "steps=3") == 2
    assert "valid: num_steps, step_size, num_samples, memory" in capsys.readouterr().err
