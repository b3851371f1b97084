"""The engine's compile mode (CUDA graphs: torch.compile's reduce-overhead and max-autotune):
a setting of the run's identity, one batch shape for every forward (the last, partial batch of
soft scores padded too), a graph step marked per forward and outputs copied out of the graph's
memory, which the next replay overwrites. No GPU: torch.compile is replaced by the identity and
a graph's reused output memory by a model that returns one tensor it overwrites."""

import pytest
import torch
from torch import nn

from smoothcert import Gaussian
from smoothcert.errors import SmoothcertError
from smoothcert.runs import RunConfig
from smoothcert.smoothing.engine import COMPILE_MODES, BatchedVotes, Draws
from smoothcert.smoothing.smoothed import Smoothed

pytestmark = pytest.mark.usefixtures("one_thread")


class Linear(nn.Module):
    """A fixed linear map of a 2×3×3 input to 3 outputs; records the batch shapes it sees."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        w = torch.randn(18, 3, generator=torch.Generator().manual_seed(3))
        self.register_buffer("w", w.to(dtype))
        self.rows: list[int] = []

    def forward(self, x):
        self.rows.append(x.shape[0])
        return x.flatten(1) @ self.w


class Replayed(Linear):
    """Returns its outputs in one tensor that every call overwrites, as a CUDA graph's replay
    does with the memory of its outputs."""

    def forward(self, x):
        y = super().forward(x)
        if getattr(self, "out", None) is None or self.out.shape != y.shape:
            self.out = torch.empty_like(y)
        return self.out.copy_(y)


@pytest.fixture
def compiled(monkeypatch):
    """torch.compile as the identity, recording its keyword arguments; CUDA graph steps
    counted."""
    calls = {"compile": [], "steps": 0}
    monkeypatch.setattr(torch, "compile", lambda m, **kw: calls["compile"].append(kw) or m)

    def step():
        calls["steps"] += 1

    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", step)
    return calls


def test_compile_mode_is_checked_and_recorded():
    assert COMPILE_MODES == ("default", "reduce-overhead", "max-autotune")
    with pytest.raises(SmoothcertError, match="compile_mode must be one of"):
        BatchedVotes(compile=True, compile_mode="turbo")
    with pytest.raises(SmoothcertError, match="needs compile on"):
        BatchedVotes(compile_mode="reduce-overhead")
    assert BatchedVotes(compile=True, compile_mode="max-autotune").settings()["compile_mode"] \
        == "max-autotune"
    common = dict(certifier="certify", checkpoint_sha256="x", dataset="digits", split="test",
                  sigma=0.25, n=50, alpha=0.001, batch=64, seed=0, n0=10)
    assert RunConfig(**common, engine={"compile": True, "compile_mode": "default"}).engine == {
        "compile": True}  # the default mode stays out of the identity: older files resume
    assert RunConfig(**common, engine={"compile": True, "compile_mode": "reduce-overhead"}
                     ).engine == {"compile": True, "compile_mode": "reduce-overhead"}


@pytest.mark.parametrize("mode, kwargs", [("default", {"dynamic": False}),
                                          ("reduce-overhead", {"dynamic": False,
                                                               "mode": "reduce-overhead"})])
def test_the_model_is_compiled_once_in_its_mode(mode, kwargs, compiled):
    engine, model = BatchedVotes(compile=True, compile_mode=mode), Linear()
    assert engine.prepare(model) is engine.prepare(model)
    assert compiled["compile"] == [kwargs]


def values_program(x, noise, n, seed):
    values = yield Draws(x, noise, (n,), torch.Generator().manual_seed(seed), outputs="values")
    return values[0]


def test_graph_outputs_are_copied_before_the_next_replay(compiled):
    """The values of a request span batches; read from a graph's memory they would all be the
    last batch's (a float64 model: the engine keeps its outputs as they are, without a cast
    that would copy them). Each forward also starts a graph step."""
    x = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(1))

    def values(model, engine):
        (done,) = engine.run(model, [(0, values_program(x, Gaussian(0.5), 70, 0))], 3, 32)
        return done.result

    wide = torch.float64
    fresh = values(Linear(wide), BatchedVotes())
    assert fresh.shape == (70, 3)
    reused = values(Replayed(wide), BatchedVotes(compile=True))
    assert not (reused == fresh).all()  # what a graph's reused memory would give
    graphs = BatchedVotes(compile=True, compile_mode="reduce-overhead")
    assert (values(Replayed(wide), graphs) == fresh).all()
    assert compiled["steps"] == 3  # one per batch: 32 + 32 + 6 of 32 rows (padded)


def test_a_compiled_model_sees_one_batch_shape_soft_scores_included(compiled):
    x = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(2))
    scores = {}
    for compile_ in (False, True):
        model = Linear()
        engine = BatchedVotes(compile=compile_, compile_mode="reduce-overhead" if compile_
                              else "default")
        smoothed = Smoothed(model, Gaussian(0.5), 3, engine)
        counts = smoothed.engine.votes(model, x, smoothed.noise, 70, 3, 32,
                                       torch.Generator().manual_seed(0))
        scores[compile_] = (counts, engine.soft_scores(model, x, smoothed.noise, 70, 3, 32,
                                                        torch.Generator().manual_seed(0)))
        assert set(model.rows) == ({32} if compile_ else {32, 6})
    assert torch.equal(scores[True][0], scores[False][0])  # the same draws, the same votes
    torch.testing.assert_close(scores[True][1], scores[False][1], rtol=0, atol=1e-12)
