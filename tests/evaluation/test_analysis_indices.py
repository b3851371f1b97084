"""``analyze grad-norms`` of a method whose loss looks examples up by their training-set index
(``needs_indices``: CAT-RS with its teacher's ŷ table): each measured example's loss gets its row
of the run's own training split (the ``--train-size`` subset), or, on a split the table does not
cover, a row of a table the method's hook builds over the measured examples."""

from __future__ import annotations

import json

import pytest
import torch

from smoothcert.cli.app import main
from smoothcert.data.datasets import balanced_subset, load_dataset
from smoothcert.methods import catrs as catrs_module
from smoothcert.methods.catrs import load_teacher, teacher_vote_table
from smoothcert.models.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from smoothcert.rng import derived_seed
from smoothcert.runs.records import manifest_path

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN_SIZE, DRAWS = 64, 8
COMMON = ["--dataset", "digits", "--arch", "digits_cnn", "--batch", "32", "--train-size",
          str(TRAIN_SIZE), "--epochs", "1", "--no-progress", "--device", "cpu"]
ANALYZE = ["--n", "10", "--format", "json", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def catrs_run(tmp_path_factory):
    """A Gaussian σ = 0.25 teacher and a CAT-RS run trained toward its ŷ table on a subset."""
    root = tmp_path_factory.mktemp("catrs")
    assert main(["train", *COMMON, "--method", "gaussian", "--sigma", "0.25",
                 "--out", str(root / "teacher")]) == 0
    teacher = root / "teacher" / "checkpoint.pt"
    assert main(["train", *COMMON, "--method", "catrs", "--sigma", "0.5",
                 "--param", f"teacher_checkpoint={teacher}", "--param", f"teacher_draws={DRAWS}",
                 "--param", "num_noise=2", "--param", "num_steps=1",
                 "--out", str(root / "catrs")]) == 0
    return teacher, root / "catrs" / "checkpoint.pt"


@pytest.fixture
def looked_up(monkeypatch):
    """Each call of CAT-RS's ŷ lookup: (the indices it got, the ŷ it returned)."""
    calls, real = [], catrs_module.CATRS.smoothed_prediction

    def spy(self, idx, like):
        target = real(self, idx, like)
        calls.append((idx.tolist(), target.clone()))
        return target

    monkeypatch.setattr(catrs_module.CATRS, "smoothed_prediction", spy)
    return calls


def test_grad_norms_of_teacher_catrs_use_the_runs_training_subset(
        catrs_run, tmp_path, capsys, looked_up, monkeypatch):
    """``--split train`` is the run's 64-image subset: the loss of the example at position k
    gets ``idx=[k]`` and ŷ = the checkpoint's table row k / N_T, and its input is image k of
    the subset; the manifest records the subset's size."""
    _, ckpt = catrs_run
    seen, real_loss = [], catrs_module.CATRS.loss
    monkeypatch.setattr(catrs_module.CATRS, "loss", lambda self, model, x, *a, **k: (
        seen.append(x.detach().clone()), real_loss(self, model, x, *a, **k))[1])
    out = tmp_path / "grad.tsv"
    code = main(["analyze", "grad-norms", str(ckpt), *ANALYZE, "--skip", "7", "--max", "4",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    positions = [0, 7, 14, 21]
    assert [int(line.split("\t")[0]) for line in out.read_text().splitlines()[1:]] == positions
    votes = load_checkpoint(ckpt).train_state["method"]["teacher_votes"]
    assert [idx for idx, _ in looked_up] == [[k] for k in positions]
    for k, (_, target) in zip(positions, looked_up, strict=True):
        torch.testing.assert_close(target, votes[[k]].float() / DRAWS, rtol=0, atol=0)
    data = load_dataset("digits", "train")
    subset = balanced_subset(data.labels, TRAIN_SIZE)
    images, _ = data.batch(subset[positions])
    assert torch.equal(torch.cat(seen), images)
    identity = json.loads(manifest_path(out).read_text())["identity"]
    assert identity["train_size"] == TRAIN_SIZE and identity["split"] == "train"


def test_on_the_test_split_the_hook_builds_the_teachers_votes_at_the_measured_images(
        catrs_run, capsys, looked_up):
    """Test images have no row in the run's table: the ŷ each loss gets is the teacher's votes
    at the measured images themselves (rows 0 … N−1 of a table built over them)."""
    teacher, ckpt = catrs_run
    code = main(["analyze", "grad-norms", str(ckpt), *ANALYZE, "--split", "test",
                 "--skip", "5", "--max", "3"])
    assert code == 0, capsys.readouterr().err
    test = load_dataset("digits", "test").subset(torch.tensor([0, 5, 10]))
    model, noise = load_teacher(str(teacher), 0.25, "digits", "cpu")
    seed = derived_seed(0, catrs_module._TABLE_STREAM)  # the analysis has no run config: seed 0
    table = teacher_vote_table(model, test, noise, DRAWS, seed)
    assert [idx for idx, _ in looked_up] == [[0], [1], [2]]
    for k, (_, target) in enumerate(looked_up):
        torch.testing.assert_close(target, table[[k]].float() / DRAWS, rtol=0, atol=0)


def test_a_table_of_another_subset_is_refused_in_one_line(catrs_run, tmp_path, capsys):
    """A checkpoint whose config lost its train_size: the saved table (64 rows) does not fit the
    whole training split, and the analysis says so instead of looking up wrong rows."""
    _, ckpt = catrs_run
    saved, (model, meta) = load_checkpoint(ckpt), model_from_checkpoint(ckpt)
    meta = {**meta, "config": {**meta["config"], "train_size": None}}
    edited = save_checkpoint(tmp_path / "edited.pt", model, meta, saved.train_state)
    assert main(["analyze", "grad-norms", str(edited), *ANALYZE, "--max", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"ŷ table has {TRAIN_SIZE} rows" in err
