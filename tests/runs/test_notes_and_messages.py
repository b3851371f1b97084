"""Notes and messages a new user meets (Step 15, issue 36 item 2).

- ``--n`` too small for any certificate at α: one note before the work starts. The closed forms:
  CERTIFY's best case, n of n votes, has p_lower = α^(1/n) (Clopper–Pearson with k = n), a
  radius > 0 exactly when n > log2(1/α); the runner-up's bound spends α/2 on p_lower and
  needs (α/2)^(1/n) > 1 − (α/2)^(1/n), i.e. n > log2(2/α); PREDICT's best case has the
  two-sided p-value 2·2^(−n), so it predicts only when n ≥ log2(2/α).
- ``--radii`` outside ``sequential``, ``merge`` of shards of different runs, CAT-RS without
  its teacher: each says what to type.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from conftest import Halfspace
from smoothcert import SmoothcertError, certify_dataset
from smoothcert.cli.app import main
from smoothcert.methods import build_method
from smoothcert.runs.records import merge_records

SHAPE = (1, 2, 2)
NOTE = "smoothcert"


def model():
    return Halfspace(torch.ones(SHAPE), b=1.0, input_shape=SHAPE)


DATA = [(torch.full(SHAPE, 0.9), 1), (torch.full(SHAPE, 0.1), 0)]


def notes(caplog, certifier, n, alpha, **run):
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        certify_dataset(model(), DATA, sigma=0.25, n0=10, n=n, alpha=alpha, num_classes=2,
                        certifier=certifier, **run)
    return [r.getMessage() for r in caplog.records if "cannot certify" in r.getMessage()
            or "cannot predict" in r.getMessage()]


@pytest.mark.parametrize("certifier, alpha, smallest", [
    ("certify", 0.001, math.floor(math.log2(1 / 0.001)) + 1),  # 10: 0.001^(1/10) = 0.501
    ("certify", 0.01, math.floor(math.log2(1 / 0.01)) + 1),  # 7
    ("runner-up", 0.001, math.floor(math.log2(2 / 0.001)) + 1),  # 11
    ("predict", 0.001, math.ceil(math.log2(2 / 0.001))),  # 11: 2·2^-11 = 0.00098 <= 0.001
])
def test_a_note_when_n_is_too_small_for_any_certificate(caplog, certifier, alpha, smallest):
    (note,) = notes(caplog, certifier, smallest - 1, alpha)
    assert note.startswith("note: ") and "\n" not in note
    assert f"--n {smallest - 1}" in note and f"--alpha {alpha:g}" in note
    assert f"at least {smallest}" in note  # the fix, computed from the closed form
    assert notes(caplog, certifier, smallest, alpha) == []  # the smallest n that can: silent


def test_the_note_comes_before_any_row(caplog, tmp_path, capsys):
    from smoothcert.runs import records

    seen = []
    original = records.RecordWriter.write

    def write(self, row):
        seen.append(len([r for r in caplog.records if "cannot certify" in r.getMessage()]))
        original(self, row)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(records.RecordWriter, "write", write)
        notes(caplog, "certify", 9, 0.001, out=tmp_path / "r.tsv")
    assert seen == [1, 1]  # said once, before the first row was written


def test_every_row_of_such_a_run_abstains():
    # the note's claim, checked: n = 9 at α = 0.001 abstains even on a point far from the plane
    rows = certify_dataset(model(), DATA, sigma=0.25, n0=10, n=9, alpha=0.001, num_classes=2)
    assert [r["predict"] for r in rows] == [-1, -1] and 0.001 ** (1 / 9) < 0.5


# --------------------------------------------------------------------------- messages
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from conftest import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("ck") / "checkpoint.pt")


@pytest.mark.parametrize("certifier, takes", [("certify", "takes no options"),
                                              ("data-dependent", "valid: ")])
def test_radii_outside_sequential_names_the_certifier_it_belongs_to(checkpoint, tmp_path,
                                                                     capsys, certifier, takes):
    assert main(["certify", str(checkpoint), "--certifier", certifier, "--radii", "0,0.25",
                 "--n0", "10", "--n", "50", "--max", "1", "--no-progress", "--device", "cpu",
                 "--out", str(tmp_path / "r.tsv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "(none)" not in err
    assert takes in err and "radii is an option of certifier 'sequential'" in err
    assert not (tmp_path / "r.tsv").exists()


def test_merge_names_the_field_the_shards_differ_in(tmp_path):
    run = dict(sigma=0.25, n0=10, n=50, num_classes=2)
    a = tmp_path / "r.tsv"
    certify_dataset(model(), DATA, **run, seed=1, shard=(0, 2), out=a)
    certify_dataset(model(), DATA, **run, seed=2, shard=(1, 2), out=a)
    shards = sorted(tmp_path.glob("r.shard*.tsv"))
    with pytest.raises(SmoothcertError, match=r"different configuration \(differs in: seed\)"):
        merge_records(shards, tmp_path / "m.tsv")
    assert not (tmp_path / "m.tsv").exists()


def test_catrs_without_its_teacher_names_the_flag():
    with pytest.raises(SmoothcertError) as err:
        build_method("catrs")
    said = str(err.value)
    assert "--param teacher_checkpoint=PATH" in said and "--param target=self" in said
    assert "\n" not in said


def test_an_unknown_key_names_every_plugin_of_the_family_that_takes_it():
    from smoothcert.methods import METHODS

    takers = sorted(name for name, cls in METHODS.items() if name != "gaussian"
                    and "lbd" in cls.option_defaults())
    assert len(takers) >= 2
    with pytest.raises(SmoothcertError) as err:
        build_method("gaussian", lbd=1.0)
    listed = ", ".join(map(repr, takers[:-1])) + f" and {takers[-1]!r}"
    assert str(err.value) == ("unknown hyperparameter(s) lbd for method 'gaussian'; valid: "
                              f"num_noise; lbd is a hyperparameter of methods {listed}")
