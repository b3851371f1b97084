"""SmoothAdv: the loss against a manual computation with identically seeded generators, the
multi-noise switch, the ε warm-up, eval/train modes, and the consistency composition."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from smoothcert import Gaussian, SmoothcertError
from smoothcert.methods import build_method
from smoothcert.smoothing.attacks import ATTACKS, draw_noises

B, SHAPE, K = 6, (1, 4, 4), 4
D = 16


def linear_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(D, K))


def batch():
    gen = torch.Generator().manual_seed(1)
    return torch.rand((B,) + SHAPE, generator=gen), torch.randint(0, K, (B,), generator=gen)


def manual(model, x, y, *, attack="pgd", m=3, eps=0.5, steps=4, sigma=0.25, seed=7):
    """The attack and noisy adversarial logits computed by hand from the same seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    noises = draw_noises(Gaussian(sigma), x, m, gen)
    adv = ATTACKS[attack](num_steps=steps).attack(model, x, y, noises, epsilon=eps, generator=gen)
    logits = [model(adv.adversarial + n) for n in noises]
    return adv, logits


def run(method, model, x, y, sigma=0.25, seed=7):
    return method.loss(model, x, y, Gaussian(sigma), torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_multi_noise_trains_on_all_copies_of_the_adversarial_input(attack):
    model, (x, y) = linear_model(), batch()
    method = build_method("smoothadv", attack=attack, epsilon=0.5, num_steps=4, num_noise=3,
                          warmup_epochs=0)
    out = run(method, model, x, y)
    adv, logits = manual(model, x, y, attack=attack)
    expected = torch.stack([F.cross_entropy(z, y) for z in logits]).mean()
    torch.testing.assert_close(out["loss"], expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out["logits"], logits[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out["adv_distance"], adv.distance.mean())
    assert set(out) == {"loss", "logits", "ce", "epsilon", "adv_distance"}
    assert out["epsilon"].item() == pytest.approx(0.5)


def test_single_noise_training_uses_the_first_copy_only():
    model, (x, y) = linear_model(), batch()
    hparams = dict(epsilon=0.5, num_steps=4, num_noise=3, warmup_epochs=0)
    single = run(build_method("smoothadv", multi_noise=False, **hparams), model, x, y)
    multi = run(build_method("smoothadv", multi_noise=True, **hparams), model, x, y)
    _, logits = manual(model, x, y)
    torch.testing.assert_close(single["loss"], F.cross_entropy(logits[0], y), rtol=0, atol=0)
    torch.testing.assert_close(single["logits"], logits[0], rtol=0, atol=0)
    assert not torch.allclose(single["loss"], multi["loss"])


def test_the_attack_moves_the_input_and_raises_the_loss_over_gaussian_training():
    model, (x, y) = linear_model(), batch()
    adv = run(build_method("smoothadv", epsilon=0.5, num_noise=2, warmup_epochs=0), model, x, y)
    clean = run(build_method("smoothadv", epsilon=0.0, num_noise=2), model, x, y)
    assert clean["adv_distance"] == 0
    assert adv["adv_distance"] == pytest.approx(0.5, rel=1e-5)  # PGD ends on the sphere here
    assert adv["loss"] > clean["loss"]


def test_attack_runs_in_eval_mode_and_the_training_forward_in_train_mode():
    class Recorder(nn.Module):
        def __init__(self):
            super().__init__()
            self.net, self.modes = linear_model(), []

        def forward(self, x):
            self.modes.append((self.training, x.shape[0]))
            return self.net(x)

    model, (x, y) = Recorder().train(), batch()
    run(build_method("smoothadv", num_steps=3, num_noise=2), model, x, y)
    assert model.modes == [(False, 2 * B)] * 3 + [(True, 2 * B)]
    assert model.training


# --------------------------------------------------------------------------- warm-up
def test_warmup_grows_epsilon_linearly_over_the_first_epochs():
    method = build_method("smoothadv", epsilon=1.0)  # warmup_epochs = 10
    eps = [method.epsilon_at(e) for e in range(12)]
    assert eps == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0])
    for w in (0, 1):
        assert build_method("smoothadv", warmup_epochs=w).epsilon_at(0) == 1.0
    assert build_method("smoothadv", epsilon=0.5, warmup_epochs=4).epsilon_at(1) == 0.25


def test_on_epoch_start_sets_the_epsilon_the_attack_uses():
    model, (x, y) = linear_model(), batch()
    method = build_method("smoothadv", epsilon=2.0, num_noise=2)
    assert method.current_epsilon == 2.0  # outside a trainer: the full ε
    method.on_epoch_start(0, context=None)
    out = run(method, model, x, y)
    assert out["epsilon"].item() == pytest.approx(0.2)
    assert 0 < out["adv_distance"] <= 0.2 + 1e-6
    method.on_epoch_start(9, context=None)
    assert run(method, model, x, y)["epsilon"].item() == pytest.approx(2.0)
    assert method.state_dict() == {}  # the trainer calls on_epoch_start after resuming too


# --------------------------------------------------------------------------- consistency
def test_smoothadv_plus_consistency_adds_the_regularizer_of_the_adversarial_logits():
    consistency = pytest.importorskip(
        "smoothcert.methods.consistency", reason="methods/consistency.py is not written yet"
    )
    model, (x, y) = linear_model(), batch()
    method = build_method("smoothadv", epsilon=0.5, num_steps=4, num_noise=3, warmup_epochs=0,
                          lbd=1.5, eta=0.3)
    out = run(method, model, x, y)
    _, logits = manual(model, x, y)
    ce = torch.stack([F.cross_entropy(z, y) for z in logits]).mean()
    reg = consistency.consistency_loss(logits, 1.5, 0.3)
    torch.testing.assert_close(out["loss"], ce + reg, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["ce"], ce, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out["consistency"], reg, rtol=1e-5, atol=1e-6)
    assert reg > 0


def test_consistency_with_single_noise_ce_still_regularizes_all_copies():
    consistency = pytest.importorskip(
        "smoothcert.methods.consistency", reason="methods/consistency.py is not written yet"
    )
    model, (x, y) = linear_model(), batch()
    method = build_method("smoothadv", epsilon=0.5, num_steps=4, num_noise=3, warmup_epochs=0,
                          multi_noise=False, lbd=2.0)
    out = run(method, model, x, y)
    _, logits = manual(model, x, y)
    expected = F.cross_entropy(logits[0], y) + consistency.consistency_loss(logits, 2.0, 0.5)
    torch.testing.assert_close(out["loss"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("lbd", [0.0, 1.0])
def test_gradients_reach_every_parameter(attack, lbd):
    model, (x, y) = linear_model(), batch()
    out = run(build_method("smoothadv", attack=attack, num_noise=2, lbd=lbd), model, x, y)
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "hparams, match",
    [
        ({"attack": "fgsm"}, "unknown attack 'fgsm'.*ddn, pgd"),
        ({"epsilon": -0.5}, "epsilon"),
        ({"epsilon": float("inf")}, "epsilon"),
        ({"num_steps": 0}, "num_steps"),
        ({"num_noise": 0}, "num_noise"),
        ({"multi_noise": 1}, "multi_noise"),
        ({"warmup_epochs": -1}, "warmup_epochs"),
        ({"lbd": -1.0}, "lbd"),
        ({"eta": float("nan")}, "eta"),
        ({"lbd": 1.0, "num_noise": 1}, "num_noise >= 2"),
    ],
)
def test_bad_hparams_raise(hparams, match):
    with pytest.raises(SmoothcertError, match=match):
        build_method("smoothadv", **hparams)
