"""Training with per-sample σ (Alfarra et al. 2022, Algorithm 2): each method noises example i at
its own σ_i (exactly, against noise drawn by hand from the same seed, and statistically), the
trainer keeps one σ per training example across epochs, saves it, resumes it exactly, logs it, and
refuses methods and options that cannot work."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from smoothcert import Gaussian, SmoothcertError
from smoothcert.methods import METHODS, build_method
from smoothcert.methods.base import noise_for_copies
from smoothcert.models.checkpoint import load_checkpoint
from smoothcert.smoothing.attacks import draw_noises
from smoothcert.training import TrainConfig, Trainer, train
from smoothcert.training import loop as train_module
from smoothcert.training.sigma_modes import SIGMA_MODES, build_sigma_mode
from smoothcert.upgrade import OLD_SIGMA_PARAMS, upgrade_config

B, SHAPE, K = 4, (1, 32, 32), 3  # 1,024 coordinates per input: per-row std within a few %
SIGMA = torch.tensor([0.05, 0.2, 0.5, 1.0])


class Recorder(nn.Module):
    """A linear classifier that keeps the input of its last forward pass."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(math.prod(SHAPE), K)
        self.seen = None

    def forward(self, x):
        self.seen = x.detach().clone()
        return self.linear(x.flatten(1))


def batch():
    gen = torch.Generator().manual_seed(1)
    return torch.rand((B,) + SHAPE, generator=gen), torch.randint(0, K, (B,), generator=gen)


def row_std(noise: torch.Tensor) -> torch.Tensor:
    return noise.flatten(1).std(dim=1)


# --- the methods ----------------------------------------------------------------------------

COPYING = [("gaussian", {"num_noise": 3}), ("consistency", {"num_noise": 3}),
           ("macer", {"num_noise": 3})]


@pytest.mark.parametrize("name, hparams", COPYING, ids=[n for n, _ in COPYING])
def test_copying_methods_noise_copy_j_of_input_i_at_sigma_i(name, hparams):
    model, (x, y), m = Recorder(), batch(), hparams["num_noise"]
    out = build_method(name, **hparams).loss(
        model, x, y, Gaussian(SIGMA), torch.Generator().manual_seed(5)
    )
    x_rep = x.repeat(m, 1, 1, 1)
    eps = torch.randn(x_rep.shape, generator=torch.Generator().manual_seed(5))
    by_hand = x_rep + eps * SIGMA.repeat(m).view(-1, 1, 1, 1)  # copy-major: row jB+i has σ_i
    assert torch.equal(model.seen, by_hand)
    # Statistically: 1,024 N(0, σ_i²) coordinates per row give a sample std within 3σ_i·2.2%.
    torch.testing.assert_close(row_std(model.seen - x_rep), SIGMA.repeat(m), rtol=0.07, atol=0)
    assert torch.isfinite(out["loss"]) and out["logits"].shape == (B, K)
    out["loss"].backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("lbd", [0.0, 1.0], ids=["smoothadv", "smoothadv+consistency"])
def test_smoothadv_attacks_and_trains_each_input_at_its_sigma(lbd):
    model, (x, y), m = Recorder(), batch(), 3
    hparams = dict(epsilon=0.0, num_steps=2, num_noise=m, warmup_epochs=0, lbd=lbd)
    out = build_method("smoothadv", **hparams).loss(
        model, x, y, Gaussian(SIGMA), torch.Generator().manual_seed(5)
    )
    # ε = 0: x' = x, so the training pass sees x + δ_j with the draws made before the attack.
    gen = torch.Generator().manual_seed(5)
    by_hand = torch.stack([torch.randn(x.shape, generator=gen) * SIGMA.view(-1, 1, 1, 1)
                           for _ in range(m)])  # draw j: one noise.sample(x)
    assert torch.equal(model.seen, (x.unsqueeze(0) + by_hand).flatten(0, 1))
    torch.testing.assert_close(row_std(model.seen - x.repeat(m, 1, 1, 1)), SIGMA.repeat(m),
                               rtol=0.07, atol=0)
    assert torch.isfinite(out["loss"])


def test_smoothadv_with_a_budget_uses_the_same_per_sample_draws():
    model, (x, y) = Recorder(), batch()
    method = build_method("smoothadv", epsilon=0.5, num_steps=2, num_noise=2, warmup_epochs=0)
    out = method.loss(model, x, y, Gaussian(SIGMA), torch.Generator().manual_seed(5))
    noises = draw_noises(Gaussian(SIGMA), x, 2, torch.Generator().manual_seed(5))
    adv = model.seen.view(2, *x.shape) - noises  # the training pass: x' + δ_j, same x' per copy
    torch.testing.assert_close(adv[0], adv[1], rtol=0, atol=1e-6)
    assert ((adv[0] - x).flatten(1).norm(dim=1) <= 0.5 + 1e-5).all()
    assert torch.isfinite(out["loss"]) and out["adv_distance"] > 0


def test_noise_for_copies_repeats_a_per_sample_sigma_copy_major_and_keeps_a_scalar():
    scalar = Gaussian(0.25)
    assert noise_for_copies(scalar, 4) is scalar
    per_sample = Gaussian(SIGMA)
    assert noise_for_copies(per_sample, 1) is per_sample
    repeated = noise_for_copies(per_sample, 3)
    assert type(repeated) is Gaussian
    assert torch.equal(repeated.sigma, torch.cat([SIGMA, SIGMA, SIGMA]))
    one = Gaussian(torch.tensor([0.3]))  # one entry broadcasts over any batch
    assert noise_for_copies(one, 3) is one


# --- the trainer with a stand-in OptimizeSigma ------------------------------------------------

DD_PARAMS = {"num_steps": 2, "step_size": 0.01, "num_samples": 2}
DD = dict(dataset="digits", arch="digits_cnn", sigma=0.25, batch_size=128, lr=0.05, seed=3,
          sigma_mode="data_dependent", sigma_mode_params=DD_PARAMS)


def dd_from(start_epoch: int) -> dict:
    """DD whose per-example σ starts moving at ``start_epoch``."""
    return {**DD, "sigma_mode_params": {**DD_PARAMS, "start_epoch": start_epoch}}


def use_optimize_sigma(monkeypatch, fn) -> None:
    """Make ``smoothcert.smoothing.sigma_optimization.optimize_sigma`` be ``fn`` for this test."""
    import smoothcert.smoothing.sigma_optimization as module

    monkeypatch.setattr(module, "optimize_sigma", fn)


def test_trainer_keeps_one_sigma_per_example_and_trains_each_batch_at_its_own(monkeypatch):
    """The stand-in moves σ_i by α·K·mean(x_i): after one epoch σ_i is known in closed form for
    every example, which checks that the index bookkeeping is right, and every batch must be
    trained with exactly the σ the stand-in returned for it."""
    calls, trained = [], []

    def stand_in(model, x, sigma0, *, num_steps, step_size, num_samples, generator, noise, **kw):
        assert not kw and not sigma0.requires_grad and noise == "gaussian"  # the run's noise
        calls.append((num_steps, step_size, num_samples, generator))
        out = sigma0 + step_size * num_steps * x.flatten(1).mean(dim=1)
        trained.append(out)
        return out

    use_optimize_sigma(monkeypatch, stand_in)
    trainer = Trainer(TrainConfig(**dd_from(1), epochs=2))
    real_loss, seen = trainer.method.loss, []
    monkeypatch.setattr(trainer.method, "loss",
                        lambda model, x, y, noise, gen: seen.append(noise) or real_loss(
                            model, x, y, noise, gen))
    row = trainer.train_epoch()  # epoch 0 < start_epoch: the fixed σ, no OptimizeSigma
    assert not calls and all(n.sigma == 0.25 for n in seen)
    assert row["sigma_mean"] == row["sigma_min"] == row["sigma_max"] == pytest.approx(0.25)
    seen.clear()
    row = trainer.train_epoch()
    assert calls and all(c[:3] == (2, 0.01, 2) and c[3] is trainer.noise_gen for c in calls)
    assert len(seen) == len(trained) and all(n.sigma is t or torch.equal(n.sigma, t)
                                             for n, t in zip(seen, trained))
    x_all, _ = trainer.train_data.batch(torch.arange(len(trainer.train_data)))
    expected = 0.25 + 0.01 * 2 * x_all.flatten(1).mean(dim=1)
    torch.testing.assert_close(trainer.per_example_sigma.sigmas, expected)
    assert row["sigma_mean"] == pytest.approx(expected.mean().item())
    assert row["sigma_max"] == pytest.approx(expected.max().item())
    torch.testing.assert_close(trainer.train_state()["per_example_sigma"], expected)


def test_fixed_mode_has_no_per_example_sigma():
    trainer = Trainer(TrainConfig(dataset="digits", arch="digits_cnn", sigma=0.25, epochs=1))
    assert trainer.per_example_sigma.log_columns() == {}  # no σ columns in the log
    assert trainer.train_state()["per_example_sigma"] is None
    idx = trainer._batches()[0]
    noise = trainer.per_example_sigma.noise_for(trainer.model, None, idx, None, 0)
    assert type(noise) is Gaussian and noise.sigma == 0.25


# --- the trainer with the real OptimizeSigma --------------------------------------------------

REAL = TrainConfig(**DD, epochs=2)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted 2-epoch data-dependent run: its folder."""
    out = tmp_path_factory.mktemp("dd-straight")
    train(REAL, out, progress=False)
    return out


def test_data_dependent_run_moves_saves_and_logs_sigma(straight):
    ckpt = load_checkpoint(straight / "checkpoint.pt")
    sigmas = ckpt.train_state["per_example_sigma"]
    n = len(Trainer(REAL).train_data)
    assert sigmas.shape == (n,) and sigmas.dtype == torch.float32
    assert (sigmas > 0).all() and torch.isfinite(sigmas).all()
    assert (sigmas != 0.25).float().mean() > 0.9  # nearly every example's σ has moved
    header, *rows = (straight / "log.tsv").read_text().splitlines()
    first, last = (dict(zip(header.split("\t"), row.split("\t"))) for row in rows)
    assert float(last["loss"]) < float(first["loss"])  # it trains
    assert float(last["sigma_mean"]) == pytest.approx(sigmas.mean().item(), rel=1e-6)
    assert float(last["sigma_min"]) == pytest.approx(sigmas.min().item(), rel=1e-6)
    assert float(last["sigma_max"]) == pytest.approx(sigmas.max().item(), rel=1e-6)
    assert ckpt.meta["config"]["sigma_mode"] == "data_dependent"


@pytest.mark.parametrize("saved_by", ["this version", "a version before sigma_mode_params"])
def test_interrupted_data_dependent_run_resumes_to_identical_weights_and_sigma(
    straight, tmp_path, monkeypatch, saved_by
):
    real_save = train_module._save

    def save_then_die(path, trainer):
        real_save(path, trainer)
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "_save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(REAL, tmp_path, progress=False)
    monkeypatch.undo()
    if saved_by != "this version":  # its config has the old dd_* keys and no noise
        path = tmp_path / "checkpoint.pt"
        payload = torch.load(path, weights_only=True)
        payload["meta"]["config"] = old_format(payload["meta"]["config"])
        payload["format_version"] = 1
        torch.save(payload, path)
        assert torch.load(path, weights_only=True)["meta"]["config"]["dd_steps"] == 2
        assert load_checkpoint(path).meta["config"]["sigma_mode_params"]["num_steps"] == 2
    train(REAL, tmp_path, progress=False, resume=True)
    resumed = load_checkpoint(tmp_path / "checkpoint.pt")
    expected = load_checkpoint(straight / "checkpoint.pt")
    assert resumed.meta["epoch"] == 2 and resumed.meta["config"] == REAL.to_dict()
    for key, value in expected.state_dict.items():
        torch.testing.assert_close(resumed.state_dict[key], value, rtol=0, atol=0)
    assert torch.equal(resumed.train_state["per_example_sigma"],
                       expected.train_state["per_example_sigma"])


@pytest.mark.parametrize("name, hparams", [
    ("consistency", {"num_noise": 2}),
    ("macer", {"num_noise": 2}),
    ("smoothadv", {"num_noise": 2, "num_steps": 1, "epsilon": 0.25, "warmup_epochs": 0}),
])
def test_every_supporting_method_takes_data_dependent_steps(name, hparams):
    trainer = Trainer(TrainConfig(**DD, epochs=1, method=name, method_params=hparams))
    for idx in trainer._batches()[:2]:  # two optimizer steps, each after OptimizeSigma
        out, _ = trainer._step(idx)
        assert torch.isfinite(out["loss"])
    sigmas = trainer.per_example_sigma.sigmas
    assert (sigmas != 0.25).sum() > DD["batch_size"]  # both batches' σ have moved
    assert (sigmas > 0).all()


# --- refusals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(n for n, cls in METHODS.items()  # noisy classifiers
                                          if cls.trains == "classifier" and cls.uses_noise))
def test_methods_without_per_sample_sigma_are_refused_in_data_dependent_mode(name):
    needs = {"method_params": {"target": "self"}} if name == "catrs" else {}  # no teacher here
    config = dict(DD, epochs=1, method=name, **needs)
    if METHODS[name].supports_per_sample_sigma:
        assert TrainConfig(**config).sigma_mode == "data_dependent"
        return
    with pytest.raises(SmoothcertError, match=rf"method '{name}' cannot train with a per-sample "
                       r"σ.*sigma_mode fixed.*consistency, gaussian, macer, smoothadv"):
        TrainConfig(**config)
    fixed = {**BASE, "epochs": 1, "method": name, "sigma_mode": "fixed", **needs}  # no σ params
    assert TrainConfig(**fixed).method == name


def test_the_four_methods_of_the_issue_support_per_sample_sigma():
    able = {n for n, cls in METHODS.items() if cls.supports_per_sample_sigma}
    assert able >= {"gaussian", "consistency", "macer", "smoothadv"}
    assert not able & {"stability", "heat", "easy_focus"}


@pytest.mark.parametrize("change, match", [
    ({"sigma_mode": "adaptive"}, "unknown sigma_mode 'adaptive'.*data_dependent, fixed"),
    ({"sigma_mode": None}, "sigma_mode must be a string"),
    # the data_dependent mode's parameters (sigma_mode_params), checked by the mode
    ({"num_steps": 0}, "sigma mode 'data_dependent': num_steps must be an integer >= 1"),
    ({"num_steps": 1.5}, "sigma mode 'data_dependent': num_steps"),
    ({"step_size": 0.0}, "sigma mode 'data_dependent': step_size must be a positive"),
    ({"step_size": float("nan")}, "sigma mode 'data_dependent': step_size"),
    ({"num_samples": 0}, "sigma mode 'data_dependent': num_samples must be an integer >= 1"),
    ({"start_epoch": -1}, "sigma mode 'data_dependent': start_epoch must be an integer >= 0"),
    ({"start_epoch": 2},
     r"start_epoch \(2\) of sigma mode data_dependent must be below epochs \(2\)"),
])
def test_bad_data_dependent_options_raise(change, match):
    params = {k: v for k, v in change.items() if k in OLD_SIGMA_PARAMS.values()}
    fields = {k: v for k, v in change.items() if k not in params}
    with pytest.raises(SmoothcertError, match=match):
        TrainConfig(**{**DD, "epochs": 2, **fields, "sigma_mode_params": {**DD_PARAMS, **params}})
    # the same through the old keyword arguments (smoothcert.upgrade.sigma_keywords)
    old = {key: params[name] for key, name in OLD_SIGMA_PARAMS.items() if name in params}
    if old:
        with pytest.raises(SmoothcertError, match=match):
            TrainConfig(**BASE, epochs=2, **old)


def test_config_round_trips_the_data_dependent_options():
    config = TrainConfig(**dd_from(1), epochs=3)
    assert TrainConfig.from_dict(config.to_dict()) == config
    defaults = TrainConfig(dataset="digits", arch="digits_cnn", sigma=0.25, epochs=1)
    assert (defaults.sigma_mode, defaults.sigma_mode_params) == ("fixed", {})
    assert build_sigma_mode("data_dependent").params() == {
        "num_steps": 1, "step_size": 1e-4, "num_samples": 1, "start_epoch": 0}


def test_data_dependent_training_from_the_cli(tmp_path):
    from smoothcert.cli.app import main
    from smoothcert.models.checkpoint import load_checkpoint

    out = tmp_path / "dd"
    assert main(["train", "--dataset", "digits", "--arch", "digits_cnn", "--sigma", "0.25",
                 "--epochs", "1", "--batch", "128", "--sigma-mode", "data_dependent",
                 "--dd-steps", "1", "--dd-step-size", "1e-3", "--out", str(out),
                 "--no-progress", "--device", "cpu"]) == 0
    checkpoint = load_checkpoint(out / "checkpoint.pt")
    assert checkpoint.meta["config"]["sigma_mode"] == "data_dependent"
    assert checkpoint.meta["config"]["sigma_mode_params"]["step_size"] == 1e-3
    assert checkpoint.meta["config"]["sigma_mode_params"]["num_steps"] == 1
    assert "sigma_mean" in (out / "log.tsv").read_text().splitlines()[0]


# --- sigma_mode_params and the old dd_* keys -------------------------------------------------

PARAMS = {"num_steps": 2, "step_size": 0.01, "num_samples": 2, "start_epoch": 1}
BASE = {k: v for k, v in DD.items() if k != "sigma_mode_params"}  # DD without its parameters


def old_format(config: dict) -> dict:
    """``config`` (a ``to_dict()``) as versions before ``sigma_mode_params`` and ``noise`` stored
    it (config format 1): the data-dependent mode's parameters as dd_* keys, present for every
    σ mode, and no format_version."""
    old = {k: v for k, v in config.items()
           if k not in ("noise", "sigma_mode_params", "format_version")}
    own = config["sigma_mode_params"] if config["sigma_mode"] == "data_dependent" else {}
    params = build_sigma_mode("data_dependent", **own).params()
    return {**old, **{key: params[name] for key, name in OLD_SIGMA_PARAMS.items()}}


def test_old_dd_keys_equal_the_new_sigma_mode_params():
    old = TrainConfig(**BASE, epochs=3, dd_steps=2, dd_step_size=0.01, dd_num_samples=2,
                      dd_start_epoch=1)
    new = TrainConfig(**BASE, epochs=3, sigma_mode_params=PARAMS)
    assert old == new and old.to_dict() == new.to_dict()
    assert new.sigma_mode_params == PARAMS and not any(k.startswith("dd_") for k in new.to_dict())
    assert TrainConfig.from_dict(old_format(new.to_dict())) == new
    assert TrainConfig.from_dict({**old_format(new.to_dict()), "noise": "gaussian"}) == new
    # the two spellings together: the missing parameters at the mode's defaults
    mixed = TrainConfig(**BASE, epochs=3, dd_steps=3, sigma_mode_params={"step_size": 0.01})
    assert mixed.sigma_mode_params == {"num_steps": 3, "step_size": 0.01, "num_samples": 1,
                                       "start_epoch": 0}
    assert TrainConfig(**BASE, epochs=3, dd_steps=2, sigma_mode_params=PARAMS) == new
    with pytest.raises(SmoothcertError, match=r"disagree \(dd_steps=3 vs sigma_mode_params "
                                              r"num_steps=2\)"):
        TrainConfig(**BASE, epochs=3, dd_steps=3, sigma_mode_params=PARAMS)


def test_sigma_mode_params_are_checked_at_the_boundary():
    fixed = dict(BASE, epochs=3, sigma_mode="fixed")
    # the old keys of a fixed-σ config are ignored, as they always were (and said so)
    assert TrainConfig(**fixed, dd_steps=5) == TrainConfig(**fixed, dd_steps=0)
    assert TrainConfig(**fixed).sigma_mode_params == {}
    with pytest.raises(SmoothcertError, match=r"sigma mode 'fixed' takes no parameters, got "
                                              r"num_steps; num_steps is a parameter of sigma "
                                              r"mode 'data_dependent'"):
        TrainConfig(**fixed, sigma_mode_params={"num_steps": 2})
    with pytest.raises(SmoothcertError, match="unknown parameter.*steps for sigma mode "
                                              "'data_dependent'; valid: num_steps, step_size, "
                                              "num_samples, start_epoch"):
        TrainConfig(**BASE, epochs=3, sigma_mode_params={"steps": 2})
    with pytest.raises(SmoothcertError, match="sigma_mode_params must be a mapping"):
        TrainConfig(**BASE, epochs=3, sigma_mode_params=[2])


@pytest.mark.parametrize("name", sorted(SIGMA_MODES))
def test_every_sigma_mode_builds_with_its_defaults_and_names_them(name):
    mode = build_sigma_mode(name)
    assert list(mode.params()) == SIGMA_MODES[name].param_names()
    assert build_sigma_mode(name, **mode.params()).params() == mode.params()
    mode.start("gaussian", 0.25, 10, torch.device("cpu"))
    noise = mode.noise_for(None, torch.zeros(2, 1, 4, 4), torch.tensor([0, 1]), None, -1)
    assert type(noise) is Gaussian and float(noise.sigma) == 0.25  # before any optimisation


def test_data_dependent_training_with_uniform_noise(monkeypatch):
    """The σ mode optimises σ for the run's noise and trains each example with that noise."""
    from smoothcert.noise.uniform import Uniform

    asked, trained = [], []

    def stand_in(model, x, sigma0, *, noise, **kw):
        asked.append(noise)
        return sigma0 + 0.01

    use_optimize_sigma(monkeypatch, stand_in)
    trainer = Trainer(TrainConfig(**DD, epochs=1, noise="uniform"))
    real_loss = trainer.method.loss
    monkeypatch.setattr(trainer.method, "loss", lambda model, x, y, noise, gen: trained.append(
        noise) or real_loss(model, x, y, noise, gen))
    trainer._step(trainer._batches()[0])
    assert asked == ["uniform"] and type(trainer.noise) is Uniform
    assert type(trained[0]) is Uniform and torch.allclose(trained[0].sigma, torch.tensor(0.26))


def test_sigma_params_from_flags_and_a_recipe(tmp_path):
    """--sigma-param and the old --dd-* flags set one parameter each over a recipe, whichever
    spelling the recipe used."""
    from smoothcert.cli.app import build_parser
    from smoothcert.cli.train import _train_fields

    def params(recipe, *flags):
        args = build_parser().parse_args(["train", "--out", str(tmp_path), *flags])
        fields = _train_fields(upgrade_config(recipe), args)  # as load_recipe gives it
        return TrainConfig.from_dict(fields).sigma_mode_params

    old = {**BASE, "epochs": 3, "dd_steps": 2, "dd_start_epoch": 1}
    new = {**BASE, "epochs": 3, "sigma_mode_params": {"num_steps": 2, "start_epoch": 1}}
    for recipe in (old, new):
        assert params(recipe) == {**PARAMS, "step_size": 1e-4, "num_samples": 1}
        assert params(recipe, "--sigma-param", "num_steps=3")["num_steps"] == 3
        assert params(recipe, "--dd-steps", "4")["num_steps"] == 4
        assert params(recipe, "--dd-step-size", "1e-3", "--sigma-param", "num_samples=3") == {
            "num_steps": 2, "step_size": 1e-3, "num_samples": 3, "start_epoch": 1}
    fixed = {**BASE, "epochs": 3, "sigma_mode": "fixed", "dd_steps": 2}
    assert params(fixed) == params(fixed, "--dd-steps", "3") == {}  # for their mode only


def test_opt_values_in_exponent_notation_are_numbers():
    from smoothcert.cli.common import parse_params

    assert parse_params(["a=1e-4", "b=2", "c=true", "d=pgd"]) == {
        "a": 1e-4, "b": 2, "c": True, "d": "pgd"}
