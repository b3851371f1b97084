"""Forward passes counted where they happen (model_calls.py, certifiers/deterministic.py,
certifiers/lbound.py, evaluation/metrics.py): a clean forward is a pass like a noisy one, for an
ensemble's ``member_passes`` and for one model's n0 + n; ``report --plot-cost`` refuses a file
of 0 passes (it cannot sit on a log axis) instead of plotting it with a matplotlib warning."""

import warnings

import pytest
import torch

from conftest import write_checkpoint
from smoothcert.data.datasets import load_dataset
from smoothcert.errors import SmoothcertError
from smoothcert.evaluation.metrics import forward_passes
from smoothcert.evaluation.plots import plot_cost_frontier
from smoothcert.models.ensemble import Ensemble
from smoothcert.runs import certify_dataset
from smoothcert.runs.records import read_records

N0, N = 6, 24
RUN = dict(sigma=0.25, n0=N0, n=N, alpha=0.001, batch=32, seed=1, skip=180)  # 2 digits

# certifier, options: the passes of one model per example (selection, estimation, clean)
CASES = [
    ("certify", {}, N0 + N),
    ("deterministic", {}, N + 1),  # the clean prediction, then n draws
    ("lbound", {"select": "clean"}, N + 1),
    ("lbound", {"select": "draws"}, N0 + N),
    ("lbound-heuristic", {}, 1),  # one clean forward, no draws
]


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", "test")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("cost") / "m.pt")


@pytest.mark.parametrize(("certifier", "options", "passes"), CASES)
def test_an_ensembles_member_passes_count_every_forward(tmp_path, digits, checkpoint,
                                                        certifier, options, passes):
    """Before: lbound-heuristic recorded 0, deterministic and lbound (clean) n per member."""
    out = tmp_path / "e.tsv"
    rows = certify_dataset(Ensemble.from_checkpoints([checkpoint] * 3), digits, **RUN,
                           certifier=certifier, options=options, out=out)
    assert [r["member_passes"] for r in rows] == [3 * passes] * 2
    assert list(forward_passes(read_records(out))) == [3 * passes] * 2


@pytest.mark.parametrize(("certifier", "options", "passes"), CASES)
def test_one_models_forward_passes_count_its_clean_pass(tmp_path, digits, checkpoint,
                                                        certifier, options, passes):
    """Before: deterministic and lbound (clean) counted n0 + n, lbound-heuristic nothing."""
    out = tmp_path / "m.tsv"
    certify_dataset(checkpoint, digits, **RUN, certifier=certifier, options=options, out=out)
    assert list(forward_passes(read_records(out))) == [passes] * 2


def test_cost_plot_refuses_a_file_of_zero_passes_without_a_warning(tmp_path, digits,
                                                                   checkpoint):
    """An ensemble's lbound-heuristic file written before the clean passes were counted holds
    member_passes 0: refused in one line naming it, and no matplotlib warning (log axis at 0)."""
    out = tmp_path / "old.tsv"
    certify_dataset(Ensemble.from_checkpoints([checkpoint] * 2), digits, **RUN,
                    certifier="lbound-heuristic", out=out)
    header, *rows = out.read_text().splitlines()
    column = header.split("\t").index("member_passes")
    zeroed = ["\t".join(f if i != column else "0" for i, f in enumerate(row.split("\t")))
              for row in rows]
    out.write_text("\n".join([header, *zeroed]) + "\n")
    good = tmp_path / "good.tsv"
    certify_dataset(checkpoint, digits, **RUN, out=good)
    image = tmp_path / "cost.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(SmoothcertError, match="0 forward passes") as err:
            plot_cost_frontier([read_records(good), read_records(out)], image, 0.25)
        assert "\n" not in str(err.value) and "old.tsv" in str(err.value)
        assert not image.exists()
        plot_cost_frontier([read_records(good)], image, 0.25)
    assert image.stat().st_size > 0


class Counting(torch.nn.Module):
    """A halfspace on 1×4×4 inputs that counts the rows it is called on (every forward pass of
    every model of a run, noisy or clean), the oracle of ``report --cost``."""

    def __init__(self, shift: float = 0.0):
        super().__init__()
        w = torch.zeros(16)
        w[0] = 1.0
        self.register_buffer("w", w)
        self.shift, self.rows, self.num_classes = shift, 0, 2

    def forward(self, x):
        self.rows += x.shape[0]
        z = x.flatten(1) @ self.w - 0.2 - self.shift
        return torch.stack([-z, z], dim=1)


# certifier, options, other models' roles: their passes vary per example (Q draws, levels
# reached, the selection's draws), so the file's count is checked against every model's rows
COMPOSED = [
    ("dsrs", {}, ()),
    ("cascade", {"sigmas": "0.5,0.25"}, ("level2",)),
    ("aces", {"selection": "entropy", "entropy_threshold": 0.5}, ("core",)),
]


@pytest.mark.parametrize(("name", "options", "roles"), COMPOSED)
def test_a_certifiers_own_count_is_every_row_its_models_saw(name, options, roles, tmp_path):
    xs = torch.zeros(6, 1, 4, 4)
    xs[:, 0, 0, 0] = torch.tensor([0.0, 0.05, 0.19, 0.22, 0.5, 0.9])  # answers and abstentions
    data = torch.utils.data.TensorDataset(xs, (xs[:, 0, 0, 0] > 0.2).long())
    model, others = Counting(), {role: Counting(0.01 * k) for k, role in enumerate(roles, 1)}
    certify_dataset(model, data, sigma=0.5, n0=N0, n=4 * N, alpha=0.01, batch=64,
                    certifier=name, options=options, models=others or None,
                    out=tmp_path / "r.tsv")
    records = read_records(tmp_path / "r.tsv")
    seen = model.rows + sum(m.rows for m in others.values())
    assert forward_passes(records).sum() == seen


def test_a_cascade_file_without_levels_drawn_cannot_say_its_cost(tmp_path):
    data = torch.utils.data.TensorDataset(torch.zeros(2, 1, 4, 4), torch.zeros(2).long())
    certify_dataset(Counting(), data, sigma=0.5, n0=N0, n=N, certifier="cascade",
                    out=tmp_path / "r.tsv")
    records = read_records(tmp_path / "r.tsv")
    assert forward_passes(records) is not None
    del records.data["levels_drawn"]  # as a file of the cascade's first version
    assert forward_passes(records) is None
