"""CAT-RS's ŷ as the paper has it: the vote table of a Gaussian-trained teacher, built once per
run on the un-augmented training images (closed form of a linear teacher, determinism), looked
up by the batch's indices, kept through a resume; the default's refusal without a teacher and
the ``target=self`` variant's records; ε doubling against the authors' loop."""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn

from smoothcert import Gaussian, SmoothcertError
from smoothcert.cli.app import main
from smoothcert.data.transforms import augment
from smoothcert.methods import EpochContext, build_method
from smoothcert.methods import catrs as catrs_module
from smoothcert.methods.catrs import catrs_loss, load_teacher, teacher_vote_table
from smoothcert.models.checkpoint import load_checkpoint, save_checkpoint
from smoothcert.rng import derived_seed, example_generator
from smoothcert.smoothing.attacks import draw_noises
from smoothcert.smoothing.smoothed import Smoothed
from smoothcert.training import TrainConfig, Trainer
from smoothcert.training import loop as loop_module

F64 = torch.float64
C, SHAPE = 10, (1, 8, 8)


# --------------------------------------------------------------------------- a closed-form teacher
class HalfSpace(nn.Module):
    """Votes 1 where w·x > t and 0 elsewhere (the other classes never): under δ ~ N(0, σ²I),
    P(vote 1 at x) = Φ((w·x − t)/(σ‖w‖)) (Cohen et al.'s linear example)."""

    def __init__(self, w: torch.Tensor, t: float):
        super().__init__()
        self.w, self.t = nn.Parameter(w.flatten()), t

    def forward(self, x):
        margin = x.flatten(1) @ self.w - self.t
        others = torch.full((len(x), C - 2), -1e9, dtype=x.dtype)
        return torch.cat([torch.zeros_like(margin)[:, None], margin[:, None], others], dim=1)


@dataclass
class Images:
    """A training split in the shape the table reads: ``spec.num_classes``, ``len``, ``batch``."""

    x: torch.Tensor

    spec = SimpleNamespace(num_classes=C)

    def __len__(self):
        return len(self.x)

    def batch(self, idx):
        return self.x[idx], torch.zeros(len(idx), dtype=torch.long)


def halfspace_and_images(n: int = 12):
    """A half-space teacher and n images whose P(vote 1) spreads over (0.02, 0.98)."""
    w = torch.zeros(SHAPE, dtype=F64)
    w[0, 0, 0], w[0, 7, 7] = 1.0, -1.0  # ‖w‖ = √2
    x = torch.full((n, *SHAPE), 0.5, dtype=F64)
    x[:, 0, 7, 7] += torch.linspace(-0.4, 0.4, n, dtype=F64)  # w·x = 0.5 − x₆₃
    return HalfSpace(w, t=0.0).double(), Images(x)


def test_the_table_holds_the_teachers_vote_counts_in_closed_form():
    """Each row counts N_T votes; class 1's frequency is within 5 standard errors of
    Φ((w·x − t)/(σ‖w‖)), the others' are exactly 0 (fixed seeds: the test is deterministic)."""
    teacher, images = halfspace_and_images()
    sigma, draws = 0.12, 4000
    table = teacher_vote_table(teacher, images, Gaussian(sigma), draws, seed=7, batch_size=500)
    assert table.dtype == torch.int16 and table.shape == (12, C)
    assert (table.sum(dim=1) == draws).all() and (table[:, 2:] == 0).all()
    with torch.no_grad():
        margin = (images.x.flatten(1) @ teacher.w - teacher.t) / (sigma * teacher.w.norm())
    p = torch.from_numpy(norm.cdf(margin.numpy()))
    freq = table[:, 1].double() / draws
    assert (p.min() < 0.05) and (p.max() > 0.95)  # the images span the range
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / draws).sqrt() + 1e-9).all()


def test_the_table_is_deterministic_and_independent_of_batching():
    """Image i's votes come from its own generator (seed, i): any batch size, or counting image i
    alone with Smoothed, gives the same counts."""
    teacher, images = halfspace_and_images(9)
    noise = Gaussian(1.0)
    a = teacher_vote_table(teacher, images, noise, 300, seed=3, batch_size=1000)
    b = teacher_vote_table(teacher, images, noise, 300, seed=3, batch_size=7)
    assert torch.equal(a, b)
    smoothed = Smoothed(teacher, noise, C)
    for i in (0, 4, 8):
        (done,) = smoothed.run([(i, smoothed.votes_program(images.x[i], 300,
                                                            example_generator(3, i)))], 64)
        assert torch.equal(a[i], torch.from_numpy(done.result).to(torch.int16))
    assert not torch.equal(a, teacher_vote_table(teacher, images, noise, 300, seed=4))


# --------------------------------------------------------------------------- the method
def teacher_method(**more):
    return build_method("catrs", num_noise=3, num_steps=1, teacher_checkpoint="unused.pt",
                        teacher_draws=8, **more)


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, C)).double()


def test_the_loss_reads_the_table_rows_of_the_batch_indices():
    """ŷ of the batch = table[idx] / N_T (as the authors' dataset returns its row of the
    ``model_conf`` file with each image); the draws: the m noises, then the B×m uniforms."""
    gen = torch.Generator().manual_seed(0)
    table = torch.multinomial(torch.ones(C), 8 * 20, replacement=True, generator=gen)
    table = torch.nn.functional.one_hot(table, C).view(20, 8, C).sum(dim=1).to(torch.int16)
    method = teacher_method()
    method.load_state_dict({"teacher_votes": table})
    method.on_epoch_start(0, EpochContext(1, tiny_model(), Images(torch.zeros(20, *SHAPE)),
                                          Gaussian(0.5)))
    model = tiny_model()
    x, y = torch.rand(4, *SHAPE, dtype=F64, generator=gen), torch.tensor([1, 2, 3, 4])
    idx = torch.tensor([17, 3, 3, 0])
    out = method.loss(model, x, y, Gaussian(0.5), torch.Generator().manual_seed(1), idx=idx)
    replay = torch.Generator().manual_seed(1)
    noises = draw_noises(Gaussian(0.5), x, 3, replay)
    u = torch.rand((4, 3), generator=replay, dtype=F64)
    expected = catrs_loss(model, x, y, noises, u, target=table[idx].double() / 8, epsilon=1.0,
                          num_steps=1, lbd=1.0)
    torch.testing.assert_close(out["loss"], expected["loss"], rtol=0, atol=0)
    with pytest.raises(SmoothcertError, match="needs the batch's training-set indices"):
        method.loss(model, x, y, Gaussian(0.5), torch.Generator().manual_seed(1))


def test_without_a_table_or_with_a_table_of_another_split_the_method_says_so():
    method = teacher_method()
    x, y = torch.rand(2, *SHAPE, dtype=F64), torch.tensor([0, 1])
    with pytest.raises(SmoothcertError, match="no ŷ table yet: call on_epoch_start"):
        method.loss(tiny_model(), x, y, Gaussian(0.5), torch.Generator(), idx=torch.arange(2))
    method.load_state_dict({"teacher_votes": torch.zeros(5, C, dtype=torch.int16)})
    with pytest.raises(SmoothcertError, match="table has 5 rows but the training split has 6"):
        method.on_epoch_start(0, EpochContext(1, tiny_model(), Images(torch.zeros(6, *SHAPE)),
                                              Gaussian(0.5)))
    with pytest.raises(SmoothcertError, match="not an \\(N, C\\) tensor of vote counts"):
        method.load_state_dict({"teacher_votes": torch.zeros(5, C)})


def test_the_default_without_a_teacher_says_how_to_get_one(tmp_path, capsys):
    """The paper's target is the default: with no teacher_checkpoint, one line naming the
    gaussian teacher recipe and the target=self variant, exit 2, nothing trained."""
    assert main(["train", "--method", "catrs", "--dataset", "digits", "--arch", "digits_cnn",
                 "--sigma", "0.25", "--epochs", "1", "--out", str(tmp_path / "r"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "gaussian" in err and "gaussian_teacher_s025.yaml" in err and "target=self" in err
    assert not (tmp_path / "r" / "checkpoint.pt").exists()


# --------------------------------------------------------------------------- a run, with resume
SMALL = ["--method", "catrs", "--dataset", "digits", "--arch", "digits_cnn", "--sigma", "0.25",
         "--batch", "64", "--train-size", "128", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher") / "gaussian"
    assert main(["train", *SMALL, "--method", "gaussian", "--epochs", "1",
                 "--out", str(out)]) == 0
    return out / "checkpoint.pt"


def test_a_teacher_of_another_sigma_or_no_file_is_refused(teacher, tmp_path):
    with pytest.raises(SmoothcertError, match="trained at σ = 0.25, not at teacher_sigma = 0.5"):
        load_teacher(str(teacher), 0.5, "digits", "cpu")
    with pytest.raises(SmoothcertError, match="trained on digits, but this run trains on mnist"):
        load_teacher(str(teacher), 0.25, "mnist", "cpu")
    with pytest.raises(SmoothcertError, match="does not exist; train the teacher with the "
                       "gaussian method"):
        load_teacher(str(tmp_path / "missing.pt"), 0.25, "digits", "cpu")


def test_the_table_is_built_once_and_a_resume_reads_it_from_the_checkpoint(
        teacher, tmp_path, monkeypatch):
    """Two epochs with ε doubled from epoch 1; a run killed after saving epoch 1 resumes, with
    the teacher file gone, to the straight run's weights: the table (int16 counts, one row per
    training image, each summing to N_T) came back from the checkpoint, built once per run."""
    copy = tmp_path / "teacher.pt"
    copy.write_bytes(teacher.read_bytes())
    params = ["--param", f"teacher_checkpoint={copy}", "--param", "teacher_draws=50",
              "--param", "double_epsilon_epoch=1", "--param", "num_steps=2", "--epochs", "2"]
    builds = []
    real_table = catrs_module.teacher_vote_table

    def counted(*args, **kwargs):
        builds.append(1)
        return real_table(*args, **kwargs)

    monkeypatch.setattr(catrs_module, "teacher_vote_table", counted)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(["train", *SMALL, *params, "--out", str(straight)]) == 0
    assert len(builds) == 1  # two epochs, one table
    real_save = loop_module._save

    def save_then_die(path, trainer):
        real_save(path, trainer)
        if trainer.epoch == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(loop_module, "_save", save_then_die)
    assert main(["train", *SMALL, *params, "--out", str(resumed)]) == 130
    monkeypatch.setattr(loop_module, "_save", real_save)
    copy.unlink()
    assert main(["train", *SMALL, *params, "--out", str(resumed), "--resume"]) == 0
    assert len(builds) == 2  # the interrupted run's; the resumed run built none
    a, b = load_checkpoint(straight / "checkpoint.pt"), load_checkpoint(resumed / "checkpoint.pt")
    assert b.meta["epoch"] == 2 and "variant" not in b.meta["method"]
    for key, value in a.state_dict.items():
        torch.testing.assert_close(b.state_dict[key], value, rtol=0, atol=1e-6)
    votes = b.train_state["method"]["teacher_votes"]
    assert votes.dtype == torch.int16 and votes.shape == (128, 10)
    assert (votes.sum(dim=1) == 50).all()
    assert torch.equal(votes, a.train_state["method"]["teacher_votes"])
    rows = [line.split("\t") for line in (resumed / "log.tsv").read_text().splitlines()]
    assert [float(v) for v in dict(zip(rows[0], zip(*rows[1:])))["epsilon"]] == [1.0, 2.0]


def test_the_self_variant_says_so_in_the_checkpoint(tmp_path):
    out = tmp_path / "run"
    assert main(["train", *SMALL, "--epochs", "1", "--param", "target=self", "--param",
                 "num_steps=1", "--out", str(out)]) == 0
    meta = load_checkpoint(out / "checkpoint.pt").meta
    assert meta["method"]["variant"] == "target=self"
    assert meta["method"]["hparams"]["target"] == "self"
    assert meta["config"]["method_params"]["target"] == "self"


# --------------------------------------------------------------------------- ε doubling
def authors_epsilons(epsilon: float, warmup: int, epochs: int, start: int = 0) -> list[float]:
    """The attack radius of each epoch in the authors' loop (train_catrs.py main(), d4bc576):
    ``attacker = KL_PGD(max_norm=args.epsilon)`` before the loop; at the top of each epoch ``if
    epoch >= args.warmup: attacker = KL_PGD(max_norm=args.epsilon*2.0)``. A run resumed at
    ``start`` rebuilds the attacker at ε first."""
    radius, radii = epsilon, []
    for epoch in range(start, epochs):
        if epoch >= warmup:
            radius = epsilon * 2.0
        radii.append(radius)
    return radii


@pytest.mark.parametrize("epsilon, warmup, epochs", [(1.0, 80, 90), (0.5, 0, 3), (1.0, 10_000, 5)])
def test_epsilon_doubling_is_the_authors_schedule(epsilon, warmup, epochs):
    """Their ImageNet command (--eps 256 --warmup 80, 90 epochs), doubling from the start, and
    their default --warmup 10000 (never), fresh and resumed at every epoch."""
    double = None if warmup == 10_000 else warmup
    method = build_method("catrs", epsilon=epsilon, double_epsilon_epoch=double, target="self")
    ours = []
    for epoch in range(epochs):
        method.on_epoch_start(epoch, EpochContext(epochs, None, None, Gaussian(0.25)))
        ours.append(method.current_epsilon)
    assert ours == authors_epsilons(epsilon, warmup, epochs)
    for start in range(epochs):
        resumed = build_method("catrs", epsilon=epsilon, double_epsilon_epoch=double,
                               target="self")
        resumed.on_epoch_start(start, EpochContext(epochs, None, None, Gaussian(0.25)))
        assert resumed.current_epsilon == authors_epsilons(epsilon, warmup, epochs, start)[0]
    assert math.isclose(max(ours), 2 * epsilon if double is not None else epsilon)


# --------------------------------------------------------------------------- un-augmented images
def write_tiny_cifar(folder, per_batch: int = 3) -> None:
    """CIFAR-10's python-pickle layout with ``per_batch`` random images per file."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"batch_label": name.encode(), b"labels": rng.integers(0, 10, per_batch).tolist(),
                 b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))


def test_the_trainer_builds_the_table_on_the_un_augmented_images(tmp_path):
    """CIFAR-10 trains on random crops and flips; the table is the teacher's votes at the images
    themselves (:func:`teacher_vote_table` of the stored split), seeded from the run seed."""
    write_tiny_cifar(tmp_path / "cifar-10-batches-py")
    common = dict(dataset="cifar10", data_root=str(tmp_path), arch="digits_cnn", epochs=1,
                  batch_size=5, seed=4)
    gaussian = Trainer(TrainConfig(**common, method="gaussian", sigma=0.25))
    path = save_checkpoint(tmp_path / "teacher.pt", gaussian.model, gaussian.meta())
    run = Trainer(TrainConfig(**common, method="catrs", sigma=0.5, method_params={
        "teacher_checkpoint": str(path), "teacher_draws": 30, "num_noise": 2, "num_steps": 1}))
    assert run.train_data.spec.augmentation != "none"
    run.train_epoch()
    teacher, noise = load_teacher(str(path), 0.25, "cifar10", "cpu")
    expected = teacher_vote_table(teacher, run.train_data, noise, 30,
                                  derived_seed(4, catrs_module._TABLE_STREAM), batch_size=4)
    assert torch.equal(run.method.teacher_votes, expected)
    assert (expected.sum(dim=1) == 30).all() and len(expected) == 15
    cropped = Images(augment(run.train_data.spec.augmentation, run.train_data.batch(
        torch.arange(15))[0], torch.Generator().manual_seed(0)))
    cropped.spec = run.train_data.spec
    assert not torch.equal(expected, teacher_vote_table(  # the test can tell them apart
        teacher, cropped, noise, 30, derived_seed(4, catrs_module._TABLE_STREAM)))
