"""HeatSmoothing (Campbell et al.): the loss against a hand computation on a linear model, the
eq.-10 distance by hand, the JL estimate's scale (an unbiased ‖J‖²_F whatever κ and N_c), the
noise on a random half of the batch at σ·t/n_T, its zero cases, label-freedom, the frozen
teacher's refresh per time step, and an exact resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import softmax
from torch import nn

from smoothcert import Gaussian, SmoothcertError
from smoothcert.methods import EpochContext, build_method
from smoothcert.methods.heat import (
    IMAGENET_GAMMA,
    finite_differences,
    heat_distance,
    heat_loss,
    jacobian_sq_norm,
    noise_scale,
    noisy_subset,
    time_step,
)
from smoothcert.models.checkpoint import load_checkpoint
from smoothcert.training import TrainConfig, train
from smoothcert.training import loop as train_module

B, D, C = 4, 6, 3  # batch, input pixels (1×2×3), classes


def linear_model(seed: int = 0, classes: int = C) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(D, classes)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(classes, D, generator=gen))
        lin.bias.copy_(torch.randn(classes, generator=gen))
    return nn.Sequential(nn.Flatten(), lin)


def inputs(seed: int = 1) -> torch.Tensor:
    return torch.rand(B, 1, 2, 3, generator=torch.Generator().manual_seed(seed))


def ctx(model, num_epochs: int = 5) -> EpochContext:
    return EpochContext(num_epochs, model, None, Gaussian(0.25))


def hand_loss(model, x_tilde, teacher_logits, w, weight) -> float:
    """Float64 NumPy: for v(x) = Ax + b the finite difference along the unit gradient of w·v is
    exactly w·Aĝ = ‖Aᵀw‖, so the penalty is (N_c/κ)·Σ_j ‖Aᵀw_ij‖², whatever δ."""
    a = model[1].weight.detach().double().numpy()
    b = model[1].bias.detach().double().numpy()
    xt = x_tilde.double().reshape(len(x_tilde), -1).numpy()
    v = xt @ a.T + b
    dist = 0.5 * ((softmax(v, axis=1) - softmax(teacher_logits.double().numpy(), axis=1)) ** 2)
    grads = np.einsum("jbc,cd->jbd", w.double().numpy(), a)  # Aᵀw_ij, (κ, B, D)
    kappa, c = w.shape[0], w.shape[2]
    penalty = (c / kappa) * (grads**2).sum(axis=(0, 2))
    return float(np.mean(dist.sum(axis=1) + weight * penalty))


def test_heat_loss_equals_the_closed_form_on_a_linear_model():
    model, x = linear_model(), inputs()
    gen = torch.Generator().manual_seed(2)
    teacher_logits = torch.randn(B, C, generator=gen)
    w = torch.randn(5, B, C, generator=gen) / math.sqrt(C)
    for fd_step in (0.1, 0.01):  # exact for a linear model: independent of δ
        out = heat_loss(model, x, teacher_logits, w, fd_step=fd_step, penalty_weight=0.3)
        assert out["loss"].item() == pytest.approx(hand_loss(model, x, teacher_logits, w, 0.3),
                                                   rel=1e-5)
    assert out["logits"].shape == (B, C)


@pytest.mark.parametrize(
    "epoch, schedule, scale",
    [(0, "linear", 0.5), (1, "linear", 1.0), (0, "constant", 1.0)],  # σ·t/n_T, t = epoch + 1
)
def test_method_loss_is_heat_loss_of_its_draws_in_the_documented_order(epoch, schedule, scale):
    model, x, y, noise = linear_model(), inputs(), torch.arange(B) % C, Gaussian(0.5)
    method = build_method("heat", num_steps=2, gamma=3.0, num_projections=4, noise_fraction=0.5,
                          noise_schedule=schedule)
    method.on_epoch_start(epoch, ctx(model, num_epochs=2))  # one epoch per time step
    teacher = linear_model(seed=7)  # a teacher different from v, so the distance term matters
    method.teacher = teacher
    out = method.loss(model, x, y, noise, torch.Generator().manual_seed(9))

    gen = torch.Generator().manual_seed(9)
    rows = torch.randperm(B, generator=gen)[:2]  # round(0.5 · 4) noisy examples, drawn first
    x_tilde = x.clone()
    x_tilde[rows] = x[rows] + scale * noise.sample(x[rows], gen)
    w = torch.randn(4, B, C, generator=gen) / math.sqrt(C)
    weight = 3.0 * 0.5**2 / (2 * 2)  # γ·h·σ²/2 with h = 1/n_T (σ, not the step's s)
    with torch.no_grad():
        teacher_logits = teacher(x)  # the teacher sees the clean x
    expected = hand_loss(model, x_tilde, teacher_logits, w, weight)
    assert out["loss"].item() == pytest.approx(expected, rel=1e-5)
    assert set(out) == {"loss", "logits", "distance", "penalty"}


def test_defaults_are_the_final_imagenet_script():
    method = build_method("heat")
    assert method.hparams() == {
        "num_steps": 1, "gamma": 0.006, "num_projections": 10, "fd_step": 0.01,
        "noise_fraction": 0.5, "distance": "softmax_mse", "noise_schedule": "linear",
    }
    assert math.isclose(IMAGENET_GAMMA, 1.0 * 6 / 1000)  # γ_a·κ/N_c of their ImageNet run


def test_eq10_distance_by_hand():
    # softmax(0, 0) = (½, ½), softmax(ln 3, 0) = (¾, ¼): ½·((¼)² + (¼)²) = 1/16
    v = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    f = torch.tensor([[math.log(3.0), 0.0], [math.log(3.0), 0.0]])
    got = heat_distance(v, f, "softmax_mse")
    torch.testing.assert_close(got, torch.tensor([1 / 16, 0.0]), rtol=0, atol=1e-7)


def frobenius_tolerance(a: torch.Tensor, samples: int) -> float:
    """5 standard deviations of the mean of ``samples`` draws of N_c·‖Aᵀw‖², w ~ N(0, I/N_c):
    each has variance 2·tr(M²), M = AAᵀ (a Gaussian quadratic form), so the mean's standard
    deviation is √(2·tr(M²)/samples)."""
    m = a.double() @ a.double().T
    return 5 * math.sqrt(2 * torch.trace(m @ m).item() / samples)


def test_jl_estimate_has_expectation_frobenius_norm_on_a_linear_model():
    # For v(x) = Ax + b, D_ij = ‖Aᵀw_ij‖ exactly; E‖Aᵀw‖² = ‖A‖²_F/N_c for w ~ N(0, I/N_c), so
    # the raw eq.-16 sum Σ_j D_j² has expectation (κ/N_c)·‖A‖²_F and Ĵ = (N_c/κ)·Σ_j D_j² has
    # ‖A‖²_F. 500 projections × 4 examples, fixed generator, tolerance 5 standard deviations.
    model, kappa = linear_model(), 500
    a = model[1].weight.detach()
    w = torch.randn(kappa, B, C, generator=torch.Generator().manual_seed(11)) / math.sqrt(C)
    x = inputs().requires_grad_(True)
    fd = finite_differences(model, x, model(x), w, fd_step=0.01).detach()
    torch.testing.assert_close(fd, (w @ a).norm(dim=-1), rtol=1e-4, atol=1e-4)
    frobenius = a.pow(2).sum().item()
    estimate = jacobian_sq_norm(fd, C).mean().item()
    assert estimate == pytest.approx(frobenius, abs=frobenius_tolerance(a, kappa * B))
    raw = fd.pow(2).sum(dim=0).mean().item()  # the scripts' sum: κ/N_c times as large
    assert raw == pytest.approx(kappa / C * estimate, rel=1e-6)


def test_gamma_means_the_same_for_10_and_20_classes():
    # The same linear model with 10 or 20 outputs (the first 10 rows of the 20): the logged
    # penalty is γ·h·σ²/2·‖A‖²_F for both, within 5 standard deviations. Before the N_c/κ
    # normalisation it was (κ/N_c)·… : the two would differ by a factor of 2.
    x, y, noise = inputs(), torch.zeros(B, dtype=torch.long), Gaussian(0.5)
    wide = linear_model(seed=3, classes=20)
    narrow = linear_model(seed=3, classes=10)
    with torch.no_grad():
        narrow[1].weight.copy_(wide[1].weight[:10])
    kappa, gamma = 400, 2.0
    for model in (narrow, wide):
        method = build_method("heat", gamma=gamma, num_projections=kappa, noise_fraction=0.0)
        method.on_epoch_start(0, ctx(model, num_epochs=1))
        out = method.loss(model, x, y, noise, torch.Generator().manual_seed(12))
        a = model[1].weight.detach()
        weight = gamma * 0.5**2 / 2  # γ·h·σ²/2, n_T = 1
        expected = weight * a.pow(2).sum().item()
        tolerance = weight * frobenius_tolerance(a, kappa * B)
        assert out["penalty"].item() == pytest.approx(expected, abs=tolerance)
        assert tolerance < 0.25 * expected  # tight enough to tell a factor of 2 apart


def test_noise_goes_to_a_random_half_of_the_batch_at_the_steps_scale():
    x, noise = torch.rand(8, 1, 4, 4, generator=torch.Generator().manual_seed(0)), Gaussian(0.5)
    halves = set()
    for seed in range(4):
        x_tilde = noisy_subset(x, noise, 0.5, 0.25, torch.Generator().manual_seed(seed))
        gen = torch.Generator().manual_seed(seed)
        rows = torch.randperm(8, generator=gen)[:4]  # which half: the generator's permutation
        changed = (x_tilde != x).flatten(1).any(dim=1).nonzero().flatten()
        assert sorted(changed.tolist()) == sorted(rows.tolist())  # exactly 4 of 8
        draws = noise.sample(x[rows], gen)  # then their noise, N(0, σ²), scaled by s/σ
        torch.testing.assert_close(x_tilde[rows] - x[rows], 0.25 * draws, rtol=0, atol=1e-6)
        halves.add(tuple(sorted(rows.tolist())))
    assert len(halves) > 1  # not a fixed half
    odd = noisy_subset(x[:5], noise, 0.5, 1.0, torch.Generator())
    assert (odd != x[:5]).flatten(1).any(dim=1).sum() == 3  # round(2.5) = 3: half up
    assert noisy_subset(x, noise, 0.0, 1.0, torch.Generator()) is x  # p = 0: no draws


def test_noise_std_is_sigma_t_over_n_t():
    assert [noise_scale(s, 4, "linear") for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert [noise_scale(s, 4, "constant") for s in range(4)] == [1.0] * 4
    assert noise_scale(0, 1, "linear") == 1.0  # n_T = 1 (the ImageNet run): σ
    # the drawn noise has that std: 4 noisy examples × 4,096 pixels at σ·t/n_T = 0.5·3/4
    x = torch.zeros(8, 1, 64, 64)
    x_tilde = noisy_subset(x, Gaussian(0.5), 0.5, noise_scale(2, 4, "linear"),
                           torch.Generator().manual_seed(1))
    noisy = x_tilde[(x_tilde != 0).flatten(1).any(dim=1)]
    assert len(noisy) == 4
    # the sample std of n = 16,384 normals is within 5·s/√(2n) ≈ 1.1 % of s
    assert noisy.std().item() == pytest.approx(0.375, rel=5 / math.sqrt(2 * noisy.numel()))


def test_same_model_clean_inputs_and_no_gradient_give_zero_loss():
    model, x, y = linear_model(), inputs(), torch.zeros(B, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    clean = build_method("heat", noise_fraction=0.0, gamma=0.0)  # x̃ = x, κ-term off
    clean.on_epoch_start(0, ctx(model))
    assert clean.loss(model, x, y, Gaussian(0.25), gen)["loss"].item() == 0.0
    flat = linear_model()
    with torch.no_grad():
        flat[1].weight.zero_()  # v constant in x: ĝ = 0 and every finite difference is 0
    clean_with_penalty = build_method("heat", noise_fraction=0.0)
    clean_with_penalty.on_epoch_start(0, ctx(flat))
    out = clean_with_penalty.loss(flat, x, y, Gaussian(0.25), gen)
    assert out["loss"].item() == 0.0 and out["penalty"].item() == 0.0


def test_labels_do_not_change_the_loss():
    model, x = linear_model(), inputs()
    method = build_method("heat")
    method.on_epoch_start(0, ctx(model))
    losses = [
        method.loss(model, x, y, Gaussian(0.25), torch.Generator().manual_seed(3))["loss"]
        for y in (torch.zeros(B, dtype=torch.long), torch.tensor([2, 1, 0, 2]))
    ]
    assert torch.equal(losses[0], losses[1])


def test_teacher_is_a_frozen_copy_refreshed_at_each_time_step():
    model = linear_model()
    method = build_method("heat", num_steps=2)
    method.on_epoch_start(0, ctx(model, num_epochs=4))  # steps: epochs 0-1, then 2-3
    first = {k: v.clone() for k, v in model.state_dict().items()}
    teacher = method.teacher
    assert teacher is not model and not teacher.training
    assert not any(p.requires_grad for p in teacher.parameters())
    with torch.no_grad():
        model[1].weight.add_(1.0)  # training moves v
    method.on_epoch_start(1, ctx(model, num_epochs=4))  # same step: f stays
    assert method.teacher is teacher
    assert torch.equal(method.teacher[1].weight, first["1.weight"])
    method.on_epoch_start(2, ctx(model, num_epochs=4))  # new step: f ← v
    assert torch.equal(method.teacher[1].weight, model[1].weight)
    assert method.teacher is not model


def test_time_steps_split_the_epochs_evenly_and_need_enough_epochs():
    assert [time_step(e, 10, 5) for e in range(10)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert [time_step(e, 1, 1) for e in range(1)] == [0]  # the ImageNet recipe: one epoch
    assert [time_step(e, 1000, 5) for e in (0, 199, 200, 999)] == [0, 0, 1, 4]
    with pytest.raises(SmoothcertError, match="num_steps=5 needs at least 5 epochs"):
        build_method("heat", num_steps=5).on_epoch_start(0, ctx(linear_model(), num_epochs=3))


def test_loss_before_the_epoch_hook_says_what_to_do():
    with pytest.raises(SmoothcertError, match="on_epoch_start"):
        build_method("heat").loss(linear_model(), inputs(), torch.zeros(B, dtype=torch.long),
                                  Gaussian(0.25), torch.Generator())


def test_teacher_survives_state_dict_round_trip_inside_a_step():
    model = linear_model()
    method = build_method("heat", num_steps=2)
    method.on_epoch_start(0, ctx(model, num_epochs=4))
    with torch.no_grad():
        model[1].weight.add_(1.0)
    state = method.state_dict()
    restored = build_method("heat", num_steps=2)
    restored.load_state_dict(state)
    restored.on_epoch_start(1, ctx(model, num_epochs=4))  # resumed inside step 0
    assert torch.equal(restored.teacher[1].weight, method.teacher[1].weight)
    assert not torch.equal(restored.teacher[1].weight, model[1].weight)


def kl(v, f):
    p, q = softmax(f, 1), softmax(v, 1)
    return (p * (np.log(p) - np.log(q))).sum(1)


@pytest.mark.parametrize(
    "distance, expected",
    [
        ("softmax_mse", lambda v, f: 0.5 * ((softmax(v, 1) - softmax(f, 1)) ** 2).sum(1)),
        ("logit_mse", lambda v, f: 0.5 * ((v - f) ** 2).sum(1)),
        ("kl", kl),
    ],
)
def test_distances_against_numpy(distance, expected):
    gen = torch.Generator().manual_seed(4)
    v, f = torch.randn(5, 4, generator=gen), torch.randn(5, 4, generator=gen)
    got = heat_distance(v, f, distance).double().numpy()
    np.testing.assert_allclose(got, expected(v.double().numpy(), f.double().numpy()), rtol=1e-5)


@pytest.mark.parametrize(
    "hparams, match",
    [
        ({"distance": "l1"}, "distance must be one of softmax_mse, logit_mse, kl"),
        ({"noise_schedule": "sqrt"}, "noise_schedule must be one of linear, constant"),
        ({"noise_fraction": 1.5}, "noise_fraction"),
        ({"gamma": -1.0}, "gamma"),
        ({"num_steps": 0}, "num_steps"),
        ({"num_projections": 0}, "num_projections"),
        ({"fd_step": 0.0}, "fd_step"),
    ],
)
def test_bad_hparams_raise(hparams, match):
    with pytest.raises(SmoothcertError, match=match):
        build_method("heat", **hparams)


# --------------------------------------------------------------------------- end to end
DIGITS = dict(dataset="digits", arch="digits_cnn", sigma=0.25, batch_size=64, seed=1)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    out = tmp_path_factory.mktemp("base")
    return train(TrainConfig(**DIGITS, epochs=4, lr=0.05), out, progress=False)


def test_resumed_fine_tuning_inside_a_time_step_equals_uninterrupted(pretrained, tmp_path,
                                                                     monkeypatch):
    init = tmp_path / "init.pt"
    init.write_bytes(pretrained.read_bytes())
    # 3 epochs in 2 time steps: epochs 0-1 against f⁰, epoch 2 against f¹; the crash after
    # epoch 1 resumes inside step 0, so the teacher must come from the checkpoint.
    # 256 balanced digits (4 steps an epoch): the resume does not depend on the data's size.
    config = TrainConfig(**DIGITS, epochs=3, lr=0.01, lr_schedule="constant", method="heat",
                         method_params={"num_steps": 2, "num_projections": 2},
                         init_checkpoint=str(init), train_size=256)
    straight = train(config, tmp_path / "straight", progress=False)
    real_save = train_module._save

    def save_then_die(path, trainer):
        real_save(path, trainer)
        if trainer.epoch == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "_save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(config, tmp_path / "resumed", progress=False)
    monkeypatch.undo()
    init.unlink()  # a resumed run takes its weights from its own checkpoint, not the init file
    resumed = train(config, tmp_path / "resumed", progress=False, resume=True)
    a, b = load_checkpoint(straight), load_checkpoint(resumed)
    for key, value in a.state_dict.items():
        torch.testing.assert_close(b.state_dict[key], value, rtol=0, atol=1e-6)
    teacher_a, teacher_b = a.train_state["method"]["teacher"], b.train_state["method"]["teacher"]
    assert a.train_state["method"]["step"] == b.train_state["method"]["step"] == 1
    for key, value in teacher_a.items():
        torch.testing.assert_close(teacher_b[key], value, rtol=0, atol=1e-6)
    assert a.meta["num_hparams"] == 7


def test_fine_tuning_starts_from_the_init_checkpoint_and_keeps_accuracy(pretrained):
    # One label-free epoch with the defaults (the final ImageNet script's γ = 0.006, δ = 0.01,
    # n_T = 1; κ = 10) at the paper's fixed lr 0.01 keeps the base model's accuracy on noisy
    # test digits. Measured (CPU, seed 1): 0.816 before, 0.833 after. Before the N_c/κ
    # normalisation and δ = 0.01, the run at lr 0.01 with κ = 2 and gamma 1 (0.2 on today's
    # scale) fell to 0.62: the penalty dominated.
    config = TrainConfig(**DIGITS, epochs=1, lr=0.01, lr_schedule="constant", method="heat",
                         init_checkpoint=str(pretrained))
    trainer = train_module.Trainer(config)
    base = load_checkpoint(pretrained).state_dict
    for key, value in base.items():
        assert torch.equal(trainer.model.state_dict()[key], value)
    before = trainer.test_columns()["test_acc"]
    row = trainer.train_epoch()
    assert before > 0.7 and row["test_acc"] > before - 0.05
    assert {"distance", "penalty"} <= set(row)
