"""Ablation training (Levine & Feizi 2020): the loss sees each example ablated at its own random
position (NaN outside the kept band, block or pixels) through a model built with the authors'
encoding; options, the CLI, the checkpoint and the log's test accuracy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from smoothcert import SmoothcertError
from smoothcert.cli.app import main
from smoothcert.data.datasets import load_dataset
from smoothcert.methods import METHODS, build_method
from smoothcert.models import build_model, model_from_checkpoint
from smoothcert.models.checkpoint import checkpoint_meta, load_checkpoint, save_checkpoint
from smoothcert.training import TrainConfig, Trainer
from smoothcert.training.recipes import load_recipe

B, C, H, W = 8, 1, 8, 8
TRAIN = ["train", "--dataset", "digits", "--arch", "digits_cnn", "--method", "ablation",
         "--epochs", "1", "--batch", "64", "--train-size", "200", "--no-progress",
         "--device", "cpu"]


class Spy(torch.nn.Module):
    """Records what the loss feeds the model; the logits are a fixed function of it."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2 * C * H * W, 10)
        self.seen = []

    def forward(self, x):
        self.seen.append(x.detach().clone())
        kept = ~torch.isnan(x)
        return self.linear(torch.cat([torch.where(kept, x, 0.0), kept.float()], 1).flatten(1))


def batch():
    gen = torch.Generator().manual_seed(1)
    return torch.rand(B, C, H, W, generator=gen), torch.randint(0, 10, (B,), generator=gen)


@pytest.mark.parametrize("params, kept", [({"mode": "column", "size": 2}, 2 * H),
                                          ({"mode": "block", "size": 3}, 9),
                                          ({"mode": "pixels", "keep": 5}, 5)])
def test_the_loss_sees_nan_ablated_inputs_with_the_right_number_of_kept_pixels(params, kept):
    method, model, (x, y) = build_method("ablation", **params), Spy(), batch()
    out = method.loss(model, x, y, None, torch.Generator().manual_seed(0))
    (seen,) = model.seen
    is_kept = ~torch.isnan(seen)
    assert is_kept.flatten(1).sum(1).tolist() == [kept] * B
    assert torch.equal(seen[is_kept], x[is_kept])  # kept pixels are the image's own
    assert len({tuple(m.flatten().tolist()) for m in is_kept}) > 1  # each example its own draw
    torch.testing.assert_close(out["loss"], F.cross_entropy(out["logits"], y), rtol=0, atol=0)


@pytest.mark.parametrize("params", [{"mode": "column", "size": 3}, {"mode": "block", "size": 2},
                                    {"mode": "pixels", "keep": 7}])
def test_the_loss_ablates_with_the_schemes_masks_drawn_from_the_generator(params):
    method, (x, _) = build_method("ablation", **params), batch()
    ablated = method.ablate(x, torch.Generator().manual_seed(4))
    masks = method.scheme.random_masks(x.shape[0], x.shape[-3:], torch.Generator().manual_seed(4))
    assert torch.equal(~ablated.isnan()[:, 0], masks)
    if params["mode"] != "pixels":  # the batched masks are the positions' one by one
        pos = torch.randint(method.scheme.positions(x.shape[-3:]), (x.shape[0],),
                            generator=torch.Generator().manual_seed(4))
        one_by_one = [method.scheme.sweep_masks(x.shape[-3:], int(p), 1)[0] for p in pos]
        assert torch.equal(masks, torch.stack(one_by_one))


def test_the_draws_come_from_the_generator_and_nothing_else():
    method, (x, _) = build_method("ablation", mode="block", size=3), batch()
    a, b = (method.ablate(x, torch.Generator().manual_seed(s)) for s in (5, 5))
    assert torch.equal(a.isnan(), b.isnan())
    assert not torch.equal(a.isnan(), method.ablate(x, torch.Generator().manual_seed(6)).isnan())


def test_the_method_declares_its_encoding_no_noise_and_the_authors_optimizer():
    cls = METHODS["ablation"]
    assert cls.input_encoding == "ablation" and not cls.uses_noise and cls.trains == "classifier"
    assert cls.training_defaults() == {"optimizer": "sgd", "lr": 0.01, "weight_decay": 5e-4,
                                       "lr_schedule": "constant"}
    assert build_method("ablation").hparams() == {"mode": "column", "size": 4, "keep": 45}
    assert all(m.input_encoding is None for n, m in METHODS.items() if n != "ablation")


@pytest.mark.parametrize("params, match", [
    ({"mode": "rows"}, "mode.*column, block, pixels"),
    ({"size": 0}, "size must be an integer >= 1, got 0"),
    ({"keep": 0}, "keep must be an integer >= 1, got 0"),
    ({"keep": -3, "mode": "pixels"}, "keep must be an integer >= 1, got -3"),
])
def test_bad_options_are_one_line(params, match):
    with pytest.raises(SmoothcertError, match=match):
        build_method("ablation", **params)


def test_a_band_wider_than_the_images_is_refused_before_training():
    config = TrainConfig(dataset="digits", arch="digits_cnn", method="ablation", epochs=1,
                         method_params={"size": 9})
    with pytest.raises(SmoothcertError, match="a band of 9 columns is wider than the image "
                                              "\\(8 columns\\)"):
        Trainer(config)
    block = TrainConfig.from_dict({**config.to_dict(), "method_params": {"mode": "block",
                                                                          "size": 9}})
    with pytest.raises(SmoothcertError, match="9x9 block does not fit a 8x8 image"):
        Trainer(block)


def test_evaluate_is_the_accuracy_on_one_random_ablation_per_test_image():
    method, model = build_method("ablation", mode="column", size=2), Spy()
    data = load_dataset("digits", "test")
    got = method.evaluate(model, data, None, torch.Generator().manual_seed(9), batch_size=100)
    gen = torch.Generator().manual_seed(9)
    x = torch.cat([method.ablate(data.batch(i)[0], gen)
                   for i in torch.arange(len(data)).split(100)])
    seen = torch.cat(model.seen)
    assert torch.equal(seen.isnan(), x.isnan()) and torch.equal(seen.nan_to_num(), x.nan_to_num())
    assert (~seen.isnan()).flatten(1).sum(1).eq(2 * H).all()  # one band of 2 columns each
    with torch.no_grad():
        correct = (model.eval()(x).argmax(1) == data.labels).sum().item()
    assert got == {"test_acc": correct / len(data)}


def test_train_from_the_cli_writes_an_encoded_checkpoint_that_loads_back(tmp_path):
    out = tmp_path / "col"
    assert main([*TRAIN, "--param", "mode=column", "--param", "size=2", "--out", str(out)]) == 0
    ckpt = load_checkpoint(out)
    assert ckpt.meta["input_encoding"] == "ablation" and ckpt.meta["noise"] is None
    assert ckpt.meta["method"]["hparams"] == {"mode": "column", "size": 2, "keep": 45}
    assert yaml.safe_load((out / "config.yaml").read_text())["sigma"] is None
    model, _ = model_from_checkpoint(out)
    assert model.input_encoding == "ablation"
    x = build_method("ablation", size=2).ablate(torch.rand(4, C, H, W),
                                                 torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()


def test_init_from_a_plain_classifier_is_refused_in_one_line(tmp_path, capsys):
    plain = save_checkpoint(tmp_path / "plain.pt", build_model(
        "digits_cnn", 10, (C, H, W), [0.3], [0.4]), checkpoint_meta(
        arch="digits_cnn", dataset="digits", num_classes=10, input_shape=(C, H, W), mean=[0.3],
        std=[0.4], noise=None, method={"name": "standard", "hparams": {}}, epoch=1, config={}))
    assert main([*TRAIN, "--init-from", str(plain), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "input encoding none, but method ablation trains one with ablation" in err


@pytest.mark.parametrize("params, words", [
    (["mode=rows"], "column, block, pixels"),
    (["size=0"], "size must be an integer >= 1, got 0"),
    (["mode=column", "size=9"], "a band of 9 columns is wider than the image (8 columns)"),
    (["mode=pixels", "keep=0"], "keep must be an integer >= 1, got 0"),
    (["mode=pixels", "keep=65"], "keep=65 is more than the image's 64 pixels"),
    (["mode=block", "size=9", "--sigma", "0.25"],
     "method ablation trains without noise, so it takes no --sigma (got 0.25); remove it"),
])
def test_bad_options_from_the_cli_are_one_line_and_exit_2(tmp_path, capsys, params, words):
    out = tmp_path / "bad"
    args = [a for p in params for a in (("--param", p) if "=" in p else (p,))]
    assert main([*TRAIN, *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err
    assert not out.exists() or not any(out.iterdir())


def test_train_help_lists_the_ablation_method_and_its_options(capsys):
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "ablation" in text and "Levine & Feizi" in text
    for words in ("mode (column|block|pixels, default column)", "size (int, default 4)",
                  "keep (int, default 45)"):
        assert words in text, words


def test_the_recipes_hold_the_authors_mnist_settings():
    """configs/fashion-mnist/ablation_*.yaml (each number's source is in the file): the
    network, optimizer and two-phase schedule of alevine0/patchSmoothing's MNIST scripts, and
    of alevine0/randomizedAblation's for pixels (no weight decay there)."""
    configs = Path(__file__).resolve().parents[2] / "configs" / "fashion-mnist"
    kept = {}
    for mode in ("column", "block", "pixels"):
        c = TrainConfig.from_dict(load_recipe(configs / f"ablation_{mode}.yaml"))
        assert (c.method, c.arch, c.dataset, c.sigma) == ("ablation", "ablation_cnn",
                                                          "fashion-mnist", None)
        assert (c.optimizer, c.lr, c.momentum, c.weight_decay, c.batch_size) == \
            ("sgd", 0.01, 0.9, 0.0 if mode == "pixels" else 5e-4, 128)
        assert (c.epochs, c.lr_schedule, c.lr_milestones, c.lr_gamma) == \
            (400, "multistep", (200,), 0.1)
        assert c.method_params["mode"] == mode
        kept[mode] = c.method_params["keep" if mode == "pixels" else "size"]
    assert kept == {"column": 2, "block": 10, "pixels": 45}
