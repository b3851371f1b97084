"""Training methods: every registry entry gives a finite scalar loss with gradients everywhere and
learns on a fixed batch; golden checks of gaussian. Each method's own checks live in its own file.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from smoothcert import Gaussian, SmoothcertError
from smoothcert.data.datasets import load_dataset
from smoothcert.methods import METHODS, EpochContext, TrainingMethod, build_method, register_method
from smoothcert.models import ENCODINGS

B, C, H, W, K = 6, 1, 8, 8, 10


def tiny_model(input_encoding: str | None = None) -> nn.Module:
    """A small MLP; behind the input encoding a method asks for (ablation's doubles C)."""
    torch.manual_seed(0)
    if input_encoding is None:
        return nn.Sequential(nn.Flatten(), nn.Linear(C * H * W, 16), nn.ReLU(), nn.Linear(16, K))
    encoding = ENCODINGS[input_encoding]
    width = encoding.out_channels(C) * H * W
    return nn.Sequential(encoding(), nn.Flatten(), nn.Linear(width, 16), nn.ReLU(),
                         nn.Linear(16, K))


def batch():
    gen = torch.Generator().manual_seed(1)
    return torch.rand(B, C, H, W, generator=gen), torch.randint(0, K, (B,), generator=gen)


@pytest.fixture(scope="module")
def digits_train():
    """The digits training split (1×8×8, 10 classes: the shapes of ``batch()``)."""
    return load_dataset("digits", "train")


def context(model, train_data, num_epochs: int = 10) -> EpochContext:
    return EpochContext(
        num_epochs,
        model,
        train_data,
        Gaussian(0.25),
        generator=torch.Generator().manual_seed(5),
        device=torch.device("cpu"),
    )


CLASSIFIER_METHODS = sorted(n for n, cls in METHODS.items() if cls.trains == "classifier")
# A method whose defaults need a file: catrs trains toward a teacher checkpoint's votes (the
# paper's ŷ); the contract runs its named variant without one (the teacher path:
# tests/methods/test_catrs_teacher.py). A method whose defaults name nothing to train with:
# transform needs its transformation (tests/transforms/test_transform_method.py).
WITHOUT_FILES = {"catrs": {"target": "self"}, "transform": {"transform": "brightness:sigma_b=0.2"}}


# Every method that trains a classifier must pass all three checks. A method that could not (e.g.
# one that freezes part of the network by design) would need an entry here saying why; there is
# none. The denoiser and diffusion methods train other models: their contract is
# tests/methods/test_denoiser_methods.py and test_diffusion_method.py.
@pytest.mark.parametrize("name", CLASSIFIER_METHODS)
def test_every_method_gives_a_finite_loss_with_gradients_everywhere_and_learns(name, digits_train):
    model, (x, y) = tiny_model(METHODS[name].input_encoding), batch()
    method = build_method(name, **WITHOUT_FILES.get(name, {}))
    method.on_epoch_start(0, context(model, digits_train))  # heat's teacher, warm-ups, ...
    model.train()

    noise = Gaussian(0.25) if method.uses_noise else None

    def loss() -> dict:  # the same batch and the same draws every time
        return method.loss(model, x, y, noise, torch.Generator().manual_seed(0))

    out = loss()
    assert out["loss"].dim() == 0 and torch.isfinite(out["loss"])
    assert out["logits"].shape == (B, K)
    assert all(v.dim() == 0 and torch.isfinite(v) for k, v in out.items() if k != "logits")
    out["loss"].backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"{name}: no gradient reaches {pname}"
    first = out["loss"].item()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(10):
        opt.zero_grad()
        loss()["loss"].backward()
        opt.step()
    assert loss()["loss"].item() < first


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_round_trips_its_hparams(name):
    method = build_method(name, **WITHOUT_FILES.get(name, {}))
    assert build_method(name, **method.hparams()).hparams() == method.hparams()
    plain = (bool, int, float, str, type(None))
    assert all(isinstance(v, plain) for v in method.hparams().values())


def test_gaussian_m1_equals_cross_entropy_on_identically_seeded_noise():
    model, (x, y) = tiny_model(), batch()
    noise = Gaussian(0.5)
    out = build_method("gaussian").loss(model, x, y, noise, torch.Generator().manual_seed(7))
    x_noisy = x + noise.sample(x, torch.Generator().manual_seed(7))
    expected = F.cross_entropy(model(x_noisy), y)
    torch.testing.assert_close(out["loss"], expected, rtol=0, atol=0)
    torch.testing.assert_close(out["logits"], model(x_noisy), rtol=0, atol=0)


def test_gaussian_with_m_copies_averages_over_all_noisy_inputs():
    model, (x, y) = tiny_model(), batch()
    noise, m = Gaussian(0.5), 3
    out = build_method("gaussian", num_noise=m).loss(
        model, x, y, noise, torch.Generator().manual_seed(7)
    )
    gen = torch.Generator().manual_seed(7)
    draws = noise.sample(x.repeat(m, 1, 1, 1), gen).view(m, B, C, H, W)  # copy-major
    per_copy = [F.cross_entropy(model(x + draws[j]), y) for j in range(m)]
    torch.testing.assert_close(out["loss"], torch.stack(per_copy).mean(), rtol=1e-6, atol=1e-7)
    # a batch of m·B rows may take another matmul path than B rows: allow float32 rounding
    torch.testing.assert_close(out["logits"], model(x + draws[0]), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(per_copy[0], per_copy[1])  # the copies see different noise


def test_gaussian_loss_depends_on_sigma():
    model, (x, y) = tiny_model(), batch()
    method = build_method("gaussian")
    loss = [
        method.loss(model, x, y, Gaussian(s), torch.Generator().manual_seed(0))["loss"]
        for s in (0.01, 2.0)
    ]
    assert not torch.allclose(loss[0], loss[1])


def test_standard_is_the_cross_entropy_on_clean_inputs_and_draws_nothing():
    model, (x, y) = tiny_model(), batch()
    method = build_method("standard")
    assert not method.uses_noise and method.trains == "classifier" and method.hparams() == {}
    gen = torch.Generator().manual_seed(7)
    state = gen.get_state()
    out = method.loss(model, x, y, None, gen)
    torch.testing.assert_close(out["loss"], F.cross_entropy(model(x), y), rtol=0, atol=0)
    torch.testing.assert_close(out["logits"], model(x), rtol=0, atol=0)
    assert torch.equal(gen.get_state(), state)


def test_method_defaults_are_cohen_s_unless_the_authors_differ():
    base = {"optimizer": "sgd", "lr": 0.1, "weight_decay": 1e-4, "lr_schedule": "step"}
    for name in set(CLASSIFIER_METHODS) - {"ablation"}:
        assert METHODS[name].training_defaults() == base, name
    for name in ("denoiser-mse", "denoiser-stability"):  # Salman et al.'s train_denoiser.py
        assert METHODS[name].training_defaults() == {**base, "optimizer": "adam", "lr": 1e-3}
    assert METHODS["diffusion"].training_defaults() == {  # Ho et al. 2020
        "optimizer": "adam", "lr": 2e-4, "weight_decay": 0.0, "lr_schedule": "constant"}
    assert METHODS["ablation"].training_defaults() == {  # Levine & Feizi's train_mnist_*.py
        "optimizer": "sgd", "lr": 0.01, "weight_decay": 5e-4, "lr_schedule": "constant"}


def test_unknown_method_names_the_known_ones():
    with pytest.raises(SmoothcertError, match="unknown method 'nope'.*gaussian"):
        build_method("nope")


@pytest.mark.parametrize(
    "hparams, match",
    [
        ({"sigma": 0.5}, "unknown hyperparameter.*sigma.*valid: num_noise"),
        ({"num_noise": 0}, "num_noise.*>= 1"),
        ({"num_noise": 2.5}, "num_noise"),
        ({"num_noise": True}, "num_noise"),
    ],
)
def test_bad_gaussian_hparams_raise(hparams, match):
    with pytest.raises(SmoothcertError, match=match):
        build_method("gaussian", **hparams)


def test_registering_a_name_twice_is_refused():
    with pytest.raises(ValueError, match="already registered"):

        @register_method("gaussian")
        class Clash(TrainingMethod):
            def loss(self, model, x, y, noise, generator):
                raise NotImplementedError
    assert METHODS["gaussian"].__name__ == "GaussianAugmentation"
