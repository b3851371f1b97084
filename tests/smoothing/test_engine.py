"""The packed Monte Carlo engine: batches filled across inputs must not change any count."""

import numpy as np
import pytest
import torch
from torch import nn

from conftest import Halfspace, write_checkpoint
from smoothcert import Gaussian
from smoothcert.errors import SmoothcertError
from smoothcert.model_calls import current_call
from smoothcert.runs import RunConfig, run_dataset
from smoothcert.runs.records import read_manifest, read_records
from smoothcert.smoothing.engine import BatchedVotes, Draws
from smoothcert.smoothing.smoothed import Smoothed

pytestmark = pytest.mark.usefixtures("one_thread")


class Tangled(nn.Module):
    """A fixed random linear map of a 2×3×3 input to 4 classes: every class gets votes."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(18, 4, generator=torch.Generator().manual_seed(3)))

    def forward(self, x):
        return x.flatten(1) @ self.w


def inputs(count):
    g = torch.Generator().manual_seed(11)
    return [torch.rand(2, 3, 3, generator=g) for _ in range(count)]


def alone(smoothed, xs, n0, n, batch):
    return [smoothed.certify(x, n0, n, 0.001, batch, torch.Generator().manual_seed(i))
            for i, x in enumerate(xs)]


def packed(smoothed, xs, n0, n, batch):
    programs = [(i, smoothed.certify_program(x, n0, n, 0.001, torch.Generator().manual_seed(i)))
                for i, x in enumerate(xs)]
    done = {d.key: d.result for d in smoothed.run(programs, batch)}
    return [done[i] for i in range(len(xs))]


@pytest.mark.parametrize("n0, n, batch", [(7, 50, 16), (100, 1000, 64), (3, 5, 1000),
                                          (16, 33, 16), (1, 1, 1)])
def test_packing_across_inputs_gives_the_counts_of_one_input_at_a_time(n0, n, batch):
    # Chunks overflow into the next batch (carry), several inputs share a batch, requests are
    # smaller and larger than a batch: each input's certificate must be identical.
    smoothed = Smoothed(Tangled(), Gaussian(0.5), 4)
    xs = inputs(9)
    assert packed(smoothed, xs, n0, n, batch) == alone(smoothed, xs, n0, n, batch)


def test_packed_batches_are_full_until_the_work_runs_out():
    sizes = []

    class Recorder(Tangled):
        def forward(self, x):
            sizes.append(x.shape[0])
            return super().forward(x)

    smoothed = Smoothed(Recorder(), Gaussian(0.5), 4)
    packed(smoothed, inputs(9), 7, 50, 16)  # 9 × 57 = 513 draws = 32 full batches + 1
    assert sizes == [16] * 32 + [1]


def test_a_program_of_several_requests_and_empty_segments():
    smoothed = Smoothed(Halfspace((1.0, 0.0)), Gaussian(0.5), 2)
    x = torch.tensor([[[3.0]], [[0.0]]]).reshape(2, 1, 1)

    def program():
        first = yield Draws(x, smoothed.noise, (0, 5, 0), torch.Generator().manual_seed(0))
        second = yield Draws(x, smoothed.noise, (12,), torch.Generator().manual_seed(0))
        return first, second

    ((_, result, _),) = [(d.key, d.result, d.seconds) for d in smoothed.run([(0, program())], 4)]
    first, second = result
    # x is 6σ from the hyperplane: every draw votes class 1.
    np.testing.assert_array_equal(first, [[0, 0], [0, 5], [0, 0]])
    np.testing.assert_array_equal(second, [[0, 12]])


def test_a_program_must_yield_draws():
    def program():
        yield "not a request"

    smoothed = Smoothed(Tangled(), Gaussian(0.5), 4)
    with pytest.raises(TypeError, match="Draws"):
        list(smoothed.run([(0, program())], 8))


def test_bad_precision_is_refused():
    with pytest.raises(SmoothcertError, match="precision"):
        BatchedVotes(precision="fp8")


def test_bf16_autocast_runs_on_cpu_and_noise_stays_float32():
    seen = []

    class Spy(Tangled):
        def forward(self, x):
            seen.append(x.dtype)
            return super().forward(x)

    engine = BatchedVotes(precision="bf16")
    smoothed = Smoothed(Spy(), Gaussian(0.5), 4, engine)
    c = smoothed.certify(inputs(1)[0], 10, 100, 0.001, 32, torch.Generator().manual_seed(0))
    assert seen and set(seen) == {torch.float32}  # the input reaches the model in float32
    assert c.n == 100 and 0 <= c.count <= 100


def test_channels_last_gives_votes_of_the_same_distribution():
    # The NHWC buffer receives the noise in another order, so counts differ draw for draw but
    # not in distribution: a halfspace at distance σ has p = Φ(1) = 0.8413.
    x = torch.zeros(1, 4, 4)
    x[0, 0, 0] = 0.5
    w = torch.zeros(16)
    w[0] = 1.0
    smoothed = Smoothed(Halfspace(w), Gaussian(0.5), 2, BatchedVotes(channels_last=True))
    counts = smoothed.engine.votes(smoothed.model, x, smoothed.noise, 20_000, 2, 1000,
                                   torch.Generator().manual_seed(0))
    assert abs(int(counts[1]) / 20_000 - 0.8413) < 4 * (0.8413 * 0.1587 / 20_000) ** 0.5


def test_runner_rows_equal_per_example_certify_and_times_add_up(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m.pt")
    cfg = RunConfig(certifier="certify", checkpoint_sha256="x", dataset="digits", split="test",
                    sigma=0.25, n=300, alpha=0.001, batch=128, seed=5, skip=20, n0=40)
    path = run_dataset(cfg, ckpt, tmp_path / "c.tsv", progress=False)
    rows = read_records(path)
    from smoothcert.data.datasets import load_dataset
    from smoothcert.models import model_from_checkpoint
    from smoothcert.rng import example_generator

    model, _ = model_from_checkpoint(ckpt)
    smoothed = Smoothed(model, Gaussian(0.25), 10)
    data = load_dataset("digits", "test")
    for i, idx in enumerate(rows["idx"]):
        x, _ = data.example(int(idx))
        c = smoothed.certify(x, 40, 300, 0.001, 128, example_generator(5, int(idx)))
        assert int(rows["nA"][i]) == c.count and float(rows["radius"][i]) == c.radius
    assert all(t > 0 for t in rows["time"])
    assert read_manifest(path)["identity"]["engine"] == {}  # a plain run: the defaults


def test_engine_settings_enter_the_identity(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m.pt")
    common = dict(certifier="certify", checkpoint_sha256="x", dataset="digits", split="test",
                  sigma=0.25, n=50, alpha=0.001, batch=64, seed=0, max_count=2, n0=10)
    cfg = RunConfig(**common, engine={"precision": "bf16", "compile": False})
    assert cfg.engine == {"precision": "bf16"}  # defaults are left out of the identity
    path = run_dataset(cfg, ckpt, tmp_path / "c.tsv", progress=False)
    assert read_manifest(path)["identity"]["engine"] == {"precision": "bf16"}
    with pytest.raises(SmoothcertError, match="engine"):
        run_dataset(RunConfig(**common), ckpt, tmp_path / "c.tsv", progress=False)
    with pytest.raises(SmoothcertError, match="unknown engine setting"):
        RunConfig(**common, engine={"turbo": True})


def test_a_run_on_another_device_than_its_identity_is_refused(tmp_path):
    # CPU and CUDA generators give other noise: a record must name the device that drew it.
    ckpt = write_checkpoint(tmp_path / "m.pt")
    cfg = RunConfig(certifier="certify", checkpoint_sha256="x", dataset="digits", split="test",
                    sigma=0.25, n=50, alpha=0.001, batch=64, seed=0, max_count=1, n0=10,
                    device_type="cuda")
    with pytest.raises(SmoothcertError, match="device_type is 'cuda' but the model is on 'cpu'"):
        run_dataset(cfg, ckpt, tmp_path / "c.tsv", progress=False)
    assert not (tmp_path / "c.tsv").exists()


class Costly(Tangled):
    """Reports, in engine calls, 1 + [first coordinate > 0.5] base-model passes per row (a
    cost that depends on the noisy input, as an ensemble's consensus does)."""

    def forward(self, x):
        call = current_call()
        if call is not None:
            call.row_passes = 1 + (x.flatten(1)[:, 0] > 0.5).long()
        return super().forward(x)


def passes_of(smoothed, programs, batch):
    return {d.key: d.passes for d in smoothed.run(programs, batch)}


@pytest.mark.parametrize("batch", [1, 16, 1000])
def test_reported_passes_add_up_per_program_whatever_the_packing(batch):
    smoothed = Smoothed(Costly(), Gaussian(0.5), 4)
    xs = inputs(5)

    def programs():
        return [(i, smoothed.certify_program(x, 7, 50, 0.001, torch.Generator().manual_seed(i)))
                for i, x in enumerate(xs)]

    got = passes_of(smoothed, programs(), batch)
    for i, x in enumerate(xs):  # each program alone, its draws replayed by hand
        g = torch.Generator().manual_seed(i)
        noisy = torch.cat([Gaussian(0.5).perturb_(torch.empty(size, *x.shape), x, g)
                           for size in (7, 50)])  # chunks of ≤ CHUNK draws: one call each
        assert got[i] == int((1 + (noisy.flatten(1)[:, 0] > 0.5).long()).sum())
    assert set(passes_of(Smoothed(Tangled(), Gaussian(0.5), 4), programs(), batch).values()) \
        == {None}  # a model that reports nothing: no cost


def test_soft_scores_and_nested_runs_are_metered_into_their_program():
    class Flat(Tangled):
        def forward(self, x):
            call = current_call()
            if call is not None:
                call.row_passes = torch.full((len(x),), 3)
            return super().forward(x)

    smoothed = Smoothed(Flat(), Gaussian(0.5), 4)
    x = inputs(1)[0]

    def program():
        smoothed.soft_scores(x, 40, 16, torch.Generator().manual_seed(0))  # 120 passes
        smoothed.certify(x, 5, 20, 0.001, 8, torch.Generator().manual_seed(1))  # 75, nested
        yield Draws(x, smoothed.noise, (10,), torch.Generator().manual_seed(2))  # 30
        return None

    assert passes_of(smoothed, [(0, program())], 8) == {0: 120 + 75 + 30}
