"""CAT-RS (smoothcert.methods.catrs): golden values from the authors' code, closed forms of the
loss, the KL attack, the teacher's smoothed prediction, the ε schedule, bad hyperparameters, the
recipes, and training from the CLI (with a resume)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from smoothcert import Gaussian, SmoothcertError
from smoothcert.cli.app import main
from smoothcert.methods import EpochContext, build_method
from smoothcert.methods.catrs import catrs_loss, kl_pgd
from smoothcert.models.checkpoint import load_checkpoint
from smoothcert.smoothing.attacks import draw_noises
from smoothcert.training import TrainConfig
from smoothcert.training.optim import OPTIMIZERS, SCHEDULES
from smoothcert.training.recipes import load_recipe

F64 = torch.float64
CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# --------------------------------------------------------------------------- golden values
# The cases and their inputs are those of tools/golden/catrs_golden.py, loaded from that file
# so that the values below and the inputs they were computed from cannot drift apart.
_spec = importlib.util.spec_from_file_location(
    "catrs_golden", Path(__file__).resolve().parents[2] / "tools" / "golden" / "catrs_golden.py")
_golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_golden)
CASES = _golden.CASES  # name: (m, b, σ, ε, T, λ, confidence_mask, seed)
golden_inputs = _golden.golden_inputs  # (model, x, y, z, u, ŷ) of a case
# Per chunk of m·b loaded examples, from the authors' train() (see the test's docstring).
GOLDEN = {
    "votes": {
        "loss": [0.65729722447, 0.513122516065, 1.712694448212, 0.465449708965],
        "low": [0.65729722447, 0.513122516065, 1.082595635764, 0.465449708965],
        "grad_norm": [0.73552638033, 0.55276700749, 1.576544518481, 0.557273663906],
        "k": [[3, 1, 2, 1, 1, 1], [1, 1, 2, 1, 1, 1], [4, 1, 1, 3, 4, 1], [1, 1, 1, 1, 1, 1]],
    },
    "mask": {
        "loss": [1.074425571684, 2.229312685863],
        "low": [1.074425571684, 1.688517166569],
        "grad_norm": [1.2478901917, 2.825862095331],
        "k": [[1, 1, 1, 1, 1], [2, 1, 1, 1, 2]],
    },
}


@pytest.mark.parametrize("name", CASES)
def test_loss_matches_the_authors_code(name):
    """Golden values computed by ``python tools/golden/catrs_golden.py CHECKOUT`` with CHECKOUT a
    checkout of github.com/alinlab/smoothing-catrs at d4bc576e7d373d158f087ba5744af8bb48466bb7:
    it imports their ``code/train_catrs.py`` and runs its ``train()`` (with ``KL_PGD(steps=T,
    max_norm=ε)``, ``--num-noise-vec m --lbd λ [--confidence_mask]``) on one loaded batch of
    m·b examples (x, y, ŷ) of :func:`golden_inputs` (float64), which it splits into m chunks of
    b. Their noise draws ``torch.randn_like`` return z[chunk, copy], ``Binomial(m, p).sample()``
    returns the number of u[chunk] (b, m) below p, ``AverageMeter`` records the loss and the mean
    of L^low per chunk, and an optimizer stand-in records the gradient norm without changing
    the weights (BatchNorm's running statistics move from chunk to chunk, as in their loop).
    Case "votes": m=4, b=6, σ=0.5, ε=1.0, T=4, λ=1, K from the hard votes; case "mask": m=2,
    b=5, σ=0.25, ε=0.5, T=2, λ=0.5, ``--confidence_mask`` (K from ŷ_y). Both cases have inputs
    with K = m (the worst-case term on) and K < m. Ours agreed with theirs to the last printed
    digit (difference 0.0 in float64, torch 2.14.1 CPU)."""
    m, b, sigma, eps, steps, lbd, mask, _ = CASES[name]
    model, x, y, z, u, target = golden_inputs(name)
    for c in range(m):
        rows = slice(c * b, (c + 1) * b)
        out = catrs_loss(model, x[rows], y[rows], sigma * z[c], u[c], target=target[rows],
                         epsilon=eps, num_steps=steps, lbd=lbd, confidence_mask=mask)
        out["loss"].backward()
        grad_norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
        model.zero_grad(set_to_none=True)
        golden = GOLDEN[name]
        assert out["loss"].item() == pytest.approx(golden["loss"][c], rel=1e-9)
        assert out["low"].item() == pytest.approx(golden["low"][c], rel=1e-9)
        assert grad_norm.item() == pytest.approx(golden["grad_norm"][c], rel=1e-9)
        full = sum(k == m for k in golden["k"][c]) / b
        assert out["high_fraction"].item() == pytest.approx(full)


# --------------------------------------------------------------------------- closed forms
M, B, C = 3, 5, 10


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, C)).double()


def inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(B, 1, 8, 8, generator=gen, dtype=F64)
    y = torch.randint(C, (B,), generator=gen)
    noises = 0.5 * torch.randn(M, B, 1, 8, 8, generator=gen, dtype=F64)
    u = torch.rand(B, M, generator=gen, dtype=F64)
    target = torch.softmax(2 * torch.randn(B, C, generator=gen, dtype=F64), dim=1)
    return x, y, noises, u, target


def per_copy(model, x, y, noises):
    """CE (M, B) and logits (M, B, C) of the noisy copies x + δ_j, computed one copy at a time."""
    logits = torch.stack([model(x + d) for d in noises])
    ce = torch.stack([F.cross_entropy(lj, y, reduction="none") for lj in logits])
    return ce, logits


def test_without_attack_steps_the_loss_is_the_closed_form():
    model, (x, y, noises, u, target) = tiny_model(), inputs()
    out = catrs_loss(model, x, y, noises, u, target=target, epsilon=1.0, num_steps=0, lbd=2.0)
    ce, logits = per_copy(model, x, y, noises)
    p_hat = (logits.argmax(dim=2) == y).double().mean(dim=0)
    k = (u < p_hat[:, None]).sum(dim=1).clamp(min=1)
    low = torch.stack([ce[:, i].sort().values[: k[i]].sum() / M for i in range(B)])
    kl = torch.stack([F.kl_div(F.log_softmax(lj, 1), target, reduction="none").sum(1)
                      for lj in logits])
    expected = (low + 2.0 * (k == M) * kl.max(dim=0).values).mean()
    torch.testing.assert_close(out["loss"], expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(out["logits"], logits[0], rtol=1e-12, atol=0)


def test_epsilon_zero_leaves_the_noise_where_it_was_drawn():
    model, (x, y, noises, u, target) = tiny_model(), inputs(1)
    torch.testing.assert_close(kl_pgd(model, x, noises, target, 0.0, 3), noises,
                               rtol=0, atol=1e-12)
    still = catrs_loss(model, x, y, noises, u, target=target, epsilon=0.0, num_steps=3, lbd=1.0)
    none = catrs_loss(model, x, y, noises, u, target=target, epsilon=1.0, num_steps=0, lbd=1.0)
    torch.testing.assert_close(still["loss"], none["loss"], rtol=1e-10, atol=0)


def test_confident_inputs_train_on_every_copy_plus_the_worst_case():
    """ŷ = onehot(y) with ``confidence_mask``: p̂ = 1, so K = m for every input and, without
    attack steps, L = (1/m) Σ_j CE_j + λ·max_j CE_j (KL from a one-hot is the cross-entropy)."""
    model, (x, y, noises, u, _) = tiny_model(), inputs(2)
    onehot = F.one_hot(y, C).double()
    out = catrs_loss(model, x, y, noises, u, target=onehot, epsilon=1.0, num_steps=0, lbd=0.5,
                     confidence_mask=True)
    ce, _ = per_copy(model, x, y, noises)
    expected = (ce.mean(dim=0) + 0.5 * ce.max(dim=0).values).mean()
    torch.testing.assert_close(out["loss"], expected, rtol=1e-12, atol=0)
    assert out["high_fraction"].item() == 1.0


@pytest.mark.parametrize("lbd", [0.0, 5.0])
def test_unconfident_inputs_train_on_their_easiest_copy_only(lbd):
    """ŷ_y = 0 with ``confidence_mask``: K = max(1, 0) = 1, so L = (1/m)·min_j CE_j whatever λ."""
    model, (x, y, noises, u, _) = tiny_model(), inputs(3)
    elsewhere = F.one_hot((y + 1) % C, C).double()
    out = catrs_loss(model, x, y, noises, u, target=elsewhere, epsilon=1.0, num_steps=2,
                     lbd=lbd, confidence_mask=True)
    ce, _ = per_copy(model, x, y, noises)
    torch.testing.assert_close(out["loss"], (ce.min(dim=0).values / M).mean(), rtol=1e-12,
                               atol=0)
    assert out["high"].item() == 0.0 and out["high_fraction"].item() == 0.0


def test_the_self_target_is_the_detached_mean_softmax_of_the_clean_copies():
    model, (x, y, noises, u, _) = tiny_model(), inputs(4)
    p_bar = torch.stack([model(x + d).softmax(dim=1) for d in noises]).mean(dim=0).detach()
    grads = []
    for target in (None, p_bar):
        out = catrs_loss(model, x, y, noises, u, target=target, epsilon=1.0, num_steps=2,
                         lbd=1.0)
        grads.append(torch.autograd.grad(out["loss"], list(model.parameters())))
        grads[-1] = (out["loss"].detach(), *grads[-1])
    for mine, explicit in zip(*grads):
        torch.testing.assert_close(mine, explicit, rtol=1e-10, atol=1e-12)


def test_the_attack_raises_the_kl_and_keeps_each_noise_row_mean():
    model, (x, _, noises, _, target) = tiny_model(), inputs(5)

    def objective(delta):
        with torch.no_grad():
            log_q = torch.stack([F.log_softmax(model(x + d), dim=1) for d in delta])
        return F.kl_div(log_q, target.expand_as(log_q), reduction="none").sum(-1).mean(0)

    for eps, steps in ((0.05, 1), (1.0, 4)):
        adv = kl_pgd(model, x, noises, target, eps, steps)
        assert (objective(adv) > objective(noises)).all()
        torch.testing.assert_close(adv.flatten(2).mean(2), noises.flatten(2).mean(2),
                                   rtol=0, atol=1e-12)
        ratio = adv.flatten(2).norm(dim=2) / noises.flatten(2).norm(dim=2)
        assert ((ratio - 1).abs() < 0.01).all()  # the noise keeps (nearly) its norm
    assert kl_pgd(model, x, noises, target, 1.0, 0) is noises


def test_the_model_is_in_eval_mode_during_the_attack_and_back_in_train_mode_after():
    modes = []
    model = tiny_model()
    model[1].register_forward_hook(lambda mod, inp, out: modes.append(mod.training))
    x, y, noises, u, target = inputs(6)
    catrs_loss(model, x, y, noises, u, target=target, epsilon=1.0, num_steps=2, lbd=1.0)
    assert modes == [True, False, False, True] and model.training


# --------------------------------------------------------------------------- the method
def context(model, num_epochs: int = 10) -> EpochContext:
    return EpochContext(num_epochs, model, None, Gaussian(0.25),
                        generator=torch.Generator().manual_seed(5), device=torch.device("cpu"))


def test_the_method_draws_from_its_generator_in_the_documented_order():
    model, (x, y, *_) = tiny_model(), inputs(7)
    method = build_method("catrs", num_noise=M, lbd=1.5, num_steps=2, epsilon=0.5, target="self")
    noise = Gaussian(0.25)
    state = torch.get_rng_state()
    out = method.loss(model, x, y, noise, torch.Generator().manual_seed(3))
    assert torch.equal(torch.get_rng_state(), state)  # nothing from the global generator
    gen = torch.Generator().manual_seed(3)
    noises = draw_noises(noise, x, M, gen)
    u = torch.rand((B, M), generator=gen, dtype=F64)
    expected = catrs_loss(model, x, y, noises, u, target=None, epsilon=0.5, num_steps=2, lbd=1.5)
    torch.testing.assert_close(out["loss"], expected["loss"], rtol=0, atol=0)
    assert set(out) == {"loss", "logits", "low", "high", "high_fraction", "epsilon"}


def test_a_per_sample_sigma_noises_every_copy_of_input_i_at_sigma_i():
    model, (x, y, *_) = tiny_model(), inputs(9)
    sigma = torch.tensor([0.1, 0.2, 0.4, 0.8, 1.6], dtype=F64)
    method = build_method("catrs", num_noise=M, num_steps=1, target="self")
    out = method.loss(model, x, y, Gaussian(sigma), torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(2)
    noises = draw_noises(Gaussian(sigma), x, M, gen)
    ratio = noises.flatten(2).std(dim=2) / sigma  # (M, B): each row drawn at its own σ_i
    assert ((ratio - 1).abs() < 0.3).all()
    u = torch.rand((B, M), generator=gen, dtype=F64)
    expected = catrs_loss(model, x, y, noises, u, target=None, epsilon=1.0, num_steps=1, lbd=1.0)
    torch.testing.assert_close(out["loss"], expected["loss"], rtol=0, atol=0)


def test_double_epsilon_epoch_is_recomputed_at_every_epoch_start():
    method = build_method("catrs", epsilon=0.5, double_epsilon_epoch=3, target="self")
    assert [method.epsilon_at(e) for e in range(5)] == [0.5, 0.5, 0.5, 1.0, 1.0]
    resumed = build_method("catrs", epsilon=0.5, double_epsilon_epoch=3,  # as after a resume
                           target="self")
    resumed.on_epoch_start(4, context(tiny_model()))
    assert resumed.current_epsilon == 1.0 and resumed.state_dict() == {}
    x, y, *_ = inputs()
    out = resumed.loss(tiny_model(), x, y, Gaussian(0.25), torch.Generator().manual_seed(0))
    assert out["epsilon"].item() == 1.0
    never = build_method("catrs", epsilon=0.5, target="self")
    never.on_epoch_start(1000, context(tiny_model()))
    assert never.current_epsilon == 0.5


# The teacher's ŷ table, its lookup by index and its resume: tests/methods/test_catrs_teacher.py.


# --------------------------------------------------------------------------- hyperparameters
@pytest.mark.parametrize(
    "hparams, match",
    [
        ({"num_noise": 0}, "num_noise must be an integer >= 1"),
        ({"epsilon": -0.1}, "epsilon must be a finite number >= 0"),
        ({"num_steps": -1}, "num_steps must be an integer >= 0"),
        ({"num_steps": 2.5}, "num_steps must be an integer"),
        ({"lbd": float("nan")}, "lbd must be a finite number >= 0"),
        ({"confidence_mask": 1}, "confidence_mask must be true or false"),
        ({"double_epsilon_epoch": -2}, "double_epsilon_epoch must be an integer >= 0"),
        ({"target": "nope"}, "target must be one of teacher, self"),
        ({}, "needs --param teacher_checkpoint=PATH .*: train the teacher with the gaussian "
             "method.*or choose the named variant --param target=self"),
        ({"target": "self", "teacher_checkpoint": "t.pt"}, "only read with target='teacher'"),
        ({"teacher_checkpoint": ""}, "teacher_checkpoint must be a path"),
        ({"teacher_sigma": 0.0, "teacher_checkpoint": "t.pt"},
         "teacher_sigma must be a positive finite number"),
        ({"teacher_draws": 0, "teacher_checkpoint": "t.pt"},
         "teacher_draws must be an integer >= 1"),
        ({"teacher_draws": 40_000, "teacher_checkpoint": "t.pt"},
         "teacher_draws must be at most 32767"),  # counts are kept as int16
        ({"eps": 1.0}, "unknown hyperparameter.*eps"),
    ],
)
def test_bad_hyperparameters_are_refused(hparams, match):
    with pytest.raises(SmoothcertError, match=match):
        build_method("catrs", **hparams)


# The authors' lr in epoch e (0-based) of their 150-epoch runs: StepLR(step_size=50, γ=0.1)
# stepped as ``scheduler.step(epoch)`` after epoch e, so epoch e runs at lr·γ^(max(e − 1, 0) // 50):
# the decays land on epochs 51 and 101, where their logs' training loss drops
# (data/fmnist/noise_0.25/cat-rs/log.txt: 0.138 → 0.132 at 51, 0.126 → 0.125 at 101;
# data/cifar10/noise_0.25/cat-rs/log.txt: 0.306 → 0.271 at 51, 0.166 → 0.134 at 101; their lr
# column, get_lr(), prints γ² at those two epochs, an artefact of calling it after step(epoch)).
def authors_lr(base: float, epoch: int) -> float:
    return base * 0.1 ** (max(epoch - 1, 0) // 50)


def recipe_lrs(config) -> list[float]:
    """The lr of each epoch of ``config`` as the trainer runs it: read at the epoch's start, the
    schedule stepped once after it."""
    model = nn.Linear(1, 1)
    optimizer = OPTIMIZERS[config.optimizer](model.parameters(), config)
    schedule = SCHEDULES[config.lr_schedule](optimizer, config)
    lrs = []
    for _ in range(config.epochs):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return lrs


def catrs_recipes():
    return [p for d in ("mnist", "fashion-mnist", "cifar10")
            for p in sorted((CONFIGS / d).glob("catrs_s*.yaml"))]


TEACHER_RECIPES = sorted(CONFIGS.glob("*/gaussian_teacher_*.yaml"))


@pytest.mark.parametrize("path", catrs_recipes() + TEACHER_RECIPES,
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_recipes_lr_in_every_epoch_is_the_authors(path):
    """CAT-RS and its teacher (their train_cohen.py --lr_step_size 50 --epochs 150): 150 epochs,
    lr 0.01 (MNIST family) or 0.1 (CIFAR-10), × 0.1 from epochs 51 and 101."""
    config = TrainConfig.from_dict(load_recipe(path))
    base = 0.1 if config.dataset == "cifar10" else 0.01
    assert config.epochs == 150
    expected = [authors_lr(base, e) for e in range(150)]
    assert recipe_lrs(config) == pytest.approx(expected, rel=1e-12)


def test_the_recipes_carry_the_authors_values():
    """λ per σ on CIFAR-10 (EXPERIMENTS.MD), λ = 1 on the MNIST family; m = 4, ε = 1, T = 4 and
    one SGD step per 256/m = 64 inputs everywhere; ŷ from the dataset's Gaussian σ = 0.25
    teacher recipe with the authors' N = 10,000 votes."""
    lbd = {"cifar10": {0.25: 0.5, 0.5: 1.0, 1.0: 2.0}}
    for path in catrs_recipes():
        config = TrainConfig.from_dict(load_recipe(path))
        params, dataset = config.method_params, config.dataset
        assert params["lbd"] == lbd.get(dataset, {}).get(config.sigma, 1.0), path.name
        assert (params["num_noise"], params["epsilon"], params["num_steps"]) == (4, 1.0, 4)
        assert config.batch_size == 64
        assert params["target"] == "teacher" and params["teacher_draws"] == 10_000
        assert params["teacher_sigma"] == 0.25
        teacher = f"runs/{dataset}/gaussian_teacher_s025/checkpoint.pt"
        assert params["teacher_checkpoint"] == teacher, path.name
        recipe = TrainConfig.from_dict(load_recipe(CONFIGS / dataset /
                                                   "gaussian_teacher_s025.yaml"))
        assert (recipe.method, recipe.sigma, recipe.dataset) == ("gaussian", 0.25, dataset)


# --------------------------------------------------------------------------- CLI
def test_trains_from_the_cli_on_digits(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--method", "catrs", "--dataset", "digits", "--arch", "digits_cnn",
                 "--sigma", "0.25", "--epochs", "1", "--batch", "64", "--out", str(out),
                 "--param", "target=self", "--no-progress"]) == 0
    meta = load_checkpoint(out / "checkpoint.pt").meta
    assert meta["method"] == {"name": "catrs", "variant": "target=self",
                              "hparams": build_method("catrs", target="self").hparams()}
    header, row = (out / "log.tsv").read_text().splitlines()
    values = dict(zip(header.split("\t"), map(float, row.split("\t"))))
    assert values["loss"] == pytest.approx(values["low"] + values["high"])  # λ = 1
    assert 0 <= values["high_fraction"] <= 1 and values["epsilon"] == 1.0
