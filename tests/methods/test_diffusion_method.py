"""The diffusion method (Ho et al. 2020): the ε-prediction loss against its formula with a fixed
generator, an oracle that knows x0 (loss 0), the test column, and a real tiny ddpm_unet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from smoothcert.data.datasets import load_dataset
from smoothcert.methods import METHODS, build_method
from smoothcert.methods.diffusion import diffusion_loss

B, C, H, W, T = 5, 1, 8, 8, 10


class FakeDiffusion(nn.Module):
    """A model of the DiffusionModel interface (``alphas_cumprod``, forward(x_t, t)) whose
    output is a given function of (x_t, t)."""

    def __init__(self, output):
        super().__init__()
        self.alphas_cumprod = torch.linspace(0.999, 0.02, T, dtype=torch.float64)
        self.output = output
        self.weight = nn.Parameter(torch.ones(()))

    def forward(self, x_t, t):
        return self.weight * self.output(x_t, t)


def pixels():
    return torch.rand(B, C, H, W, generator=torch.Generator().manual_seed(0))


def test_the_method_declares_a_noiseless_diffusion_run():
    cls = METHODS["diffusion"]
    assert (cls.trains, cls.uses_noise, cls.frozen_classifier) == ("diffusion", False, "none")
    assert cls.max_grad_norm == 1.0 and cls.test_columns == ("test_loss",)


def test_the_loss_is_the_epsilon_mse_of_ho_et_al_for_a_fixed_generator():
    x = pixels()
    model = FakeDiffusion(lambda x_t, t: 0.5 * x_t + t.view(-1, 1, 1, 1) / T)
    out = build_method("diffusion").loss(model, x, None, None, torch.Generator().manual_seed(9))
    assert set(out) == {"loss"}
    gen = torch.Generator().manual_seed(9)  # the draws, in order: t, then ε
    t = torch.randint(0, T, (B,), generator=gen)
    eps = torch.randn(B, C, H, W, generator=gen)
    a = model.alphas_cumprod[t].view(-1, 1, 1, 1)
    x_t = (a.sqrt() * (2 * x - 1) + (1 - a).sqrt() * eps).float()
    expected = F.mse_loss(0.5 * x_t + t.view(-1, 1, 1, 1) / T, eps)
    torch.testing.assert_close(out["loss"], expected, rtol=1e-6, atol=1e-7)


def test_an_oracle_that_knows_x0_has_zero_loss_and_a_zero_model_has_the_variance_of_eps():
    """ε = (x_t − √ᾱ_t·x0)/√(1 − ᾱ_t) with x0 = 2x − 1 exactly when the loss noises x0 on the
    [−1, 1] scale as the DDPM forward process says."""
    x = pixels()
    big = torch.rand(400, C, H, W, generator=torch.Generator().manual_seed(1))
    alphas = FakeDiffusion(None).alphas_cumprod

    def oracle(data):
        def output(x_t, t):
            a = alphas[t].view(-1, 1, 1, 1).float()
            return (x_t - a.sqrt() * (2 * data - 1)) / (1 - a).sqrt()
        return output

    loss = diffusion_loss(FakeDiffusion(oracle(x)), x, torch.Generator().manual_seed(2))
    assert loss.item() < 1e-10
    zero = diffusion_loss(FakeDiffusion(lambda x_t, t: 0 * x_t), big,
                          torch.Generator().manual_seed(2))
    assert zero.item() == pytest.approx(1.0, abs=0.02)  # E ε² = 1 over 25,600 draws


def test_timesteps_cover_all_of_0_to_t_minus_1():
    seen = []
    model = FakeDiffusion(lambda x_t, t: seen.append(t) or 0 * x_t)
    diffusion_loss(model, torch.rand(500, C, 2, 2), torch.Generator().manual_seed(3))
    assert set(torch.cat(seen).tolist()) == set(range(T))


def test_the_test_column_is_the_loss_on_the_test_split_with_the_given_draws():
    data = load_dataset("digits", "test")
    method = build_method("diffusion")
    model = FakeDiffusion(lambda x_t, t: 0.3 * x_t)
    n = len(data)
    a = method.evaluate(model, data, None, torch.Generator().manual_seed(5), n)
    b = method.evaluate(model, data, None, torch.Generator().manual_seed(5), n)
    assert a == b and set(a) == {"test_loss"}
    x, _ = data.batch(torch.arange(n))
    expected = diffusion_loss(model, x, torch.Generator().manual_seed(5)).item()
    assert a["test_loss"] == pytest.approx(expected, rel=1e-6)
    assert model.training  # evaluate restores the mode


def test_a_tiny_ddpm_unet_gets_a_finite_loss_and_gradients():
    pytest.importorskip("diffusers")
    from smoothcert.models import build_model

    model = build_model("ddpm_unet", 10, (C, H, W), (0.5,), (0.5,),
                        {"width": 8, "levels": 2, "layers_per_block": 1, "timesteps": 50})
    out = build_method("diffusion").loss(model, pixels(), None, None,
                                         torch.Generator().manual_seed(0))
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
