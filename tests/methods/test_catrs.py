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
from smoothcert.methods.catrs import catrs_loss, kl_pgd, load_teacher, vote_frequencies
from smoothcert.models.checkpoint import load_checkpoint
from smoothcert.smoothing.attacks import draw_noises
from smoothcert.training import TrainConfig
from smoothcert.training import loop as loop_module
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
    method = build_method("catrs", num_noise=M, lbd=1.5, num_steps=2, epsilon=0.5)
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
    method = build_method("catrs", num_noise=M, num_steps=1)
    out = method.loss(model, x, y, Gaussian(sigma), torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(2)
    noises = draw_noises(Gaussian(sigma), x, M, gen)
    ratio = noises.flatten(2).std(dim=2) / sigma  # (M, B): each row drawn at its own σ_i
    assert ((ratio - 1).abs() < 0.3).all()
    u = torch.rand((B, M), generator=gen, dtype=F64)
    expected = catrs_loss(model, x, y, noises, u, target=None, epsilon=1.0, num_steps=1, lbd=1.0)
    torch.testing.assert_close(out["loss"], expected["loss"], rtol=0, atol=0)


def test_double_epsilon_epoch_is_recomputed_at_every_epoch_start():
    method = build_method("catrs", epsilon=0.5, double_epsilon_epoch=3)
    assert [method.epsilon_at(e) for e in range(5)] == [0.5, 0.5, 0.5, 1.0, 1.0]
    resumed = build_method("catrs", epsilon=0.5, double_epsilon_epoch=3)  # as after a resume
    resumed.on_epoch_start(4, context(tiny_model()))
    assert resumed.current_epsilon == 1.0 and resumed.state_dict() == {}
    x, y, *_ = inputs()
    out = resumed.loss(tiny_model(), x, y, Gaussian(0.25), torch.Generator().manual_seed(0))
    assert out["epsilon"].item() == 1.0
    never = build_method("catrs", epsilon=0.5)
    never.on_epoch_start(1000, context(tiny_model()))
    assert never.current_epsilon == 0.5


# --------------------------------------------------------------------------- the teacher
def test_vote_frequencies_are_the_fractions_of_noisy_votes():
    always_3 = nn.Sequential(nn.Flatten(), nn.Linear(64, C)).double()
    with torch.no_grad():
        always_3[1].weight.zero_()
        always_3[1].bias.copy_(F.one_hot(torch.tensor(3), C))
    x = inputs()[0]
    gen = torch.Generator().manual_seed(0)
    votes = vote_frequencies(always_3, x, Gaussian(0.25), 7, gen)
    torch.testing.assert_close(votes, F.one_hot(torch.full((B,), 3), C).double())
    votes = vote_frequencies(tiny_model(), x, Gaussian(2.0), 8, gen)
    torch.testing.assert_close(votes.sum(dim=1), torch.ones(B, dtype=F64))
    assert torch.equal(votes * 8, (votes * 8).round())


def save_teacher(path: Path, model: nn.Module) -> str:
    torch.save({"format": "smoothcert-checkpoint", "state_dict": model.state_dict()}, path)
    return str(path)


def test_the_teacher_target_is_its_votes_drawn_after_the_noise(tmp_path):
    torch.manual_seed(11)
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, C)).double()
    path = save_teacher(tmp_path / "t.pt", teacher)
    method = build_method("catrs", num_noise=M, target="teacher", teacher_checkpoint=path,
                          teacher_draws=5, num_steps=1)
    model, (x, y, *_) = tiny_model(), inputs(8)
    with pytest.raises(SmoothcertError, match="on_epoch_start"):
        method.loss(model, x, y, Gaussian(0.5), torch.Generator().manual_seed(0))
    method.on_epoch_start(0, context(model))
    out = method.loss(model, x, y, Gaussian(0.5), torch.Generator().manual_seed(1))
    out["loss"].backward()
    loaded = method.teacher
    assert not loaded.training and all(p.grad is None and not p.requires_grad
                                       for p in loaded.parameters())
    for mine, theirs in zip(loaded.state_dict().values(), teacher.state_dict().values()):
        assert torch.equal(mine, theirs)
    gen = torch.Generator().manual_seed(1)
    noises = draw_noises(Gaussian(0.5), x, M, gen)
    votes = vote_frequencies(teacher, x, Gaussian(0.25), 5, gen)
    u = torch.rand((B, M), generator=gen, dtype=F64)
    expected = catrs_loss(model, x, y, noises, u, target=votes, epsilon=1.0, num_steps=1, lbd=1.0)
    torch.testing.assert_close(out["loss"].detach(), expected["loss"].detach(), rtol=0, atol=0)


def test_a_bad_teacher_checkpoint_is_refused_clearly(tmp_path):
    with pytest.raises(SmoothcertError, match="cannot read the catrs teacher"):
        load_teacher(str(tmp_path / "missing.pt"), tiny_model())
    torch.save({"weights": 1}, tmp_path / "odd.pt")
    with pytest.raises(SmoothcertError, match="not a smoothcert checkpoint"):
        load_teacher(str(tmp_path / "odd.pt"), tiny_model())
    wide = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, C))
    path = save_teacher(tmp_path / "wide.pt", wide)
    with pytest.raises(SmoothcertError, match="does not fit the model's architecture"):
        load_teacher(path, tiny_model())


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
        ({"target": "nope"}, "target must be one of self, teacher"),
        ({"target": "teacher"}, "needs teacher_checkpoint=PATH"),
        ({"teacher_checkpoint": "t.pt"}, "only read with target='teacher'"),
        ({"target": "teacher", "teacher_checkpoint": ""}, "teacher_checkpoint must be a path"),
        ({"teacher_sigma": 0.0}, "teacher_sigma must be a positive finite number"),
        ({"teacher_draws": 0}, "teacher_draws must be an integer >= 1"),
        ({"eps": 1.0}, "unknown hyperparameter.*eps"),
    ],
)
def test_bad_hyperparameters_are_refused(hparams, match):
    with pytest.raises(SmoothcertError, match=match):
        build_method("catrs", **hparams)


def test_the_recipes_carry_the_authors_values():
    """λ per σ on CIFAR-10 (EXPERIMENTS.MD), λ = 1 on the MNIST family; m = 4, ε = 1, T = 4 and
    one SGD step per 256/m = 64 inputs everywhere; 150 epochs with decays at 50 and 100."""
    lbd = {"cifar10": {0.25: 0.5, 0.5: 1.0, 1.0: 2.0}}
    for dataset in ("mnist", "fashion-mnist", "cifar10"):
        for path in sorted((CONFIGS / dataset).glob("catrs_s*.yaml")):
            config = TrainConfig.from_dict(load_recipe(path))
            params = config.method_params
            assert params["lbd"] == lbd.get(dataset, {}).get(config.sigma, 1.0), path.name
            assert (params["num_noise"], params["epsilon"], params["num_steps"]) == (4, 1.0, 4)
            assert config.batch_size == 64 and config.epochs == 150
            assert config.lr_milestones == (50, 100)
            assert params["target"] == ("self" if dataset == "fashion-mnist" else "teacher")


# --------------------------------------------------------------------------- CLI
def test_trains_from_the_cli_on_digits(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--method", "catrs", "--dataset", "digits", "--arch", "digits_cnn",
                 "--sigma", "0.25", "--epochs", "1", "--batch", "64", "--out", str(out),
                 "--no-progress"]) == 0
    meta = load_checkpoint(out / "checkpoint.pt").meta
    assert meta["method"] == {"name": "catrs", "hparams": build_method("catrs").hparams()}
    header, row = (out / "log.tsv").read_text().splitlines()
    values = dict(zip(header.split("\t"), map(float, row.split("\t"))))
    assert values["loss"] == pytest.approx(values["low"] + values["high"])  # λ = 1
    assert 0 <= values["high_fraction"] <= 1 and values["epsilon"] == 1.0


SMALL = ["--method", "catrs", "--dataset", "digits", "--arch", "digits_cnn", "--sigma", "0.25",
         "--batch", "64", "--train-size", "128", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher") / "gaussian"
    assert main(["train", *SMALL, "--method", "gaussian", "--epochs", "1",
                 "--out", str(out)]) == 0
    return out / "checkpoint.pt"


def test_an_interrupted_run_resumes_to_the_uninterrupted_weights(teacher, tmp_path, monkeypatch):
    """Two epochs with the teacher target and ε doubled from epoch 1: a run killed after saving
    epoch 1 and resumed with --resume ends with the straight run's weights (so the resumed run
    reloads its teacher and recomputes ε)."""
    params = ["--param", "target=teacher", "--param", f"teacher_checkpoint={teacher}",
              "--param", "double_epsilon_epoch=1", "--param", "num_steps=2", "--epochs", "2"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(["train", *SMALL, *params, "--out", str(straight)]) == 0
    real_save = loop_module._save

    def save_then_die(path, trainer):
        real_save(path, trainer)
        if trainer.epoch == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(loop_module, "_save", save_then_die)
    assert main(["train", *SMALL, *params, "--out", str(resumed)]) == 130
    monkeypatch.undo()
    assert load_checkpoint(resumed / "checkpoint.pt").meta["epoch"] == 1
    assert main(["train", *SMALL, *params, "--out", str(resumed), "--resume"]) == 0
    a, b = load_checkpoint(straight / "checkpoint.pt"), load_checkpoint(resumed / "checkpoint.pt")
    assert b.meta["epoch"] == 2
    for key, value in a.state_dict.items():
        torch.testing.assert_close(b.state_dict[key], value, rtol=0, atol=1e-6)
    rows = [line.split("\t") for line in (resumed / "log.tsv").read_text().splitlines()]
    assert [float(v) for v in dict(zip(rows[0], zip(*rows[1:])))["epsilon"]] == [1.0, 2.0]
