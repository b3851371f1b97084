"""The minimal-distance search of the ``attack`` certifier: one DDN search per input instead of
one per grid budget, with records identical to attacking afresh at every ε (a plain per-budget
loop is the oracle), and no PREDICT at a point already judged."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import Halfspace
from smoothcert import Gaussian, Smoothed
from smoothcert.certifiers.attack import AttackSettings, SmoothedAttack
from smoothcert.smoothing.attacks import SoftSmoothedObjective, draw_noises

SHAPE = (1, 4, 4)
D = math.prod(SHAPE)
N, ALPHA, BATCH = 2_000, 0.001, 500


class Counting(nn.Module):
    """Counts the forward passes of ``model`` that build a graph (the attack's gradient steps)
    and those that do not (PREDICT's draws)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.gradient_steps, self.predict_passes = model, 0, 0

    def forward(self, x):
        if torch.is_grad_enabled():
            self.gradient_steps += 1
        else:
            self.predict_passes += 1
        return self.model(x)


class CountingSmoothed(Smoothed):
    """A :class:`Smoothed` that counts its PREDICT calls."""

    predicts = 0

    def predict(self, *args, **kwargs):
        self.predicts += 1
        return super().predict(*args, **kwargs)


def halfspace(seed):
    """A halfspace on 4×4 inputs near ½ and one input x it classifies, at distance d from the
    hyperplane (the exact minimal flipping distance of the smoothed classifier)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(D, generator=gen)
    x = (0.5 + 0.05 * torch.randn(D, generator=gen)).clamp(0, 1).view(SHAPE)
    z = float(x.flatten() @ w)
    return Halfspace(w, input_shape=SHAPE), x, int(z > 0), abs(z) / float(w.norm())


def settings(**kw):
    base = dict(attack="ddn", min_distance=True, max_epsilon=1.0, epsilon_step=0.05, steps=8,
                noise_draws=16)
    return AttackSettings(**{**base, **kw})


def per_budget_oracle(smoothed, cfg: AttackSettings, x, label, generator):
    """The search as first written: PREDICT at x, draw the m noises, then for ε_k = 0.05, 0.1, …
    attack afresh from x and PREDICT at the output; stop at the first flip or at the cap.
    Returns (adversarial, final prediction, ε, attempts)."""
    clean = smoothed.predict(x, N, ALPHA, BATCH, generator)
    assert clean.prediction == label
    noises = draw_noises(smoothed.noise, x[None], cfg.noise_draws, generator)
    objective = SoftSmoothedObjective(smoothed.model, torch.tensor([label]), noises)
    budgets, attacker = cfg.budgets(), cfg.attacker()
    for attempt, eps in enumerate(budgets, start=1):
        adv = attacker.attack_objective(smoothed.model, objective, x[None], epsilon=eps,
                                        generator=generator)[0]
        final = smoothed.predict(adv, N, ALPHA, BATCH, generator)
        if final.prediction != label or attempt == len(budgets):
            return adv, final, eps, attempt
    raise AssertionError("no budgets")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ddn_min_distance_searches_once_and_matches_the_per_budget_loop(seed):
    """The records are those of attacking afresh at every ε (bit for bit: the same outputs and
    the same PREDICT draws), while DDN's T gradient steps run once per input, not once per
    budget tried."""
    model, x, label, d = halfspace(seed)
    counted = Counting(model)
    smoothed = Smoothed(counted, Gaussian(0.25), 2)
    runner = SmoothedAttack(smoothed, settings(), n=N, alpha=ALPHA, batch_size=BATCH)
    outcome = runner(x, label, torch.Generator().manual_seed(seed))
    assert counted.gradient_steps == 8  # T, whatever the number of budgets tried
    adv, final, eps, attempts = per_budget_oracle(Smoothed(model, Gaussian(0.25), 2), settings(),
                                                  x, label, torch.Generator().manual_seed(seed))
    assert attempts >= 2 and outcome.success  # later budgets reuse the search
    assert torch.equal(outcome.adversarial, adv) and outcome.final == final
    assert (outcome.epsilon, outcome.attempts) == (eps, attempts)
    assert outcome.distance == float((adv - x).double().norm()) <= eps + 1e-6
    assert outcome.distance >= d - 0.03  # nothing flips PREDICT well inside the true radius


def test_pgd_min_distance_still_attacks_afresh_at_every_budget():
    model, x, label, _ = halfspace(0)
    counted = Counting(model)
    runner = SmoothedAttack(Smoothed(counted, Gaussian(0.25), 2), settings(attack="pgd"),
                            n=N, alpha=ALPHA, batch_size=BATCH)
    outcome = runner(x, label, torch.Generator().manual_seed(0))
    assert outcome.success and outcome.attempts >= 2
    assert counted.gradient_steps == 8 * outcome.attempts  # PGD's path depends on ε


def constant_model(label=1, classes=3):
    """Logits that do not depend on x: DDN's gradient is exactly zero (random directions) and
    no iterate is ever adversarial, so every budget's output is x itself."""
    linear = nn.Linear(D, classes)
    with torch.no_grad():
        linear.weight.zero_(), linear.bias.zero_()
        linear.bias[label] = 5.0
    return nn.Sequential(nn.Flatten(), linear)


def test_a_point_already_judged_is_not_judged_again():
    """DDN finds nothing: the output at every budget is x, which the clean PREDICT judged; the
    search ends at the cap without another PREDICT (as first written: one per budget, 20)."""
    counted = Counting(constant_model())
    smoothed = CountingSmoothed(counted, Gaussian(0.25), 3)
    cfg = settings(max_epsilon=1.0, epsilon_step=0.05)
    runner = SmoothedAttack(smoothed, cfg, n=N, alpha=ALPHA, batch_size=BATCH)
    x = torch.full(SHAPE, 0.5)
    outcome = runner(x, 1, torch.Generator().manual_seed(0))
    assert smoothed.predicts == 1 and not outcome.success
    assert outcome.final == outcome.clean and torch.equal(outcome.adversarial, x)
    assert (outcome.epsilon, outcome.attempts, outcome.distance) == (1.0, 20, 0.0)
    # its search followed random directions, so it depends on the generator: rerun per budget
    assert counted.gradient_steps == 8 * 20


def test_fresh_noise_reruns_the_search_at_every_budget():
    model, x, label, _ = halfspace(1)
    counted = Counting(model)
    runner = SmoothedAttack(Smoothed(counted, Gaussian(0.25), 2), settings(fresh_noise=True),
                            n=N, alpha=ALPHA, batch_size=BATCH)
    outcome = runner(x, label, torch.Generator().manual_seed(1))
    assert outcome.success and counted.gradient_steps == 8 * outcome.attempts
