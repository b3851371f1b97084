"""The driver trains a run's teacher before the run (CAT-RS's ŷ reads its checkpoint), passes
the teacher's checkpoint to the run, and refuses a retrained teacher whose log differs from the
published one. Fast: the CLI calls are recorded, not run; not part of ``make test``
(``make studies-smoke`` runs it)."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as driver  # noqa: E402  (the driver next to this file)

LOG = "epoch\tloss\tseconds\n1\t0.5\t{}\n"


@pytest.fixture
def study(tmp_path, monkeypatch):
    calls = []

    def fake_call(cmd, **kwargs):  # a train call writes what `smoothcert train` would
        calls.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        (out / "log.tsv").write_text(LOG.format(len(calls)))
        (out / "checkpoint.pt").write_bytes(b"weights")

    monkeypatch.setattr(driver, "call", fake_call)
    args = SimpleNamespace(quick=False, out=str(tmp_path / "out"), work=str(tmp_path / "work"),
                           device="cpu", data_root=None)
    return driver.Study(args), calls


def test_the_teacher_is_trained_first_and_passed_to_the_run(study):
    s, calls = study
    s.train("catrs_teacher_s050")
    assert [c[c.index("--config") + 1].rsplit("/", 1)[1] for c in calls] == [
        "gaussian_s025.yaml", "catrs_teacher_s050.yaml"]
    teacher = s.work / "gaussian_s025" / "checkpoint.pt"
    assert calls[1][calls[1].index("--param") + 1] == f"teacher_checkpoint={teacher}"
    (s.work / "catrs_teacher_s050" / "trained").unlink()
    s.train("catrs_teacher_s050")  # the teacher's checkpoint is there: not trained again
    assert len(calls) == 3 and "catrs_teacher_s050.yaml" in calls[2][calls[2].index("--config") + 1]


def test_a_retrained_teacher_must_match_its_published_log(study):
    s, calls = study
    published = s.out / "records" / "gaussian_s025"
    published.mkdir(parents=True)
    (published / "log.tsv").write_text("epoch\tloss\tseconds\n1\t0.7\t9\n")  # another model
    with pytest.raises(SystemExit, match="differs from the published"):
        s.train("catrs_teacher_s050")
    assert len(calls) == 1  # the run itself never started
