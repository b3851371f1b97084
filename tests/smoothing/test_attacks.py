"""Attacks on the soft smoothed classifier: closed forms on a linear model, the ε-ball and the
[0, 1] box, eval mode, the objective, DDN's schedule, validation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import Halfspace
from smoothcert import Gaussian, SmoothcertError
from smoothcert.smoothing.attacks import (
    ATTACKS,
    DDN,
    PGDL2,
    SoftSmoothedObjective,
    ddn_step_size,
    draw_noises,
    majority_vote,
    noisy_logits,
    soft_smoothed_log_prob,
)

B, SHAPE, K = 8, (1, 4, 4), 5
D = math.prod(SHAPE)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(D, 32), nn.Tanh(), nn.Linear(32, K))


def batch(seed=1):
    """Inputs in [0, 1] with some pixels exactly at 0 and 1, so the box constraint binds."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand((B,) + SHAPE, generator=gen)
    x[:, 0, 0, :2], x[:, 0, 1, :2] = 0.0, 1.0
    return x, torch.randint(0, K, (B,), generator=gen)


def noises_for(x, m=3, sigma=0.25, seed=2):
    return draw_noises(Gaussian(sigma), x, m, torch.Generator().manual_seed(seed))


def soft_loss(model, x, y, noises):
    """−log mean_j softmax(f(x + δ_j))_y computed naively, in float64."""
    with torch.no_grad():
        p = torch.stack([F.softmax(model(x + n).double(), dim=1) for n in noises]).mean(0)
    return -p.gather(1, y[:, None]).squeeze(1).log()


def attack(name, **hparams):
    return ATTACKS[name](**hparams)


class ModeRecorder(nn.Module):
    """Wraps a model and records ``self.training`` at every forward pass."""

    def __init__(self, model):
        super().__init__()
        self.model, self.modes = model, []

    def forward(self, x):
        self.modes.append(self.training)
        return self.model(x)


# --------------------------------------------------------------------------- closed forms
def linear_problem(seed=0):
    """A 2-class linear model on 16 pixels and inputs near 0.5, whose labels it gets right.

    ε = 0.3 never reaches the box: every coordinate of x ± εŵ stays inside [0, 1].
    """
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(D, generator=gen)
    x = 0.5 + 0.1 * (2 * torch.rand((B,) + SHAPE, generator=gen) - 1)
    z = x.flatten(1) @ w
    return Halfspace(w), x, (z > 0).long(), w


def linear_optimum(w, x, y, noises, eps):
    """The exact maximiser over the ε-ball, x − s·ε·ŵ (s = ±1 for y = 1/0), and its loss."""
    s = (2 * y - 1).double()
    w64 = w.double()
    x_star = x.double() - (s * eps)[:, None, None, None] * (w64 / w64.norm()).view(SHAPE)
    z = ((x_star.unsqueeze(0) + noises.double()).flatten(2) @ w64)  # (m, B)
    loss = -torch.log(torch.sigmoid(2 * s * z).mean(0))  # softmax([−z, z])_y = σ(2 s z)
    return x_star, loss


@pytest.mark.parametrize("steps", [1, 2, 5])
@pytest.mark.parametrize("m, sigma", [(1, 0.0), (4, 0.25)])
def test_pgd_reaches_the_closed_form_optimum_of_a_linear_model(steps, m, sigma):
    model, x, y, w = linear_problem()
    noises = torch.zeros((m,) + x.shape) if sigma == 0 else noises_for(x, m, sigma)
    eps = torch.full((B,), 0.3)
    out = PGDL2(num_steps=steps).attack(model, x, y, noises, epsilon=0.3)
    x_star, best = linear_optimum(w, x, y, noises, eps)
    torch.testing.assert_close(out.adversarial.double(), x_star, rtol=0, atol=1e-6)
    got = -soft_smoothed_log_prob(noisy_logits(model, out.adversarial, noises).double(), y)
    torch.testing.assert_close(got, best, rtol=1e-5, atol=1e-6)
    assert (got > soft_loss(model, x, y, noises)).all()  # strictly worse for the model


def test_ddn_finds_the_boundary_of_a_linear_model_within_epsilon():
    model, x, y, w = linear_problem()
    eps = 0.3
    z = x.flatten(1) @ w
    dist = z.abs() / w.norm()  # distance to the decision boundary
    noises = torch.zeros((1,) + x.shape)
    out = DDN(num_steps=10).attack(model, x, y, noises, epsilon=eps)
    delta = (out.adversarial - x).flatten(1)
    s = (2 * y - 1).float()
    cos = F.cosine_similarity(delta, -s[:, None] * w[None], dim=1)
    near = dist < eps / 1.05**2  # reachable within the 10-step norm schedule
    assert near.any() and (~near).any()
    assert torch.allclose(cos[near], torch.ones(()), atol=1e-5)  # along −s·ŵ
    assert (out.distance[near] >= dist[near] - 1e-6).all()  # DDN's best is adversarial
    assert (out.distance <= eps + 1e-6).all()
    assert (soft_loss(model, out.adversarial, y, noises)[near] > math.log(2)).all()


class InputRecorder(nn.Module):
    """Records the (noise-free) inputs at which a model is evaluated."""

    def __init__(self, model):
        super().__init__()
        self.model, self.inputs = model, []

    def forward(self, x):
        self.inputs.append(x.detach().clone())
        return self.model(x)


def test_pgd_steps_two_epsilon_over_t_from_x():
    # Along a linear model's gradient, the evaluated iterates sit at 0, α, 2α, … capped at ε.
    model, x, y, _ = linear_problem()
    rec = InputRecorder(model)
    PGDL2(num_steps=4).attack(rec, x, y, torch.zeros((1,) + x.shape), epsilon=0.3)
    dists = torch.stack([(z - x).flatten(1).norm(dim=1) for z in rec.inputs])  # (T, B)
    expected = torch.tensor([0.0, 0.15, 0.3, 0.3])[:, None].expand(-1, B)
    torch.testing.assert_close(dists, expected, rtol=0, atol=1e-6)


def test_pgd_clamps_into_the_box_before_projecting():
    # Salman et al.'s order: clamp, then project. From x₀ = 1, ascending along ŵ = (1, 1)/√2
    # with ε = 0.3 and one step of 2ε: clamping zeroes δ₀, and the projection keeps the full
    # budget on δ₁ (the other order would end at ‖δ‖ = 0.3/√2).
    w = torch.zeros(D)
    w[:2] = 1.0
    x = torch.full((1,) + SHAPE, 0.5)
    x.view(-1)[0] = 1.0
    out = PGDL2(num_steps=1).attack(Halfspace(w, b=-5.0), x, torch.zeros(1, dtype=torch.long),
                                    torch.zeros((1,) + x.shape), epsilon=0.3)
    delta = (out.adversarial - x).view(-1)
    torch.testing.assert_close(delta[:2], torch.tensor([0.0, 0.3]), rtol=0, atol=1e-6)


def test_ddn_grows_its_norm_budget_by_gamma_from_epsilon_while_not_adversarial():
    w = torch.zeros(D)
    w[5] = 1.0
    x = torch.full((1,) + SHAPE, 0.5)
    rec = InputRecorder(Halfspace(w, b=0.5 - 0.9))  # boundary far away: never adversarial
    DDN(num_steps=5, gamma=0.1).attack(rec, x, torch.ones(1, dtype=torch.long),
                                       torch.zeros((1,) + x.shape), epsilon=0.2)
    dists = [float((z - x).norm()) for z in rec.inputs]
    assert dists == pytest.approx([0.0, 0.22, 0.242, 0.2662, 0.29282], rel=1e-5)


def test_ddn_leaves_inputs_it_cannot_flip_unperturbed():
    # As in the authors' code: no adversarial iterate → δ = 0. Boundary at distance 3·ε, and
    # the budget can grow to at most ε·1.05^(T−1) = 1.22·ε in T = 5 steps.
    w = torch.zeros(D)
    w[5] = 1.0
    x = torch.full((2,) + SHAPE, 0.5)
    model, y = Halfspace(w, b=0.5 - 0.3), torch.ones(2, dtype=torch.long)
    out = DDN(num_steps=5).attack(model, x, y, torch.zeros((1,) + x.shape), epsilon=0.1)
    assert torch.equal(out.adversarial, x)
    assert torch.equal(out.distance, torch.zeros(2))


def test_ddn_returns_x_where_the_noisy_vote_is_already_wrong():
    model, x, y, _ = linear_problem()
    out = DDN(num_steps=3).attack(model, x, 1 - y, torch.zeros((1,) + x.shape), epsilon=0.3)
    assert torch.equal(out.adversarial, x)


# --------------------------------------------------------------------------- one search, all ε
@pytest.mark.parametrize("init_norm", [None, 0.7])
def test_ddn_search_within_epsilon_is_the_attack_at_epsilon_bit_for_bit(init_norm):
    """ε only projects DDN's result (and starts its norm when init_norm is null): the search,
    projected onto each ε-ball, is the attack at that ε from the same generator state."""
    model, (x, _) = mlp(), batch()
    noises = noises_for(x, m=3, sigma=0.5)
    y = majority_vote(noisy_logits(model, x, noises))  # labels the noisy vote gets right
    ddn = DDN(num_steps=6, init_norm=init_norm)
    objective = SoftSmoothedObjective(model, y, noises)
    eps = torch.linspace(0.1, 2.0, B)
    for epsilon in (0.3, 1.2, eps):
        gen_a, gen_b = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
        adv = ddn.attack_objective(model, objective, x, epsilon=epsilon, generator=gen_a)
        found = ddn.search(model, objective, x, epsilon=None if init_norm else epsilon,
                           generator=gen_b)
        assert torch.equal(x + found.within(epsilon), adv)
        assert torch.equal(gen_a.get_state(), gen_b.get_state())
        assert not found.random.any() and ddn.epsilon_free == (init_norm is not None)
    assert (found.delta.flatten(1).norm(dim=1) > 0).sum() >= B // 2  # it found something
    with pytest.raises(SmoothcertError, match="needs epsilon"):
        DDN(num_steps=2).search(model, objective, x)


def test_ddn_search_flags_random_directions():
    model = nn.Sequential(nn.Flatten(), nn.Linear(D, K))
    nn.init.zeros_(model[1].weight)  # a constant model: ∇L = 0, every step is random
    x, y = torch.full((B,) + SHAPE, 0.5), torch.zeros(B, dtype=torch.long)
    objective = SoftSmoothedObjective(model, y, torch.zeros((1,) + x.shape))
    found = DDN(num_steps=2, init_norm=1.0).search(model, objective, x)
    assert found.random.all() and torch.equal(found.delta, torch.zeros_like(x))
    smooth = mlp()
    objective = SoftSmoothedObjective(smooth, y, torch.zeros((1,) + x.shape))
    found = DDN(num_steps=2, init_norm=1.0).search(smooth, objective, x)
    assert not found.random.any() and not PGDL2().epsilon_free


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_skip_draws_leaves_the_generator_where_the_attack_does(name):
    model, (x, y) = mlp(), batch()
    ran, skipped = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    attacker = attack(name, num_steps=4)
    attacker.attack(model, x, y, noises_for(x), epsilon=0.5, generator=ran)
    attacker.skip_draws(x, skipped)
    assert torch.equal(ran.get_state(), skipped.get_state())


# --------------------------------------------------------------------------- constraints
@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.parametrize("eps", [0.05, 0.5, 3.0, "per-input"])
def test_attack_stays_in_the_epsilon_ball_and_the_box(name, eps):
    model, (x, y) = mlp(), batch()
    if eps == "per-input":
        eps = torch.linspace(0.0, 2.0, B)
    noises = noises_for(x, m=3, sigma=0.5)
    gen = torch.Generator().manual_seed(3)
    out = attack(name, num_steps=7).attack(model, x, y, noises, epsilon=eps, generator=gen)
    bound = torch.as_tensor(eps).expand(B)
    norms = (out.adversarial - x).flatten(1).norm(dim=1)
    assert (norms <= bound + 1e-6).all()
    assert out.adversarial.min() >= 0 and out.adversarial.max() <= 1
    torch.testing.assert_close(out.distance, norms)
    assert out.noises is noises or torch.equal(out.noises, noises)  # returned for reuse
    assert not out.adversarial.requires_grad


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_epsilon_zero_returns_x(name):
    model, (x, y) = mlp(), batch()
    out = attack(name, num_steps=3).attack(model, x, y, noises_for(x), epsilon=0.0)
    assert torch.equal(out.adversarial, x)
    assert torch.equal(out.distance, torch.zeros(B))


def test_pgd_increases_the_soft_smoothed_loss_of_every_input():
    model, (x, y) = mlp(), batch()
    noises = noises_for(x, m=4)
    out = PGDL2(num_steps=10).attack(model, x, y, noises, epsilon=0.5)
    before, after = soft_loss(model, x, y, noises), soft_loss(model, out.adversarial, y, noises)
    assert (after > before).all()
    assert (out.distance > 0.49).all()  # a smooth model: PGD ends on the sphere


def test_ddn_increases_the_soft_smoothed_loss():
    model, (x, _) = mlp(), batch()
    noises = noises_for(x, m=4)
    y = majority_vote(noisy_logits(model, x, noises))  # labels the noisy vote gets right
    out = DDN(num_steps=10).attack(model, x, y, noises, epsilon=2.0)
    before, after = soft_loss(model, x, y, noises), soft_loss(model, out.adversarial, y, noises)
    moved = out.distance > 0
    assert moved.sum() >= B // 2
    assert (after[moved] > before[moved]).all()
    assert torch.equal(after[~moved], before[~moved])


def test_pgd_with_more_noise_copies_sees_the_fixed_draws_only():
    # The result depends on the noises passed in, not on the generator (used only for
    # zero-gradient fallbacks, which a smooth model never hits).
    model, (x, y) = mlp(), batch()
    noises = noises_for(x, m=2)
    a = PGDL2(num_steps=4).attack(model, x, y, noises, epsilon=0.4,
                                  generator=torch.Generator().manual_seed(0))
    b = PGDL2(num_steps=4).attack(model, x, y, noises, epsilon=0.4,
                                  generator=torch.Generator().manual_seed(99))
    c = PGDL2(num_steps=4).attack(model, x, y, noises_for(x, m=2, seed=5), epsilon=0.4)
    assert torch.equal(a.adversarial, b.adversarial)
    assert not torch.allclose(a.adversarial, c.adversarial)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_zero_gradient_takes_a_random_unit_step(name):
    # A constant model has ∇L = 0 everywhere: the step is a random direction of full length.
    model = nn.Sequential(nn.Flatten(), nn.Linear(D, K))
    nn.init.zeros_(model[1].weight)
    x, y = torch.full((B,) + SHAPE, 0.5), torch.zeros(B, dtype=torch.long)
    out = attack(name, num_steps=1).attack(
        model, x, y, torch.zeros((1,) + x.shape), epsilon=0.2,
        generator=torch.Generator().manual_seed(0),
    )
    if name == "pgd":  # one step of 2ε, projected back onto the sphere
        torch.testing.assert_close(out.distance, torch.full((B,), 0.2))
    else:  # DDN: never adversarial (uniform softmax → vote for class 0 = y) → unperturbed
        assert torch.equal(out.adversarial, x)


# --------------------------------------------------------------------------- modes & grads
@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.parametrize("training", [True, False])
def test_attack_runs_in_eval_mode_and_restores_the_mode(name, training):
    model = ModeRecorder(mlp()).train(training)
    x, y = batch()
    attack(name, num_steps=3).attack(model, x, y, noises_for(x), epsilon=0.3)
    assert model.modes == [False] * 3  # one batched forward per step, all in eval mode
    assert model.training is training and model.model[1].training is training


def test_attack_leaves_no_parameter_gradients_and_works_under_no_grad():
    model, (x, y) = mlp(), batch()
    noises = noises_for(x)
    with torch.no_grad():
        out = PGDL2(num_steps=3).attack(model, x, y, noises, epsilon=0.3)
    assert all(p.grad is None for p in model.parameters())
    assert (soft_loss(model, out.adversarial, y, noises) > soft_loss(model, x, y, noises)).all()


# --------------------------------------------------------------------------- pieces
def test_soft_smoothed_log_prob_is_the_log_of_the_mean_softmax():
    gen = torch.Generator().manual_seed(0)
    logits, y = 3 * torch.randn(5, B, K, generator=gen), torch.randint(0, K, (B,), generator=gen)
    naive = F.softmax(logits.double(), dim=-1).mean(0).gather(1, y[:, None]).squeeze(1).log()
    torch.testing.assert_close(soft_smoothed_log_prob(logits.double(), y), naive)
    extreme = torch.zeros(2, 1, 3)
    extreme[:, 0, 0] = 200.0  # p_y = e^−200 in both copies: log(clamp(p, 1e-20)) would saturate
    value = soft_smoothed_log_prob(extreme, torch.tensor([1]))
    torch.testing.assert_close(value, torch.tensor([-200.0]), rtol=1e-6, atol=1e-4)


def test_noisy_logits_are_copy_major_and_the_objective_uses_them():
    model, (x, y) = mlp(), batch()
    noises = noises_for(x, m=3)
    logits = noisy_logits(model, x, noises)
    assert logits.shape == (3, B, K)
    torch.testing.assert_close(logits[2], model(x + noises[2]), rtol=1e-6, atol=1e-6)
    value = SoftSmoothedObjective(model, y, noises)(x)
    torch.testing.assert_close(value.loss.double(), soft_loss(model, x, y, noises),
                               rtol=1e-5, atol=1e-6)
    assert torch.equal(value.misclassified, majority_vote(logits) != y)


def test_majority_vote_breaks_ties_toward_the_smaller_class():
    logits = torch.tensor([[[0.0, 1.0, 0.0]], [[0.0, 0.0, 1.0]], [[0.0, 0.0, 1.0]]])
    assert majority_vote(logits).tolist() == [2]
    assert majority_vote(logits[:2]).tolist() == [1]


def test_draw_noises_shape_determinism_and_per_sample_sigma():
    x = torch.zeros((3,) + SHAPE)
    a = draw_noises(Gaussian(0.5), x, 4, torch.Generator().manual_seed(0))
    b = draw_noises(Gaussian(0.5), x, 4, torch.Generator().manual_seed(0))
    assert a.shape == (4, 3) + SHAPE and torch.equal(a, b)
    sigma = torch.tensor([0.01, 1.0, 10.0])
    c = draw_noises(Gaussian(sigma), x, 200, torch.Generator().manual_seed(0))
    std = c.transpose(0, 1).flatten(1).std(dim=1)
    torch.testing.assert_close(std, sigma, rtol=0.05, atol=0)


def test_ddn_step_sizes_are_torch_cosine_annealing_stepped_before_each_update():
    steps = 7
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=0.01)
    expected = []
    for _ in range(steps):
        opt.step()
        sched.step()  # the authors call this first in each iteration (PyTorch < 1.1 order)
        expected.append(opt.param_groups[0]["lr"])
    got = [ddn_step_size(i, steps) for i in range(steps)]
    assert got == pytest.approx(expected, rel=1e-12)
    assert got[-1] == pytest.approx(0.01)


def test_ddn_quantized_iterates_stay_on_the_grey_level_grid():
    model, x, y, _ = linear_problem()
    x = (x * 255).round() / 255
    out = DDN(num_steps=10, quantize_levels=256).attack(
        model, x, y, torch.zeros((1,) + x.shape), epsilon=10.0  # large: no final projection
    )
    assert (out.distance > 0).all()
    levels = out.adversarial * 255
    torch.testing.assert_close(levels, levels.round(), rtol=0, atol=1e-4)


def test_attack_registry_names_its_entries():
    assert set(ATTACKS) >= {"pgd", "ddn"}
    with pytest.raises(SmoothcertError, match="unknown attack 'fgsm'.*ddn, pgd"):
        ATTACKS["fgsm"]


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "eps", [-0.1, float("nan"), float("inf"), True, "0.5", torch.tensor([0.1, -0.1] * 4),
            torch.ones(3), torch.ones(B, 1)]
)
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_bad_epsilon_raises(name, eps):
    model, (x, y) = mlp(), batch()
    with pytest.raises(SmoothcertError, match="ε"):
        attack(name).attack(model, x, y, noises_for(x), epsilon=eps)


@pytest.mark.parametrize(
    "cls, hparams, match",
    [
        (PGDL2, {"num_steps": 0}, "num_steps"),
        (PGDL2, {"num_steps": 2.5}, "num_steps"),
        (PGDL2, {"num_steps": True}, "num_steps"),
        (PGDL2, {"rel_stepsize": 0.0}, "rel_stepsize"),
        (DDN, {"num_steps": -1}, "num_steps"),
        (DDN, {"gamma": 0.0}, "gamma"),
        (DDN, {"gamma": 1.0}, "gamma"),
        (DDN, {"init_norm": -1.0}, "init_norm"),
        (DDN, {"quantize_levels": 1}, "quantize_levels"),
    ],
)
def test_bad_hyperparameters_raise(cls, hparams, match):
    with pytest.raises(SmoothcertError, match=match):
        cls(**hparams)


def test_hyperparameters_are_keyword_only():
    with pytest.raises(TypeError):
        PGDL2(10)


def test_bad_batches_raise():
    model, (x, y) = mlp(), batch()
    pgd, noises = PGDL2(num_steps=1), noises_for(x)
    with pytest.raises(SmoothcertError, match=r"\[0, 1\]"):
        pgd.attack(model, x * 2, y, noises, epsilon=0.1)
    with pytest.raises(SmoothcertError, match="noises must have shape"):
        pgd.attack(model, x, y, noises[0], epsilon=0.1)
    with pytest.raises(SmoothcertError, match="noises must have shape"):
        pgd.attack(model, x, y, noises[:, :2], epsilon=0.1)
    with pytest.raises(SmoothcertError, match="labels"):
        pgd.attack(model, x, y[:3], noises, epsilon=0.1)
