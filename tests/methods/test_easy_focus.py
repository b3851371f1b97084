"""easy_focus (Sun et al.): discarding on a toy dataset with known p, the reweighing formula, the
sampling order, the attack on the noise sphere, and an exact resume after discarding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import beta, norm
from torch import nn

from conftest import Halfspace
from smoothcert import Gaussian, SmoothcertError
from smoothcert.data.datasets import ImageDataset, load_dataset
from smoothcert.data.registry import DatasetSpec
from smoothcert.methods import EpochContext, build_method
from smoothcert.methods import easy_focus as ef
from smoothcert.models.checkpoint import load_checkpoint
from smoothcert.training import TrainConfig, Trainer, train
from smoothcert.training import loop as train_module

SIGMA = 0.1
# Toy 1×1×4 images whose first pixel alone decides the class of Halfspace(e₀, b=0.5):
# P(class 1 | x) = Φ((x₀ − 0.5)/σ). (first pixel uint8, label) → P(correct):
GROUPS = [(255, 1), (160, 1), (95, 1), (0, 1), (255, 0)]
P_CORRECT = [norm.cdf((v / 255 - 0.5) / SIGMA) if y else norm.cdf(-(v / 255 - 0.5) / SIGMA)
             for v, y in GROUPS]  # ≈ 1, 0.898, 0.102, 0, 0
PER_GROUP = 10


def toy_data() -> ImageDataset:
    spec = DatasetSpec("toy", 2, (1, 1, 4), (0.5,), (0.5,), "none", loader=None)
    images = torch.zeros(len(GROUPS) * PER_GROUP, 1, 1, 4, dtype=torch.uint8)
    images[:, 0, 0, 0] = torch.tensor([v for v, _ in GROUPS]).repeat_interleave(PER_GROUP)
    labels = torch.tensor([y for _, y in GROUPS]).repeat_interleave(PER_GROUP)
    return ImageDataset(spec, "train", images, labels, 1 / 255)


def halfspace() -> nn.Module:
    return Halfspace([1.0, 0.0, 0.0, 0.0], b=0.5)


def ctx(model, data, num_epochs: int = 100, seed: int = 0) -> EpochContext:
    return EpochContext(num_epochs, model, data, Gaussian(SIGMA),
                        generator=torch.Generator().manual_seed(seed), device=torch.device("cpu"))


def test_discard_keeps_exactly_the_examples_with_p_at_least_the_threshold():
    data = toy_data()
    method = build_method("easy_focus", discard_epoch=3, discard_threshold=0.5, reweigh=False)
    method.on_epoch_start(2, ctx(halfspace(), data))
    assert method.kept is None  # not yet
    method.on_epoch_start(3, ctx(halfspace(), data))
    expected = [i for i in range(len(data)) if P_CORRECT[i // PER_GROUP] >= 0.5]
    assert method.kept.tolist() == expected  # groups p≈1 and p≈0.898; p≈0.102 and 0 dropped
    out = method.loss(halfspace(), *data.batch(torch.arange(4)), Gaussian(SIGMA),
                      torch.Generator().manual_seed(0))
    assert out["kept_fraction"].item() == pytest.approx(0.4)


def test_correct_counts_estimate_the_known_probabilities():
    data = toy_data()
    counts = ef.noisy_correct_counts(halfspace(), data, torch.arange(len(data)), Gaussian(SIGMA),
                                     100, torch.Generator().manual_seed(1), rows=300)
    p_hat = counts.view(len(GROUPS), PER_GROUP).double().mean(dim=1) / 100
    # 1,000 draws per group: the binomial standard error is at most 0.016; allow 4 of them.
    np.testing.assert_allclose(p_hat.numpy(), P_CORRECT, atol=0.064)


def test_reweigh_weights_equal_the_formula_computed_with_scipy():
    counts = np.arange(17)
    k = np.maximum(counts, 12)  # ⌊clip(c/16, 0.75, 1)·16⌋
    lower = np.where(k == 16, 0.1 ** (1 / 16), beta.ppf(0.1, k, 16 - k + 1))
    np.testing.assert_allclose(ef.reweigh_weights(counts, 16), norm.ppf(lower), rtol=1e-12)
    assert (ef.reweigh_weights(counts, 16) > 0).all()  # valid sampling weights


def fake_counts(monkeypatch, discard_counts, reweigh_counts):
    """Make the method's p̂ estimates return known counts (100 draws: discard; 16: reweigh)."""
    calls = []

    def counts(model, data, indices, noise, num_draws, generator, rows=ef.EVAL_ROWS):
        calls.append(num_draws)
        table = discard_counts if num_draws == ef.DISCARD_DRAWS else reweigh_counts
        return torch.as_tensor(table)[indices]

    monkeypatch.setattr(ef, "noisy_correct_counts", counts)
    return calls


def test_discard_then_reweigh_use_the_kept_set_and_the_formula(monkeypatch):
    data = toy_data()  # 50 examples; only the counts below matter
    discard = np.tile([40, 39, 100, 0, 55], 10)  # p_t = 0.4: 40/100 is kept (p̂ ≥ p_t)
    reweigh = np.arange(50) % 17
    fake_counts(monkeypatch, discard, reweigh)
    method = build_method("easy_focus", discard_epoch=0, discard_threshold=0.4)
    method.on_epoch_start(0, ctx(halfspace(), data))
    kept = np.flatnonzero(discard >= 40)
    assert method.kept.tolist() == kept.tolist()
    k = np.maximum(reweigh[kept], 12)
    expected = norm.ppf(np.where(k == 16, 0.1 ** (1 / 16), beta.ppf(0.1, k, 17 - k)))
    np.testing.assert_allclose(method.weights.numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize(
    "hparams, discards, reweighs",
    [
        ({"discard_epoch": 2}, [2], [2, 12, 22]),
        ({"discard_epoch": 2, "discard": False}, [], [0, 10, 20]),  # start epoch 0
        ({"discard_epoch": 2, "reweigh": False}, [2], []),
    ],
)
def test_schedule_of_discard_and_reweigh(monkeypatch, hparams, discards, reweighs):
    calls = fake_counts(monkeypatch, np.full(50, 100), np.full(50, 16))
    method, data, seen = build_method("easy_focus", **hparams), toy_data(), {}
    for epoch in range(25):
        before = len(calls)
        method.on_epoch_start(epoch, ctx(halfspace(), data))
        seen[epoch] = calls[before:]
        assert method._attack_active == (epoch >= method.start_epoch)
    assert [e for e, c in seen.items() if ef.DISCARD_DRAWS in c] == discards
    assert [e for e, c in seen.items() if ef.REWEIGH_DRAWS in c] == reweighs


def test_epoch_order_keeps_the_epoch_length_and_follows_the_weights(monkeypatch):
    data = toy_data()
    discard = np.where(np.arange(50) < 20, 100, 0)  # keep the first 20
    reweigh = np.where(np.arange(50) < 10, 16, 12)  # weights ≈ 1.108 vs ≈ 0.154
    fake_counts(monkeypatch, discard, reweigh)
    method = build_method("easy_focus", discard_epoch=1)
    method.on_epoch_start(0, ctx(halfspace(), data))
    gen = torch.Generator().manual_seed(0)
    assert method.epoch_indices(0, 50, gen) is None  # before E_t: the trainer's shuffle
    method.on_epoch_start(1, ctx(halfspace(), data))
    orders = [method.epoch_indices(1, 50, gen) for _ in range(400)]
    assert all(len(o) == 50 and o.dtype == torch.int64 for o in orders)  # epoch length kept
    freq = torch.bincount(torch.cat(orders), minlength=50).double() / (400 * 50)
    assert freq[20:].sum() == 0  # discarded examples never come back
    w = method.weights.numpy()
    expected = w / w.sum()  # 20,000 draws: each group's share within 0.01 (σ ≈ 0.0015)
    assert freq[:10].sum().item() == pytest.approx(expected[:10].sum(), abs=0.01)


def test_discard_only_samples_the_kept_set_uniformly_with_replacement(monkeypatch):
    fake_counts(monkeypatch, np.where(np.arange(50) % 2 == 0, 100, 0), np.full(50, 16))
    method = build_method("easy_focus", discard_epoch=0, reweigh=False)
    method.on_epoch_start(0, ctx(halfspace(), toy_data()))
    gen = torch.Generator().manual_seed(0)
    order = torch.cat([method.epoch_indices(0, 50, gen) for _ in range(400)])
    freq = torch.bincount(order, minlength=50).double() / len(order)
    assert freq[1::2].sum() == 0
    assert freq[::2].min() > 0.03 and freq[::2].max() < 0.05  # 1/25 = 0.04 each
    attack_only = build_method("easy_focus", discard=False, reweigh=False)
    assert attack_only.epoch_indices(5, 50, gen) is None


def test_everything_discarded_is_a_clear_error():
    method = build_method("easy_focus", discard_epoch=0, discard_threshold=1.0)
    data = toy_data()
    data = ImageDataset(data.spec, "train", data.images[20:40], data.labels[20:40], data.scale)
    with pytest.raises(SmoothcertError, match="discarded every training example.*lower"):
        method.on_epoch_start(0, ctx(halfspace(), data))


# --------------------------------------------------------------------------- sphere attack
def sphere_case():
    """Label-1 inputs at distances −0.3 … 0.3 from the boundary x₀ = 0.5 of a linear classifier;
    noise of radius ≈ 0.4 (σ = 0.1 in 16 dimensions)."""
    w = torch.zeros(16)
    w[0] = 1.0
    x = torch.full((7, 1, 1, 16), 0.5)
    x[:, 0, 0, 0] += torch.tensor([-0.3, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3])
    noise = Gaussian(SIGMA).sample(x, torch.Generator().manual_seed(3))
    return Halfspace(w, b=0.5), x, torch.ones(7, dtype=torch.long), noise


def test_sphere_attack_keeps_each_noise_norm():
    model, x, y, noise = sphere_case()
    out = ef.sphere_attack(model, x, y, noise, steps=6, step_size=0.25)
    torch.testing.assert_close(out.flatten(1).norm(dim=1), noise.flatten(1).norm(dim=1),
                               rtol=1e-5, atol=0)
    assert not torch.equal(out, noise)


def test_sphere_attack_stops_at_the_first_misclassified_noise():
    model, x, y, noise = sphere_case()
    runs = [ef.sphere_attack(model, x, y, noise, steps=t, step_size=0.1) for t in range(9)]
    wrong = torch.stack([model(x + r).argmax(dim=1) != y for r in runs])  # (steps, rows)
    first = [int(col.nonzero()[0]) if col.any() else None for col in wrong.T]
    assert first[0] == 0  # misclassified from the start: returned unchanged
    assert torch.equal(runs[8][0], noise[0])
    assert any(f is not None and f >= 2 for f in first)  # some rows need several steps
    for row, t_star in enumerate(first):
        if t_star is None:
            continue
        for t in range(t_star, 9):  # once misclassified, further steps change nothing
            assert torch.equal(runs[t][row], runs[t_star][row])
        assert wrong[t_star:, row].all()


def test_loss_with_the_attack_is_cross_entropy_on_the_attacked_noise():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))
    _, x, y, _ = sphere_case()
    method = build_method("easy_focus", discard=False, reweigh=False, num_noise=2,
                          attack_steps=2, attack_step_size=0.2)
    method.on_epoch_start(0, EpochContext(10, model, None, Gaussian(SIGMA)))  # attack from 0
    out = method.loss(model, x, y, Gaussian(SIGMA), torch.Generator().manual_seed(4))
    x_rep, y_rep = x.repeat(2, 1, 1, 1), y.repeat(2)
    delta = Gaussian(SIGMA).sample(x_rep, torch.Generator().manual_seed(4))
    attacked = ef.sphere_attack(model.eval(), x_rep, y_rep, delta, 2, 0.2)
    expected = F.cross_entropy(model.train()(x_rep + attacked), y_rep)
    torch.testing.assert_close(out["loss"], expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "hparams, match",
    [
        ({"discard": "yes"}, "discard must be true or false"),
        ({"discard_threshold": 1.5}, "discard_threshold"),
        ({"attack_steps": 0}, "attack_steps"),
        ({"attack_step_size": 0.0}, "attack_step_size"),
        ({"discard_epoch": -1}, "discard_epoch"),
    ],
)
def test_bad_hparams_raise(hparams, match):
    with pytest.raises(SmoothcertError, match=match):
        build_method("easy_focus", **hparams)


# --------------------------------------------------------------------------- with the trainer
CONFIG = TrainConfig(
    dataset="digits", arch="digits_cnn", sigma=0.25, epochs=3, batch_size=64, lr=0.05, seed=2,
    method="easy_focus",
    method_params={"discard_epoch": 1, "num_noise": 2, "attack_steps": 1},
)


@pytest.fixture
def fewer_draws(monkeypatch):
    """10 instead of 100 draws per example at the discard: the same code path, 10× less CPU."""
    monkeypatch.setattr(ef, "DISCARD_DRAWS", 10)


def test_trainer_epochs_after_discarding_keep_their_length_and_skip_the_dropped(fewer_draws):
    trainer = Trainer(CONFIG)
    trainer.train_epoch()
    trainer.method.on_epoch_start(1, trainer._context())
    kept = set(trainer.method.kept.tolist())
    assert 0 < len(kept) < len(trainer.train_data)
    order = torch.cat(trainer._batches())
    assert len(order) == len(trainer.train_data)
    assert set(order.tolist()) <= kept


def test_resume_after_discarding_equals_uninterrupted(tmp_path, monkeypatch, fewer_draws):
    straight = train(CONFIG, tmp_path / "straight", progress=False)
    real_save = train_module._save

    def save_then_die(path, trainer):
        real_save(path, trainer)
        if trainer.epoch == 2:  # after the discard and the first weights (epoch index 1)
            raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "_save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(CONFIG, tmp_path / "resumed", progress=False)
    monkeypatch.setattr(train_module, "_save", real_save)
    resumed = train(CONFIG, tmp_path / "resumed", progress=False, resume=True)
    a, b = load_checkpoint(straight), load_checkpoint(resumed)
    assert torch.equal(a.train_state["method"]["kept"], b.train_state["method"]["kept"])
    assert torch.equal(a.train_state["method"]["weights"], b.train_state["method"]["weights"])
    for key, value in a.state_dict.items():
        torch.testing.assert_close(b.state_dict[key], value, rtol=0, atol=1e-6)
    header, *rows = (tmp_path / "resumed" / "log.tsv").read_text().splitlines()
    kept_fraction = [float(r.split("\t")[header.split("\t").index("kept_fraction")]) for r in rows]
    n = len(load_dataset("digits", "train"))
    assert kept_fraction == pytest.approx([1.0] + [len(a.train_state["method"]["kept"]) / n] * 2)
