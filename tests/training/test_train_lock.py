"""Step 13 items 5.2 and 5.9: one ``train`` at a time writes a run folder (a second is refused
with one line and writes nothing), and a fresh run that fails before its first checkpoint leaves
nothing behind, while a failed resumed run keeps the run as it was."""

from __future__ import annotations

import pytest

from smoothcert.cli.app import main
from smoothcert.errors import SmoothcertError
from smoothcert.io import FileLock
from smoothcert.training import TrainConfig, train
from smoothcert.training import trainer as trainer_module
from smoothcert.training.loop import LOCK

TRAIN = ["train", "--dataset", "digits", "--arch", "digits_cnn", "--method", "gaussian",
         "--sigma", "0.25", "--batch", "50", "--train-size", "100", "--no-progress",
         "--device", "cpu"]
CONFIG = TrainConfig(dataset="digits", arch="digits_cnn", sigma=0.25, epochs=1, batch_size=50,
                     train_size=100, seed=0)


def contents(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def one_error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines()
           if not line.startswith(("epoch=", "resuming"))]
    assert len(err) == 1, err
    return err[0]


# --------------------------------------------------------------------------- the lock
def test_a_second_train_into_a_folder_being_written_is_refused(tmp_path, capsys):
    """Before: both runs trained and log.tsv held epochs 1, 1, 2, 2."""
    run = tmp_path / "run"
    assert main([*TRAIN, "--epochs", "1", "--out", str(run)]) == 0
    before = contents(run)
    with FileLock(run / LOCK, "held by the first run"):  # the first run, still writing
        assert main([*TRAIN, "--epochs", "2", "--out", str(run), "--resume"]) == 2
        assert one_error(capsys) == (f"smoothcert train: error: another train is writing {run}; "
                                     "wait for it to end or choose another --out")
    assert contents(run) == before  # the refused run wrote nothing
    assert main([*TRAIN, "--epochs", "1", "--out", str(run), "--resume"]) == 0  # lock gone


def test_a_refused_fresh_run_does_not_create_or_remove_anything(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    with FileLock(run / LOCK, "held"):
        assert main([*TRAIN, "--epochs", "1", "--out", str(run)]) == 2
        assert "another train is writing" in one_error(capsys)
        assert [p.name for p in run.iterdir()] == [LOCK]  # the other run's lock alone


def test_the_lock_is_gone_after_a_run_and_after_a_failure(tmp_path, monkeypatch):
    config = TrainConfig.from_dict({**CONFIG.to_dict(), "epochs": 2})
    failing_epoch(monkeypatch, 2)
    with pytest.raises(SmoothcertError, match="bad input"):
        train(config, tmp_path, progress=False)
    assert not (tmp_path / LOCK).exists()
    monkeypatch.undo()
    train(config, tmp_path, progress=False, resume=True)
    assert not (tmp_path / LOCK).exists()
    FileLock(tmp_path / LOCK, "must be free").release()


# --------------------------------------------------------------------------- a failed start
def failing_epoch(monkeypatch, epoch: int = 1):
    """Training stops at ``epoch`` with a user error (bad input found late)."""
    real = trainer_module.Trainer.train_epoch

    def train_epoch(self, progress=False):
        if self.epoch + 1 == epoch:
            raise SmoothcertError(f"bad input found in epoch {epoch}")
        return real(self, progress)

    monkeypatch.setattr(trainer_module.Trainer, "train_epoch", train_epoch)


def test_a_fresh_run_that_fails_leaves_no_folder(tmp_path, capsys, monkeypatch):
    """Before: config.yaml stayed behind."""
    failing_epoch(monkeypatch)
    run = tmp_path / "a" / "run"
    assert main([*TRAIN, "--epochs", "1", "--out", str(run)]) == 2
    assert one_error(capsys) == "smoothcert train: error: bad input found in epoch 1"
    assert not run.exists() and (tmp_path / "a").exists()


def test_a_fresh_run_that_fails_in_an_existing_folder_removes_only_its_files(
        tmp_path, capsys, monkeypatch):
    failing_epoch(monkeypatch)
    (tmp_path / "notes.txt").write_text("mine\n")
    assert main([*TRAIN, "--epochs", "1", "--out", str(tmp_path)]) == 2
    assert contents(tmp_path) == {"notes.txt": b"mine\n"}


def test_bad_input_found_while_building_the_trainer_leaves_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    missing = tmp_path / "missing.pt"
    assert main([*TRAIN, "--epochs", "1", "--init-from", str(missing), "--out", str(run)]) == 2
    assert "does not exist" in one_error(capsys)
    assert not run.exists()


def test_a_failed_resumed_run_keeps_the_run(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    failing_epoch(monkeypatch, 2)
    assert main([*TRAIN, "--epochs", "2", "--out", str(run)]) == 2
    before = contents(run)
    assert sorted(before) == ["checkpoint.pt", "config.yaml", "log.tsv"]
    assert main([*TRAIN, "--epochs", "2", "--out", str(run), "--resume"]) == 2
    assert contents(run) == before
    capsys.readouterr()
    # without --resume the existing run is refused, and nothing of it is touched
    monkeypatch.undo()
    assert main([*TRAIN, "--epochs", "2", "--out", str(run)]) == 2
    assert "already exists" in one_error(capsys)
    assert contents(run) == before
    assert main([*TRAIN, "--epochs", "2", "--out", str(run), "--resume"]) == 0


def test_out_through_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main([*TRAIN, "--epochs", "1", "--out", str(tmp_path / "f")]) == 2
    assert "is a file" in one_error(capsys)
    assert main([*TRAIN, "--epochs", "1", "--out", str(tmp_path / "f" / "run")]) == 2
    assert "a file is in the way" in one_error(capsys)


# --------------------------------------------------------------------------- run folders
def test_init_from_a_run_folder_and_not_onto_itself(tmp_path, capsys):
    first = tmp_path / "first"
    assert main([*TRAIN, "--epochs", "1", "--out", str(first)]) == 0
    assert main([*TRAIN, "--epochs", "1", "--init-from", str(first),
                 "--out", str(tmp_path / "second")]) == 0  # the folder's checkpoint.pt
    capsys.readouterr()
    before = contents(first)
    assert main([*TRAIN, "--epochs", "1", "--init-from", str(first), "--out", str(first),
                 "--resume"]) == 2
    assert "would overwrite" in one_error(capsys)
    assert contents(first) == before


def test_a_resumed_run_drops_garbage_log_rows_and_refuses_a_binary_log(tmp_path, capsys,
                                                                     monkeypatch):
    run, args = tmp_path / "run", [*TRAIN, "--epochs", "3", "--out", str(tmp_path / "run")]
    failing_epoch(monkeypatch, 2)
    assert main(args) == 2
    monkeypatch.undo()
    log = (run / "log.tsv").read_text()
    width = len(log.splitlines()[0].split("\t"))
    (run / "log.tsv").write_text(log + "\t".join(["x"] * width) + "\n")
    failing_epoch(monkeypatch, 3)
    assert main([*args, "--resume"]) == 2
    monkeypatch.undo()
    epochs = [line.split("\t")[0] for line in (run / "log.tsv").read_text().splitlines()]
    assert epochs == ["epoch", "1", "2"]
    capsys.readouterr()
    (run / "log.tsv").write_bytes(b"\xff\xfe\x00garbage\n")
    assert main([*args, "--resume"]) == 2
    assert "is not a text TSV file" in one_error(capsys)
