"""The certifier registry's options: defaults fill the run's identity, bad options are refused."""

import pytest

from smoothcert.certifiers import CERTIFIERS, Certifier, certificate_row, register_certifier
from smoothcert.errors import SmoothcertError
from smoothcert.runs import RunConfig
from smoothcert.smoothing.smoothed import Certificate


@pytest.fixture
def toy_task():
    name = "toy-certifier-for-tests"

    @register_certifier(name)
    class Toy(Certifier):
        columns = ("idx",)

        def __init__(self, *, steps: int = 100, lr: float = 0.5):
            self.steps, self.lr = steps, lr

        def program(self, run, x, label, idx, generator):
            return {}
            yield

    yield name
    del CERTIFIERS[name]


def config(task, **options):
    return RunConfig(task=task, checkpoint_sha256="0" * 64, dataset="digits", split="test",
                     sigma=0.25, n=10, alpha=0.01, batch=10, seed=0, options=options)


def test_options_are_completed_with_defaults_and_typed(toy_task):
    assert config(toy_task).options == {"steps": 100, "lr": 0.5}
    assert config(toy_task, lr=1).options == {"steps": 100, "lr": 1.0}  # int accepted as float
    with pytest.raises(SmoothcertError, match="no option depth; valid: steps, lr"):
        config(toy_task, depth=3)
    with pytest.raises(SmoothcertError, match="steps must be of type int"):
        config(toy_task, steps=2.5)
    with pytest.raises(SmoothcertError, match="unknown certifier 'nope'"):
        config("nope")


def test_certificate_row_marks_abstention_as_cohen_does():
    abstain = Certificate(None, 0.0, 0.4, True, 40, 10, 100, 0.001, 0.25)
    assert certificate_row(abstain, 3)["predict"] == -1
    assert certificate_row(abstain, 3)["correct"] == 0
    ok = Certificate(3, 0.7, 0.9, False, 90, 10, 100, 0.001, 0.25)
    assert certificate_row(ok, 3)["correct"] == 1 and certificate_row(ok, 2)["correct"] == 0


def test_bad_option_value_is_refused_before_any_file_is_written(tmp_path, capsys):
    from conftest import write_checkpoint
    from smoothcert.cli.app import main

    checkpoint = write_checkpoint(tmp_path / "c.pt")
    out = tmp_path / "r.tsv"
    assert main(["certify", str(checkpoint), "--certifier", "lbound", "--opt", "bound=bernstein",
                 "--n", "10", "--max", "1", "--out", str(out), "--device", "cpu",
                 "--no-progress"]) == 2
    assert "bound is one of" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
