"""The engine settings certify, predict and attack run with when a flag is left out: on CUDA
channels-last, and torch.compile with CUDA graphs (mode reduce-overhead) for a long run
(examples × (n0 + n) ≥ LONG_RUN_DRAWS), the batch measured where --batch is left out and bf16's
time measured beside a long float32 run's; on the CPU none of these; a record file already on
disk (or a sibling shard's) keeps the settings it was made with, so a file from before these
defaults resumes with the flags it was made with, or none.

No GPU is needed: the device choice is faked (``resolve_device``, ``rank_device``) and the run
itself replaced by a recorder of what ``certify_dataset`` was asked to do."""

import pytest

from conftest import write_checkpoint
from smoothcert.cli import dataset_run
from smoothcert.cli.app import main
from smoothcert.runs.records import read_records
from smoothcert.smoothing.probe import BATCHES, Tuning

SHORT = ["--n0", "10", "--n", "100", "--max", "4", "--batch", "50", "--no-progress"]
# the digits test split holds 359 examples: 359 × 100,000 draws ≥ LONG_RUN_DRAWS
LONG = ["--n0", "100", "--n", "100000", "--batch", "50", "--no-progress"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("engine") / "model.pt")


@pytest.fixture
def fake_run(monkeypatch):
    """Replace the run by a recorder of its keyword arguments; returns their list."""
    calls = []
    monkeypatch.setattr("smoothcert.runs.certify_dataset",
                        lambda model, data, **kw: calls.append(kw))
    return calls


@pytest.fixture
def cuda(monkeypatch):
    """Pretend --device auto found a CUDA device with a working torch.compile backend."""
    import torch

    monkeypatch.setattr(dataset_run, "resolve_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr("smoothcert.training.distributed.rank_device", lambda device: device)
    monkeypatch.setattr(dataset_run, "compiler_available", lambda: True)


def cuda_notes(caplog) -> list[str]:
    """The notes the CLI logged on what the CUDA defaults chose (cleared)."""
    said = [r.getMessage() for r in caplog.records if "CUDA defaults" in r.getMessage()]
    caplog.clear()
    return said


def test_long_cuda_runs_default_to_channels_last_and_compile(ckpt, tmp_path, fake_run, cuda,
                                                           caplog):
    assert 359 * 100_000 >= dataset_run.LONG_RUN_DRAWS > 4 * 100_000
    assert main(["certify", str(ckpt), "--out", str(tmp_path / "a.tsv"), "--n0", "100",
                 "--n", "100000", "--no-progress"]) == 0
    assert fake_run[-1]["engine"] == {"precision": "fp32", "channels_last": True,
                                      "compile": True, "compile_mode": "reduce-overhead"}
    # no --batch: measured, and bf16's time beside this long float32 run's (runs/tuning.py)
    assert fake_run[-1]["tune"] == Tuning(BATCHES, ("bf16",))
    assert fake_run[-1]["batch"] == dataset_run.DEFAULT_BATCH  # where none is measured
    (note,) = cuda_notes(caplog)
    assert "compile-mode reduce-overhead" in note
    assert "(--no-channels-last, --no-compile, --compile-mode default to change)" in note

    # a short run is not worth a compilation; its batch is still measured where it pays
    assert main(["certify", str(ckpt), "--out", str(tmp_path / "b.tsv"), *SHORT[:-3],
                 "--no-progress"]) == 0
    assert fake_run[-1]["engine"] == {"precision": "fp32", "channels_last": True,
                                      "compile": False, "compile_mode": "default"}
    assert fake_run[-1]["tune"] == Tuning(BATCHES, ())
    (note,) = cuda_notes(caplog)
    assert "compile off (--no-channels-last, --compile to change)" in note

    # each is switched off, or on, by its flag; predict and attack share them; a --batch
    # given is not measured, bf16's time still is
    assert main(["predict", str(ckpt), "--out", str(tmp_path / "c.tsv"), *LONG[2:],
                 "--no-channels-last", "--no-compile"]) == 0
    assert fake_run[-1]["engine"] == {"precision": "fp32", "channels_last": False,
                                      "compile": False, "compile_mode": "default"}
    assert fake_run[-1]["tune"] == Tuning((), ("bf16",)) and fake_run[-1]["batch"] == 50
    assert main(["attack", str(ckpt), "--epsilon", "0.5", "--out", str(tmp_path / "d.tsv"),
                 *SHORT[2:], "--compile", "--precision", "bf16"]) == 0
    assert fake_run[-1]["engine"] == {"precision": "bf16", "channels_last": True,
                                      "compile": True, "compile_mode": "reduce-overhead"}
    assert fake_run[-1]["tune"] is None  # its batch given, and bf16 already
    assert main(["certify", str(ckpt), "--out", str(tmp_path / "e.tsv"), *SHORT,
                 "--compile-mode", "max-autotune"]) == 0  # a mode that compiles compiles
    assert fake_run[-1]["engine"] == {"precision": "fp32", "channels_last": True,
                                      "compile": True, "compile_mode": "max-autotune"}


def test_the_cli_knows_the_engines_compile_modes():
    """The CLI spells them out (its --help imports no torch); the engine's are the truth."""
    from smoothcert.smoothing.engine import COMPILE_MODES

    assert dataset_run.COMPILE_MODES == COMPILE_MODES and dataset_run.GRAPHS_MODE in COMPILE_MODES


def test_no_compile_by_default_without_a_compiler(ckpt, tmp_path, fake_run, cuda, monkeypatch):
    monkeypatch.setattr(dataset_run, "compiler_available", lambda: False)
    assert main(["certify", str(ckpt), "--out", str(tmp_path / "a.tsv"), *LONG]) == 0
    assert fake_run[-1]["engine"]["compile"] is False


def test_ensembles_and_denoisers_are_not_compiled_by_default(ckpt, tmp_path, fake_run, cuda,
                                                            monkeypatch):
    monkeypatch.setattr(dataset_run, "_model", lambda args, device: "ensemble")
    assert main(["certify", str(ckpt), str(ckpt), "--out", str(tmp_path / "a.tsv"),
                 *LONG]) == 0
    assert fake_run[-1]["engine"] == {"precision": "fp32", "channels_last": True,
                                      "compile": False, "compile_mode": "default"}
    assert fake_run[-1]["tune"] is None  # its member evaluations would count the probe's
    assert main(["certify", str(ckpt), "--denoiser", str(ckpt), "--out",
                 str(tmp_path / "b.tsv"), *LONG]) == 0  # the run (faked) never loads it
    assert fake_run[-1]["engine"]["compile"] is False


def test_off_is_the_engines_default():
    from smoothcert.smoothing.engine import BatchedVotes

    assert BatchedVotes().settings() == dataset_run.OFF


def test_the_cpu_default_is_float32_eager(ckpt, tmp_path, fake_run, capsys):
    assert main(["certify", str(ckpt), "--out", str(tmp_path / "a.tsv"), *LONG,
                 "--device", "cpu"]) == 0
    assert fake_run[-1]["engine"] == {"precision": "fp32", "channels_last": False,
                                      "compile": False, "compile_mode": "default"}
    assert fake_run[-1]["tune"] is None  # the CPU keeps its batch
    assert capsys.readouterr().err == ""


def test_a_file_keeps_the_settings_it_was_made_with(ckpt, tmp_path, monkeypatch, capsys):
    """A file made on the CPU without flags (engine settings off: as every file before the CUDA
    defaults), and another made with --channels-last, resume with no flags at all; so does a new
    shard beside a sibling's file; a flag that contradicts the file is one line naming the
    flags that resume it."""
    plain, nhwc, shards = tmp_path / "plain.tsv", tmp_path / "nhwc.tsv", tmp_path / "s.tsv"
    cpu = [*SHORT, "--device", "cpu"]
    assert main(["certify", str(ckpt), "--out", str(plain), *cpu]) == 0
    assert main(["certify", str(ckpt), "--out", str(shards), *cpu, "--num-shards", "2",
                 "--shard-index", "0"]) == 0
    assert main(["certify", str(ckpt), "--out", str(nhwc), *cpu, "--channels-last"]) == 0
    assert read_records(nhwc).manifest["identity"]["engine"] == {"channels_last": True}
    more = [a if a != "4" else "6" for a in cpu]  # --max 6: two more examples
    assert main(["certify", str(ckpt), "--out", str(nhwc), *more]) == 0  # before: refused
    more = [a if a != "4" else "8" for a in cpu]
    assert main(["certify", str(ckpt), "--out", str(nhwc), *more, "--channels-last"]) == 0
    assert list(read_records(nhwc)["idx"]) == list(range(8))
    capsys.readouterr()

    # the same files, on a (faked) GPU, for a long run
    calls = []
    monkeypatch.setattr("smoothcert.runs.certify_dataset",
                        lambda model, data, **kw: calls.append(kw))
    import torch
    monkeypatch.setattr(dataset_run, "resolve_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr("smoothcert.training.distributed.rank_device", lambda device: device)
    monkeypatch.setattr(dataset_run, "compiler_available", lambda: True)
    off = {"precision": "fp32", "channels_last": False, "compile": False,
           "compile_mode": "default"}
    assert main(["certify", str(ckpt), "--out", str(plain), *LONG]) == 0
    assert calls[-1]["engine"] == off
    assert main(["certify", str(ckpt), "--out", str(shards), *LONG, "--num-shards", "2",
                 "--shard-index", "1"]) == 0  # made as its sibling, shard 0, was
    assert calls[-1]["engine"] == off

    assert main(["certify", str(ckpt), "--out", str(plain), *LONG, "--compile"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert str(plain) in line and "compile off" in line and "--no-compile" in line
    assert "--no-channels-last" in line and "--precision fp32" in line
    assert "to resume it" in line
    assert main(["certify", str(ckpt), "--out", str(shards), *LONG, "--num-shards", "2",
                 "--shard-index", "1", "--channels-last"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "s.shard0-of-2.tsv was made with" in line and "merges with it" in line
