"""SmoothMix: golden values from the authors' code, closed forms of the loss and the attack, the
warm-up (also after a resume), bad hyperparameters, and training from the CLI with resume."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from smoothcert import Gaussian, SmoothcertError
from smoothcert.cli.app import main
from smoothcert.methods import EpochContext, build_method
from smoothcert.methods.smoothmix import smoothmix_attack, smoothmix_mixup_loss
from smoothcert.models.checkpoint import load_checkpoint
from smoothcert.smoothing.attacks import draw_noises, soft_smoothed_log_prob
from smoothcert.training import loop as train_module

ROOT = Path(__file__).resolve().parents[2]


def _golden_script():
    """tools/golden/smoothmix_golden.py as a module: its ``inputs`` and ``CASES`` (importing it
    does not need the authors' code)."""
    spec = importlib.util.spec_from_file_location(
        "smoothmix_golden", ROOT / "tools" / "golden" / "smoothmix_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


golden = _golden_script()

# Computed by `python tools/golden/smoothmix_golden.py /tmp/smix_ref` (torch 2.15.0 CPU), where
# /tmp/smix_ref is jh-jeong/smoothmix at commit cb1fd33055a29d0c41bbc429a982fdec709e993c: one
# step of `train()` in code/train.py (blob d7aeea1b) per case of golden.CASES, on golden.inputs(m):
# the tiny MLP (seed 0, last layer × 8), x = rand(6, 1, 8, 8) (seed 1), y = [1, 1, 1, 1, 7, 0],
# noise j = eps[j]·σ with eps = randn(m, 6, 1, 8, 8) (seed 2) injected as their
# torch.randn_like draws, u = rand(6) (seed 3) as their torch.rand draw (λ = u/2), the loaded
# batch as one chunk, args.eta / args.warmup_v / attacker.maxnorm_s set as their main() sets them
# for the case's warm-up factor. "loss" is their `loss` (losses.avg), "grad_norm" ‖∇_θ loss‖₂
# read by a stand-in optimizer, the distances ‖x̂ − x‖₂ and ‖x_s − x‖₂ from their
# SmoothMix_PGD.attack on the same inputs. The mixup mask holds for 4, 4 and 3 of 6 inputs.
GOLDEN = {
    "plain": {
        "loss": 1.384970784187317, "grad_norm": 4.5343148431662685,
        "adv_distance": [1.288396954536438, 1.3328770399093628, 1.28602933883667,
                         1.2561291456222534, 1.2787736654281616, 1.359168291091919],
        "clean_distance": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    },
    "one_step_warmup": {
        "loss": 1.4467613697052002, "grad_norm": 5.01383016826985,
        "adv_distance": [1.652147650718689, 1.6731821298599243, 1.7407459020614624,
                         1.6241307258605957, 1.6201822757720947, 1.7882781028747559],
        "clean_distance": [0.09999997168779373, 0.09999997913837433, 0.09999998658895493,
                           0.09999998658895493, 0.10000000149011612, 0.09999997913837433],
    },
    "maxnorm": {
        "loss": 1.6807657480239868, "grad_norm": 5.0008536330944935,
        "adv_distance": [1.4446197748184204, 1.4466934204101562, 1.4786595106124878,
                         1.4382249116897583, 1.433767557144165, 1.4585292339324951],
        "clean_distance": [0.29999998211860657, 0.30000001192092896, 0.29999998211860657,
                           0.29999998211860657, 0.29999998211860657, 0.29999998211860657],
    },
}
WARMUP_EPOCHS = 10  # W of the golden cases: factor w_e = (e + 1)/10


class FixedNoise:
    """A noise whose draws are given in advance (the ones the golden script injects)."""

    def __init__(self, draws):
        self._draws = iter(draws)

    def sample(self, like, generator=None):
        draw = next(self._draws)
        assert draw.shape == like.shape
        return draw


def context(model) -> EpochContext:
    return EpochContext(WARMUP_EPOCHS, model, None, Gaussian(0.25))


def golden_method(c: dict, model):
    """The method of golden case ``c``, at the epoch whose warm-up factor is the case's."""
    method = build_method(
        "smoothmix", num_noise=c["m"], num_steps=c["steps"], alpha=c["alpha"], eta=c["eta"],
        mix_step=c["mix_step"], maxnorm=c["maxnorm"], maxnorm_s=c["maxnorm_s"],
        warmup_epochs=WARMUP_EPOCHS)
    epoch = round(c["warmup"] * WARMUP_EPOCHS) - 1
    method.on_epoch_start(epoch, context(model))
    assert method.warmup_at(epoch) == c["warmup"]
    return method


def grad_norm(model) -> float:
    return math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()))


# --------------------------------------------------------------------------- golden values
@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_loss_and_its_gradient_match_the_authors_code(case):
    c, expected = golden.CASES[case], GOLDEN[case]
    model, x, y, eps, _ = golden.inputs(c["m"])
    model.train()
    out = golden_method(c, model).loss(
        model, x, y, FixedNoise([e * c["sigma"] for e in eps]),
        torch.Generator().manual_seed(3))  # λ = u/2: the generator's first draw, as u
    out["loss"].backward()
    assert out["loss"].item() == pytest.approx(expected["loss"], rel=1e-6)
    assert grad_norm(model) == pytest.approx(expected["grad_norm"], rel=1e-6)
    assert out["mix_weight"].item() == pytest.approx(c["eta"] * c["warmup"])


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_adversary_and_clean_side_match_the_authors_attack(case):
    c, expected = golden.CASES[case], GOLDEN[case]
    model, x, y, eps, _ = golden.inputs(c["m"])
    clean, adv = golden_method(c, model).adversaries(model, x, y, eps * c["sigma"])
    torch.testing.assert_close((adv - x).flatten(1).norm(dim=1),
                               torch.tensor(expected["adv_distance"]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close((clean - x).flatten(1).norm(dim=1),
                               torch.tensor(expected["clean_distance"]), rtol=1e-5, atol=1e-6)


# With BatchNorm: the same cases and inputs, the model of ``golden.bn_inputs`` (its BatchNorm's
# running statistics set apart from any batch's, so that the eval-mode attack and the train-mode
# losses normalise differently). Computed by `python tools/golden/smoothmix_golden.py /tmp/smix_ref
# --batchnorm` (torch 2.14.1 CPU; its ``bn_inputs``), on their code/train.py at blob d7aeea1b (also
# alinlab/smoothing-catrs code/train_smoothmix.py @ d4bc576): one step of their ``train()``,
# then the BatchNorm's running mean and variance. Their step runs the attack in eval mode (the
# statistics untouched) and two train-mode forward passes, the m clean copies together and the
# m mixed copies together, so the statistics move twice (num_batches_tracked = 2) and each
# normalisation is over m·B rows: what ours must do too.
GOLDEN_BN = {
    "plain": {
        "loss": 4.720727443695068, "grad_norm": 23.697264827058838,
        "running_mean": [
            -0.446639419, -0.399430096, -0.349745661, -0.305499256, -0.210421324, 0.00999937207,
            -0.0606325269, 0.0048077479, 0.0180083327, 0.0716684684, 0.188392982, 0.197526723,
            0.23221837, 0.348732322, 0.336102486, 0.398959577,
        ],
        "running_var": [
            0.418060929, 0.492583543, 0.587798834, 0.656217575, 0.736533046, 0.823700011,
            0.894452512, 0.985009849, 1.06245887, 1.15126216, 1.23164821, 1.30257046,
            1.38354397, 1.46351719, 1.54405892, 1.62831604,
        ],
    },
    "one_step_warmup": {
        "loss": 3.132204055786133, "grad_norm": 11.126857661171572,
        "running_mean": [
            -0.451221287, -0.403014272, -0.36250478, -0.306690097, -0.210851073, 0.0232125074,
            -0.0632299334, -0.00131489988, 0.0192556307, 0.0727924109, 0.185044914, 0.196702763,
            0.231453896, 0.358415723, 0.34268555, 0.40015012,
        ],
        "running_var": [
            0.427542359, 0.499461591, 0.598958254, 0.667721152, 0.752938211, 0.833557546,
            0.899602175, 1.00178623, 1.06836212, 1.16588485, 1.25562894, 1.3105545,
            1.39051831, 1.47126091, 1.56289983, 1.63529944,
        ],
    },
    "maxnorm": {
        "loss": 3.9732789993286133, "grad_norm": 14.385959626648448,
        "running_mean": [
            -0.450051039, -0.401833057, -0.348371267, -0.305918068, -0.208799154, -0.00110428035,
            -0.0641713664, -0.000997102819, 0.0157901607, 0.0727022663, 0.186773092, 0.202712685,
            0.23528485, 0.345919251, 0.335697562, 0.399741083,
        ],
        "running_var": [
            0.421894819, 0.492893189, 0.586021304, 0.655121744, 0.737297118, 0.821080148,
            0.894715309, 0.985686421, 1.06157064, 1.15274024, 1.23295963, 1.30396116,
            1.38331485, 1.4635483, 1.54361916, 1.62908006,
        ],
    },
}


@pytest.mark.parametrize("case", sorted(GOLDEN_BN))
def test_with_batchnorm_the_loss_gradient_and_running_statistics_match_the_authors(case):
    c, expected = golden.CASES[case], GOLDEN_BN[case]
    model, x, y, eps, _ = golden.bn_inputs(c["m"])
    model.train()
    out = golden_method(c, model).loss(
        model, x, y, FixedNoise([e * c["sigma"] for e in eps]), torch.Generator().manual_seed(3))
    out["loss"].backward()
    assert out["loss"].item() == pytest.approx(expected["loss"], rel=1e-5)
    assert grad_norm(model) == pytest.approx(expected["grad_norm"], rel=1e-5)
    bn = model[2]
    assert int(bn.num_batches_tracked) == 2 and model.training
    torch.testing.assert_close(bn.running_mean, torch.tensor(expected["running_mean"]),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_var, torch.tensor(expected["running_var"]),
                               rtol=1e-5, atol=1e-6)


def test_golden_inputs_exercise_both_sides_of_the_mask():
    """The golden numbers test the mask only if some inputs are and some are not classified
    correctly by the soft smoothed classifier, with no near-tie a rounding could flip."""
    for case in GOLDEN:
        c = golden.CASES[case]
        model, x, y, eps, _ = golden.inputs(c["m"])
        method = golden_method(c, model)
        clean, _ = method.adversaries(model, x, y, eps * c["sigma"])
        p_bar = torch.stack([F.softmax(model(clean + e * c["sigma"]), -1) for e in eps]).mean(0)
        top2 = p_bar.topk(2, dim=-1).values
        correct = (p_bar.argmax(-1) == y).sum().item()
        assert 0 < correct < len(y) and (top2[:, 0] - top2[:, 1]).min() > 1e-3


# --------------------------------------------------------------------------- closed forms
B, SIGMA = 6, 0.25


def setup(m: int = 3, seed: int = 7):
    model, x, y, _, _ = golden.inputs(1)
    gen = torch.Generator().manual_seed(seed)
    noises = draw_noises(Gaussian(SIGMA), x, m, gen)  # the loss's own first m draws
    lam = torch.rand(B, generator=gen) / 2  # and its next one
    return model.train(), x, y, noises, lam


def run(method, model, x, y, seed: int = 7):
    return method.loss(model, x, y, Gaussian(SIGMA), torch.Generator().manual_seed(seed))


def test_eta_zero_leaves_the_noisy_cross_entropy_of_m_copies():
    model, x, y, noises, _ = setup()
    out = run(build_method("smoothmix", num_noise=3, eta=0.0), model, x, y)
    per_copy = [F.cross_entropy(model(x + n), y) for n in noises]
    torch.testing.assert_close(out["loss"], torch.stack(per_copy).mean(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out["logits"], model(x + noises[0]), rtol=1e-6, atol=1e-6)
    assert out["mixup"] > 0 and out["adv_distance"] > 0  # still computed and logged


@pytest.mark.parametrize("hparams", [{"num_steps": 0}, {"alpha": 0.0}], ids=["T=0", "alpha=0"])
def test_without_an_attack_the_mixup_is_between_x_and_itself(hparams):
    """x̂ = x_s = x, so the mixup term is KL((1 − λ)p̄ + λu ‖ softmax f(x + δ_j)), written here
    with F.kl_div as the authors do."""
    model, x, y, noises, lam = setup()
    out = run(build_method("smoothmix", num_noise=3, eta=5.0, **hparams), model, x, y)
    logits = torch.stack([model(x + n) for n in noises])  # (m, B, C)
    p_bar = F.softmax(logits, -1).mean(0)
    target = (1 - lam[:, None]) * p_bar + lam[:, None] * torch.full((10,), 0.1)
    kl = torch.stack([F.kl_div(F.log_softmax(z, -1), target, reduction="none").sum(1)
                      for z in logits])
    mixup = ((p_bar.argmax(1) == y).float() * kl).mean()
    ce = F.cross_entropy(logits.flatten(0, 1), y.repeat(3))
    assert out["adv_distance"].item() == 0
    torch.testing.assert_close(out["mixup"], mixup, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out["loss"], ce + 5.0 * mixup, rtol=1e-6, atol=1e-6)


def test_a_batch_the_smoothed_classifier_gets_wrong_is_trained_by_cross_entropy_alone():
    model, x, _, _, _ = setup()
    y = torch.full((B,), 3)  # golden.inputs' model predicts class 1 everywhere
    out = run(build_method("smoothmix", num_noise=3, eta=5.0), model, x, y)
    assert out["mixup_share"].item() == 0 and out["mixup"].item() == 0
    assert out["loss"].item() == out["ce"].item()


def test_mixup_loss_closed_forms():
    gen = torch.Generator().manual_seed(0)
    p_bar = F.softmax(torch.randn(4, 5, generator=gen), -1)
    log_q = F.log_softmax(torch.randn(2, 4, 5, generator=gen), -1)
    zero, ones = torch.zeros(4), torch.ones(4)
    # λ = 0 and q = p̄: the target is p̄ itself
    assert smoothmix_mixup_loss(p_bar.log().expand(2, 4, 5), p_bar, zero, ones).abs() < 1e-6
    # λ = ½ and p̄ = u: the target is u, KL(u ‖ q) = −log C − (1/C) Σ_c log q_c
    uniform = torch.full((4, 5), 0.2)
    torch.testing.assert_close(smoothmix_mixup_loss(log_q, uniform, ones / 2, ones),
                               (-math.log(5) - log_q.mean(-1)).mean())
    # masked inputs count in the mean's denominator (m·B rows), not in its sum
    mask = torch.tensor([1.0, 0.0, 0.0, 0.0])
    full = F.kl_div(log_q[:, 0], p_bar[0].expand(2, 5), reduction="none").sum(-1)
    torch.testing.assert_close(smoothmix_mixup_loss(log_q, p_bar, zero, mask), full.sum() / 8)


def test_the_target_is_not_detached():
    """As in the authors' code the gradient reaches p̄ through ŷ (the golden gradient norms
    depend on it): here p̄ is a leaf and receives one."""
    gen = torch.Generator().manual_seed(0)
    p_bar = F.softmax(torch.randn(4, 5, generator=gen), -1).requires_grad_(True)
    log_q = F.log_softmax(torch.randn(2, 4, 5, generator=gen), -1)
    smoothmix_mixup_loss(log_q, p_bar, torch.full((4,), 0.25), torch.ones(4)).backward()
    assert p_bar.grad is not None and p_bar.grad.abs().sum() > 0


# --------------------------------------------------------------------------- the adversary
def attack(model, x, y, noises, **kwargs):
    return smoothmix_attack(model, x, y, noises, **{"num_steps": 3, "alpha": 0.3, **kwargs})


def test_each_step_moves_by_alpha_without_a_norm_restriction():
    model, _, y, noises, _ = setup()
    x = torch.full((B, 1, 8, 8), 0.5)  # far enough from 0 and 1 that no clamp acts
    for steps in (1, 2, 3):
        _, adv = attack(model, x, y, noises, num_steps=steps)
        distance = (adv - x).flatten(1).norm(dim=1)
        assert (distance <= steps * 0.3 + 1e-6).all()
        if steps == 1:
            torch.testing.assert_close(distance, torch.full((B,), 0.3))


def test_the_adversary_raises_the_soft_smoothed_loss():
    model, x, y, noises, _ = setup()
    _, adv = attack(model.eval(), x, y, noises)
    with torch.no_grad():
        loss = [-soft_smoothed_log_prob(torch.stack([model(z + n) for n in noises]), y)
                for z in (x, adv)]
    assert (loss[1] > loss[0]).all()
    assert adv.min() >= 0 and adv.max() <= 1


def test_maxnorm_restricts_the_adversary_and_maxnorm_s_the_clean_side():
    model, x, y, noises, _ = setup()
    clean, adv = attack(model, x, y, noises, num_steps=4, alpha=1.0, mix_step=2, maxnorm=0.7,
                        maxnorm_s=0.2)
    assert ((adv - x).flatten(1).norm(dim=1) <= 0.7 + 1e-6).all()
    assert ((clean - x).flatten(1).norm(dim=1) <= 0.2 + 1e-6).all()


def test_the_clean_side_is_x_or_the_adversary_after_mix_step_steps():
    model, x, y, noises, _ = setup()
    clean, _ = attack(model, x, y, noises, mix_step=0)
    assert torch.equal(clean, x)
    _, first = attack(model, x, y, noises, num_steps=1)
    clean, adv = attack(model, x, y, noises, mix_step=1, maxnorm_s=None)
    assert torch.equal(clean, first) and not torch.equal(adv, first)


def test_attack_in_eval_mode_losses_in_train_mode():
    class Recorder(nn.Module):
        def __init__(self):
            super().__init__()
            self.net, self.modes = golden.inputs(1)[0], []

        def forward(self, z):
            self.modes.append(self.training)
            return self.net(z)

    model, (_, x, y, _, _) = Recorder().train(), setup()
    run(build_method("smoothmix", num_noise=2, num_steps=3), model, x, y)
    assert model.modes == [False] * 3 + [True] * 2 and model.training  # 3 steps, clean, mix


# --------------------------------------------------------------------------- warm-up
def test_warmup_factor_grows_linearly_over_the_first_epochs():
    method = build_method("smoothmix", eta=5.0, mix_step=1, alpha=0.5)
    assert [method.warmup_at(e) for e in (0, 4, 9, 30)] == [0.1, 0.5, 1.0, 1.0]
    for w in (0, 1):
        assert build_method("smoothmix", warmup_epochs=w).warmup_at(0) == 1.0
    assert method.mix_weight == 5.0 and method.clean_side_radius == 0.5  # outside a trainer
    method.on_epoch_start(1, context(None))
    assert method.mix_weight == pytest.approx(1.0)
    assert method.clean_side_radius == pytest.approx(0.1)
    assert method.state_dict() == {}  # the epoch alone determines it


def test_a_resumed_method_recomputes_the_warmup_from_the_epoch():
    model, x, y, _, _ = setup()
    hparams = dict(num_noise=2, num_steps=2, eta=5.0, mix_step=1, alpha=0.5)
    trained = build_method("smoothmix", **hparams)
    for epoch in range(4):
        trained.on_epoch_start(epoch, context(model))
    resumed = build_method("smoothmix", **hparams)
    resumed.load_state_dict(trained.state_dict())
    resumed.on_epoch_start(3, context(model))
    a, b = run(trained, model, x, y), run(resumed, model, x, y)
    assert a["loss"].item() == b["loss"].item() and a["mix_weight"].item() == pytest.approx(2.0)
    assert run(build_method("smoothmix", **hparams), model, x, y)["loss"] != a["loss"]


def test_per_sample_sigma_draws_each_input_at_its_own_sigma():
    model, x, y, _, _ = setup()
    sigma = torch.linspace(0.1, 0.6, B)
    out = build_method("smoothmix", num_noise=2, eta=0.0).loss(
        model, x, y, Gaussian(sigma), torch.Generator().manual_seed(7))
    noises = draw_noises(Gaussian(sigma), x, 2, torch.Generator().manual_seed(7))
    expected = torch.stack([F.cross_entropy(model(x + n), y) for n in noises]).mean()
    torch.testing.assert_close(out["loss"], expected, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- hyperparameters
@pytest.mark.parametrize(
    "hparams, match",
    [
        ({"num_noise": 0}, "num_noise.*>= 1"),
        ({"num_steps": -1}, "num_steps.*>= 0"),
        ({"num_steps": 2.0}, "num_steps"),
        ({"alpha": -0.5}, "alpha.*>= 0"),
        ({"alpha": float("inf")}, "alpha"),
        ({"eta": float("nan")}, "eta"),
        ({"eta": True}, "eta"),
        ({"mix_step": -1}, "mix_step.*>= 0"),
        ({"mix_step": 8, "num_steps": 8}, "mix_step must be 0 or less than num_steps"),
        ({"maxnorm": -1.0}, "maxnorm.*>= 0"),
        ({"maxnorm_s": "far"}, "maxnorm_s must be a number or null"),  # "1" is read as 1.0
        ({"warmup_epochs": -1}, "warmup_epochs.*>= 0"),
        ({"epsilon": 1.0}, "unknown hyperparameter.*epsilon.*valid: num_noise"),
    ],
)
def test_bad_hparams_raise(hparams, match):
    with pytest.raises(SmoothcertError, match=match):
        build_method("smoothmix", **hparams)


def test_defaults_are_the_authors_code_defaults_with_mnist_m():
    assert build_method("smoothmix").hparams() == {
        "num_noise": 4, "num_steps": 8, "alpha": 1.0, "eta": 1.0, "mix_step": 0,
        "maxnorm": None, "maxnorm_s": None, "warmup_epochs": 10}


# --------------------------------------------------------------------------- CLI
# 128 balanced digits: two steps an epoch are enough to see the warm-up and the resume, and the
# attack's T steps on m noises per input make every step costly.
TRAIN = ["train", "--method", "smoothmix", "--dataset", "digits", "--arch", "digits_cnn",
         "--sigma", "0.25", "--batch", "64", "--train-size", "128", "--no-progress",
         "--device", "cpu"]


def test_trains_from_the_cli(tmp_path):
    assert main([*TRAIN, "--epochs", "1", "--out", str(tmp_path)]) == 0
    meta = load_checkpoint(tmp_path / "checkpoint.pt").meta
    assert meta["method"] == {"name": "smoothmix", "hparams": build_method("smoothmix").hparams()}
    header, row = (tmp_path / "log.tsv").read_text().splitlines()
    values = dict(zip(header.split("\t"), row.split("\t")))
    assert float(values["mix_weight"]) == pytest.approx(0.1)  # epoch 1 of a 10-epoch warm-up
    assert all(math.isfinite(float(values[k])) for k in ("loss", "ce", "mixup", "adv_distance"))


def test_resumed_after_one_of_two_epochs_equals_the_straight_run(tmp_path, monkeypatch):
    """The warm-up factor of epoch 2 (0.2) must come back after the resume for the weights to
    agree."""
    args = [*TRAIN, "--epochs", "2", "--param", "num_steps=2", "--param", "num_noise=2"]
    assert main([*args, "--out", str(tmp_path / "straight")]) == 0
    real_save = train_module._save

    def save_then_crash(path, trainer):
        real_save(path, trainer)
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "_save", save_then_crash)
    assert main([*args, "--out", str(tmp_path / "resumed")]) == 130  # interrupted after epoch 1
    monkeypatch.undo()
    assert main([*args, "--out", str(tmp_path / "resumed"), "--resume"]) == 0
    straight, resumed = (load_checkpoint(tmp_path / d / "checkpoint.pt")
                         for d in ("straight", "resumed"))
    assert resumed.meta["epoch"] == straight.meta["epoch"] == 2
    for key, value in straight.state_dict.items():
        torch.testing.assert_close(resumed.state_dict[key], value, rtol=0, atol=1e-6)
