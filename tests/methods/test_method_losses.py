"""Stability, consistency and MACER losses against independent NumPy/SciPy computations.

The references below are written with loops over plain float64 arrays, not with the torch code
under test; special cases use numbers derivable by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import norm
from torch import nn

from smoothcert import Gaussian, SmoothcertError
from smoothcert.methods import build_method
from smoothcert.methods.consistency import consistency_loss
from smoothcert.methods.macer import macer_loss
from smoothcert.methods.stability import stability_loss

B, C, H, W, K = 5, 1, 4, 4, 3


# --- independent references ----------------------------------------------------------------


def np_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def ref_consistency(logits, lbd, eta, variant="default"):
    """Loops over inputs and draws: λ·(1/m)Σ_j KL(p̄‖p_j) + η·H(p̄), or λ‖p_2 − p_1‖²."""
    logits = [np.asarray(z, dtype=np.float64) for z in logits]
    m, total = len(logits), 0.0
    for i in range(logits[0].shape[0]):
        p = [np_softmax(z[i]) for z in logits]
        if variant == "mse":
            total += lbd * sum((p[1][c] - p[0][c]) ** 2 for c in range(len(p[0])))
            continue
        p_bar = sum(p) / m
        kl = sum(sum(pb * math.log(pb / pj[c]) for c, pb in enumerate(p_bar)) for pj in p) / m
        h = -sum(pb * math.log(pb) for pb in p_bar)
        total += lbd * kl + {"default": eta, "kl": 0.0, "xent": lbd}[variant] * h
    return total / logits[0].shape[0]


def ref_macer(logits, targets, sigma, lbd, gamma, beta):
    """Returns (loss, classification sum, robustness sum, #inputs with a hinge term)."""
    logits = np.asarray(logits, dtype=np.float64)
    cl, rl, hinged = 0.0, 0.0, 0
    for i, y in enumerate(np.asarray(targets)):
        p = np.mean([np_softmax(z) for z in logits[i]], axis=0)
        cl -= math.log(p[y] + 1e-10)
        g = np.mean([np_softmax(beta * z) for z in logits[i]], axis=0)
        if int(np.argmax(g)) != y:
            continue
        xi = norm.ppf(g[y]) - norm.ppf(max(g[c] for c in range(len(g)) if c != y))
        if np.isfinite(xi) and xi <= gamma:
            rl += (sigma[i] if np.ndim(sigma) else sigma) / 2 * (gamma - xi)  # σ_i if per input
            hinged += 1
    return (cl + lbd * rl) / len(logits), cl, rl, hinged


# --- consistency_loss ----------------------------------------------------------------------


def close(actual, expected, tol=1e-6):
    assert float(torch.as_tensor(actual).detach()) == pytest.approx(expected, rel=tol, abs=tol)


@pytest.mark.parametrize("m", [2, 3, 5])
def test_identical_uniform_draws_leave_only_eta_log_c(m):
    logits = [torch.zeros(4, 7) for _ in range(m)]  # p̄ uniform over 7 classes, every KL = 0
    close(consistency_loss(logits, lbd=10.0, eta=0.5), 0.5 * math.log(7))


def test_identical_draws_give_eta_times_entropy_by_hand():
    z = torch.tensor([[0.0, math.log(3.0)]])  # p = (1/4, 3/4)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    close(consistency_loss([z, z.clone()], lbd=7.0, eta=0.3), 0.3 * h)


# Two inputs, two classes, two draws: p_1 = (1/4, 3/4), p_2 = (1/2, 1/2) for the first input,
# p_1 = (0.9, 0.1), p_2 = (0.1, 0.9) for the second.
Z1 = torch.tensor([[0.0, math.log(3.0)], [math.log(9.0), 0.0]], dtype=torch.float64)
Z2 = torch.tensor([[0.0, 0.0], [0.0, math.log(9.0)]], dtype=torch.float64)
KL_A = (3 / 8 * math.log(1.5) + 5 / 8 * math.log(5 / 6) + 3 / 8 * math.log(0.75)
        + 5 / 8 * math.log(1.25)) / 2  # p̄ = (3/8, 5/8)
KL_B = 0.5 * math.log(5 / 9) + 0.5 * math.log(5.0)  # p̄ = (1/2, 1/2); both draws alike
H_A, H_B = -(3 / 8 * math.log(3 / 8) + 5 / 8 * math.log(5 / 8)), math.log(2.0)


def test_two_class_default_matches_hand_derivation_and_numpy():
    lbd, eta = 4.0, 0.5
    expected = ((lbd * KL_A + eta * H_A) + (lbd * KL_B + eta * H_B)) / 2
    assert ref_consistency([Z1, Z2], lbd, eta) == pytest.approx(expected, rel=1e-12)
    close(consistency_loss([Z1, Z2], lbd, eta), expected)


def test_mse_variant_closed_form():
    # ‖p_2 − p_1‖²: (1/4)² · 2 = 1/8 and (0.8)² · 2 = 1.28; batch mean, times λ
    close(consistency_loss([Z1, Z2], lbd=3.0, variant="mse"), 3.0 * (0.125 + 1.28) / 2)


def test_kl_variant_is_default_with_eta_zero():
    close(consistency_loss([Z1, Z2], lbd=4.0, eta=0.5, variant="kl"), 4.0 * (KL_A + KL_B) / 2)
    torch.testing.assert_close(
        consistency_loss([Z1, Z2], lbd=4.0, eta=0.9, variant="kl"),
        consistency_loss([Z1, Z2], lbd=4.0, eta=0.0),
    )


def test_xent_variant_is_default_with_eta_lambda():
    close(
        consistency_loss([Z1, Z2], lbd=2.0, eta=0.1, variant="xent"),
        2.0 * (KL_A + H_A + KL_B + H_B) / 2,
    )
    torch.testing.assert_close(
        consistency_loss([Z1, Z2], lbd=2.0, variant="xent"),
        consistency_loss([Z1, Z2], lbd=2.0, eta=2.0),
    )


@pytest.mark.parametrize("variant", ["default", "kl", "xent", "mse"])
def test_m3_random_logits_match_numpy(variant):
    gen = torch.Generator().manual_seed(3)
    logits = [2 * torch.randn(6, 10, generator=gen) for _ in range(3)]
    expected = ref_consistency([z.numpy() for z in logits], 5.0, 0.5, variant)
    close(consistency_loss(logits, 5.0, 0.5, variant), expected, tol=1e-5)


def test_gradient_flows_through_the_mean_prediction():
    # gradcheck compares autograd with finite differences of the whole loss: a detached p̄
    # would drop the ∂p̄/∂z part and fail it
    gen = torch.Generator().manual_seed(4)
    z = tuple(torch.randn(3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
              for _ in range(3))
    assert torch.autograd.gradcheck(lambda *zs: consistency_loss(list(zs), 3.0, 0.5), z)


@pytest.mark.parametrize(
    "logits, kwargs, match",
    [
        ([torch.zeros(2, 3)], {}, "m >= 2"),
        ([], {}, "m >= 2"),
        ([torch.zeros(2, 3)] * 2, {"variant": "l2"}, "unknown consistency variant 'l2'.*mse"),
    ],
)
def test_consistency_loss_rejects_bad_input(logits, kwargs, match):
    with pytest.raises(SmoothcertError, match=match):
        consistency_loss(logits, 1.0, **kwargs)


# --- macer_loss ----------------------------------------------------------------------------


def test_macer_matches_scipy_reference_on_random_logits():
    gen = torch.Generator().manual_seed(5)
    logits = 0.3 * torch.randn(40, 6, 4, generator=gen)
    targets = torch.randint(0, 4, (40,), generator=gen)
    args = dict(sigma=0.5, lbd=12.0, gamma=0.5, beta=16.0)
    expected, _, _, hinged = ref_macer(logits.numpy(), targets.numpy(), **args)
    g = F.softmax(16.0 * logits.double(), dim=2).mean(1)
    correct = int((g.argmax(1) == targets).sum())
    assert 0 < hinged < correct < 40  # the data exercise all three branches
    close(macer_loss(logits, targets, **args), expected, tol=1e-5)


def test_macer_all_misclassified_leaves_only_classification():
    logits = torch.tensor([[[2.0, 0.0, 0.0], [1.0, 0.5, 0.0]], [[0.0, 0.0, 1.0], [0.0, 3.0, 0.0]]])
    targets = torch.tensor([1, 0])  # top classes of the mean tempered softmax: 0 and 1
    # classification by hand: −log of the label's mean softmax (+1e-10)
    cl = 0.0
    for i, y in enumerate(targets.tolist()):
        p = [math.exp(v[y]) / sum(math.exp(u) for u in v) for v in logits[i].tolist()]
        cl -= math.log(sum(p) / 2 + 1e-10)
    close(macer_loss(logits, targets, sigma=1.0, lbd=50.0, gamma=8.0, beta=16.0), cl / 2)


def test_macer_no_hinge_where_xi_exceeds_gamma():
    logits = torch.tensor([[[1.0, 0.0, 0.0]] * 3])  # one input, label 0, confidently correct
    targets = torch.tensor([0])
    g = np_softmax([4.0, 0.0, 0.0])  # β = 4: ĝ = (e⁴, 1, 1) / (e⁴ + 2)
    xi = norm.ppf(g[0]) - norm.ppf(g[1])
    assert 2.0 < xi < 5.0
    cl = -math.log(np_softmax([1.0, 0.0, 0.0])[0] + 1e-10)
    close(macer_loss(logits, targets, sigma=0.25, lbd=5.0, gamma=2.0, beta=4.0), cl)
    with_hinge = cl + 5.0 * 0.25 / 2 * (5.0 - xi)  # the same input with γ above ξ
    close(macer_loss(logits, targets, sigma=0.25, lbd=5.0, gamma=5.0, beta=4.0), with_hinge)


def test_macer_drops_infinite_xi_and_keeps_gradients_finite():
    # input 0: margin 10 with β = 16 → runner-up exp(−160) underflows to 0 in float32, ξ = ∞
    # input 1: a moderate, correctly classified input that keeps its hinge term
    logits = torch.tensor([[[10.0, 0.0, 0.0]] * 2, [[0.1, 0.0, -0.1], [0.2, 0.1, 0.0]]])
    targets = torch.tensor([0, 0])
    assert F.softmax(16.0 * logits[0, 0], dim=0)[1] == 0  # the premise, in float32
    args = dict(sigma=0.5, lbd=3.0, gamma=8.0, beta=16.0)
    _, cl, _, _ = ref_macer(logits.numpy(), targets.numpy(), **args)
    _, _, rl1, hinged = ref_macer(logits[1:].numpy(), targets[1:].numpy(), **args)
    assert hinged == 1
    z = logits.clone().requires_grad_(True)
    loss = macer_loss(z, targets, **args)
    close(loss, (cl + 3.0 * rl1) / 2, tol=1e-5)
    loss.backward()
    assert torch.isfinite(z.grad).all()


def test_macer_gradient_matches_finite_differences():
    gen = torch.Generator().manual_seed(6)
    z = (0.2 * torch.randn(4, 3, 3, generator=gen, dtype=torch.float64)).requires_grad_(True)
    y = torch.tensor([0, 1, 2, 0])
    assert torch.autograd.gradcheck(lambda t: macer_loss(t, y, 0.5, 12.0, 8.0, 16.0), (z,))


def test_macer_rejects_wrong_shapes():
    with pytest.raises(SmoothcertError, match=r"\(B, k, C\)"):
        macer_loss(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long), 0.5, 12.0, 8.0, 16.0)


# --- stability -----------------------------------------------------------------------------


def linear_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(C * H * W, K))


def batch():
    gen = torch.Generator().manual_seed(1)
    return torch.rand(B, C, H, W, generator=gen), torch.randint(0, K, (B,), generator=gen)


def test_stability_equals_clean_ce_plus_soft_ce_by_hand():
    model, (x, y), noise, lbd = linear_model(), batch(), Gaussian(0.5), 2.0
    method = build_method("stability", lbd=lbd)
    out = method.loss(model, x, y, noise, torch.Generator().manual_seed(9))
    delta = noise.sample(x, torch.Generator().manual_seed(9)).numpy().reshape(B, -1)
    w = model[1].weight.detach().double().numpy()
    b = model[1].bias.detach().double().numpy()
    xs = x.double().numpy().reshape(B, -1)
    ce = soft = 0.0
    for i in range(B):
        p_clean = np_softmax(w @ xs[i] + b)
        log_p_noisy = np.log(np_softmax(w @ (xs[i] + delta[i]) + b))
        ce -= math.log(p_clean[y[i]])
        soft -= sum(p_clean[c] * log_p_noisy[c] for c in range(K))
    close(out["loss"], (ce + lbd * soft) / B, tol=1e-5)
    close(out["ce"], ce / B, tol=1e-5)
    close(out["stability"], soft / B, tol=1e-5)


def test_stability_loss_trains_the_clean_target_too():
    gen = torch.Generator().manual_seed(7)
    noisy, clean = (torch.randn(3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
                    for _ in range(2))
    assert torch.autograd.gradcheck(stability_loss, (noisy, clean))
    stability_loss(noisy, clean).backward()
    assert clean.grad.abs().sum() > 0  # not detached, as in Jeong & Shin's train_stab.py


# --- the methods through build_method ------------------------------------------------------

SMALL = [
    ("stability", {}),
    ("stability", {"lbd": 0.5}),
    ("consistency", {}),
    ("consistency", {"num_noise": 3, "variant": "mse"}),
    ("consistency", {"variant": "xent", "lbd": 3.0}),
    ("macer", {"num_noise": 4}),
    ("macer", {"num_noise": 2, "deferred_epochs": 3}),
]


@pytest.mark.parametrize("name, hparams", SMALL)
def test_method_gives_finite_loss_logits_and_scalar_logs(name, hparams):
    model, (x, y) = linear_model(), batch()
    out = build_method(name, **hparams).loss(model, x, y, Gaussian(0.25), torch.Generator())
    assert out["loss"].dim() == 0 and torch.isfinite(out["loss"])
    assert out["logits"].shape == (B, K)
    logged = {k: v for k, v in out.items() if k not in ("loss", "logits")}
    assert logged and all(v.dim() == 0 and not v.requires_grad for v in logged.values())
    out["loss"].backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_consistency_method_is_noisy_ce_plus_consistency_loss():
    model, (x, y), noise, m = linear_model(), batch(), Gaussian(0.5), 3
    method = build_method("consistency", num_noise=m, lbd=4.0, eta=0.2)
    out = method.loss(model, x, y, noise, torch.Generator().manual_seed(2))
    draws = noise.sample(x.repeat(m, 1, 1, 1), torch.Generator().manual_seed(2)).view(m, *x.shape)
    logits = [model(x + draws[j]) for j in range(m)]  # copy-major: draw j is rows jB..(j+1)B
    ce = float(sum(F.cross_entropy(z, y) for z in logits).detach()) / m
    reg = ref_consistency([z.detach().numpy() for z in logits], 4.0, 0.2)
    close(out["loss"], ce + reg, tol=1e-5)
    close(out["consistency"], reg, tol=1e-5)
    torch.testing.assert_close(out["logits"], logits[0], rtol=1e-5, atol=1e-6)


def test_macer_method_matches_reference_and_defers_lambda():
    model, (x, y), noise, k = linear_model(), batch(), Gaussian(0.5), 4
    draws = noise.sample(x.repeat(k, 1, 1, 1), torch.Generator().manual_seed(3)).view(k, *x.shape)
    logits = torch.stack([model(x + draws[j]) for j in range(k)], dim=1).detach()  # (B, k, K)
    expected, cl, rl, _ = ref_macer(logits.numpy(), y.numpy(), 0.5, 12.0, 8.0, 16.0)
    method = build_method("macer", num_noise=k, deferred_epochs=2)
    for epoch, want in [(0, cl / B), (1, cl / B), (2, expected)]:
        method.on_epoch_start(epoch, None)
        out = method.loss(model, x, y, noise, torch.Generator().manual_seed(3))
        close(out["loss"], want, tol=1e-5)
    close(out["ce"], cl / B, tol=1e-5)
    close(out["robustness"], rl / B, tol=1e-5)


def test_macer_with_per_sample_sigma_noises_and_weighs_each_input_at_its_own_sigma():
    model, (x, _), k = linear_model(), batch(), 4
    y = model(x).argmax(dim=1).detach()  # labels the model gets right: hinge terms to weigh
    sigma = torch.tensor([0.2, 0.5, 0.9, 0.3, 0.7])
    eps = torch.randn((k * B, C, H, W), generator=torch.Generator().manual_seed(3))
    draws = (eps * sigma.repeat(k).view(-1, 1, 1, 1)).view(k, *x.shape)  # copy j: rows jB..
    logits = torch.stack([model(x + draws[j]) for j in range(k)], dim=1).detach()  # (B, k, K)
    expected, cl, rl, hinged = ref_macer(logits.numpy(), y.numpy(), sigma.numpy(), 12.0, 8.0, 1.0)
    assert hinged >= 2  # several inputs carry a hinge term, each with its own σ_i
    method = build_method("macer", num_noise=k, beta=1.0)
    out = method.loss(model, x, y, Gaussian(sigma), torch.Generator().manual_seed(3))
    close(out["loss"], expected, tol=1e-5)
    close(out["robustness"], rl / B, tol=1e-5)
    with pytest.raises(SmoothcertError, match="one σ per input"):
        macer_loss(logits, y, sigma[:3], 12.0, 8.0, 1.0)


@pytest.mark.parametrize(
    "name, hparams, match",
    [
        ("consistency", {"num_noise": 1}, "num_noise.*>= 2"),
        ("consistency", {"variant": "js"}, "variant 'js'"),
        ("consistency", {"lbd": -1.0}, "lbd.*>= 0"),
        ("consistency", {"eta": float("nan")}, "eta"),
        ("stability", {"lbd": 0.0}, "lbd.*positive"),
        ("macer", {"gamma": 0}, "gamma.*positive"),
        ("macer", {"beta": -16.0}, "beta"),
        ("macer", {"num_noise": 0}, "num_noise"),
        ("macer", {"deferred_epochs": -1}, "deferred_epochs"),
    ],
)
def test_bad_hparams_raise(name, hparams, match):
    with pytest.raises(SmoothcertError, match=match):
        build_method(name, **hparams)
