"""The certifier registry's options: defaults fill the run's identity, bad options are refused."""

from dataclasses import dataclass

import pytest

from smoothcert.certifiers import CERTIFIERS, Certifier, certificate_row, register_certifier
from smoothcert.errors import SmoothcertError
from smoothcert.registry import option
from smoothcert.runs import RunConfig
from smoothcert.smoothing.smoothed import Certificate


@pytest.fixture
def toy_task():
    name = "toy-certifier-for-tests"

    @register_certifier(name)
    class Toy(Certifier):
        columns = ("idx",)

        @dataclass(frozen=True)
        class Options:
            steps: int = option(100, "steps")
            lr: float = option(0.5, "step size")

        def program(self, run, x, label, idx, generator):
            return {}
            yield

    yield name
    del CERTIFIERS[name]


def config(task, **options):
    return RunConfig(certifier=task, checkpoint_sha256="0" * 64, dataset="digits", split="test",
                     sigma=0.25, n=10, alpha=0.01, batch=10, seed=0, options=options)


def test_options_are_completed_with_defaults_and_typed(toy_task):
    assert config(toy_task).options == {"steps": 100, "lr": 0.5}
    assert config(toy_task, lr=1).options == {"steps": 100, "lr": 1.0}  # int accepted as float
    with pytest.raises(SmoothcertError, match=r"unknown option\(s\) depth for certifier "
                                              r"'toy-certifier-for-tests'; valid: steps, lr"):
        config(toy_task, depth=3)
    with pytest.raises(SmoothcertError, match="steps must be an integer, got 2.5"):
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


def test_a_certifier_declares_the_rules_of_its_own_columns(tmp_path):
    """The record schema collects column rules from the registry: a newly registered certifier's
    column is checked in every record file, and two rules for one name are refused."""
    from smoothcert.certifiers.columns import Column, Relation, count
    from smoothcert.runs.records import read_records
    from smoothcert.runs.schema import known_columns

    @register_certifier("toy-with-columns")
    class WithColumns(Certifier):
        columns = ("idx", "label", "predict", "radius", "correct", "time", "hits", "tries")
        column_rules = {"hits": count("hits"), "tries": count("tries")}
        relations = (Relation(("hits", "tries"), lambda h, t: h > t,
                              lambda h, t: f"hits is {h}, more than tries ({t})"),)

        def program(self, run, x, label, idx, generator):
            return {}
            yield

    try:
        assert known_columns()["hits"] == count("hits")
        path = tmp_path / "r.tsv"
        header = "idx\tlabel\tpredict\tradius\tcorrect\ttime\thits\ttries\n"
        path.write_text(header + "0\t1\t1\t0.5\t1\t2.0\t3\t4\n1\t1\t1\t0.5\t1\t2.0\t-1\t4\n")
        with pytest.raises(SmoothcertError, match="line 3: hits is -1; hits is a count"):
            read_records(path)
        path.write_text(header + "0\t1\t1\t0.5\t1\t2.0\t5\t4\n")
        with pytest.raises(SmoothcertError, match="line 2: hits is 5, more than tries"):
            read_records(path)
        WithColumns.column_rules = {"n": Column("float", "n is a number")}  # not CERTIFY's
        with pytest.raises(TypeError, match="declares column 'n' with another rule"):
            known_columns()
    finally:
        del CERTIFIERS["toy-with-columns"]
