"""The recipes in configs/: each resolves to a valid TrainConfig, and `base` chains merge.
(Recipes and run configs of older versions: tests/test_upgrade.py.)"""

from pathlib import Path

import pytest
import yaml

from smoothcert.errors import SmoothcertError
from smoothcert.methods import METHODS
from smoothcert.training import TrainConfig
from smoothcert.training.recipes import load_recipe
from smoothcert.upgrade import CONFIG_VERSION

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RECIPES = sorted(p for p in CONFIGS.rglob("*.yaml") if not p.name.startswith("_"))


def test_there_are_recipes_for_every_registered_method_on_fashion_mnist():
    methods = {load_recipe(p)["method"] for p in CONFIGS.glob("fashion-mnist/*.yaml")
               if not p.name.startswith("_")}
    assert methods >= set(METHODS)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recipe_is_a_valid_train_config(path):
    fields = load_recipe(path)
    if METHODS[fields["method"]].frozen_classifier == "required":  # given on the command line
        assert "classifier" not in fields
        fields["classifier"] = "runs/standard/checkpoint.pt"
    config = TrainConfig.from_dict(fields)
    assert config.epochs >= 1
    if path.stem == "clean":  # the study's clean-trained model: σ far below one grey level
        assert config.sigma < 1 / 255 / 100
        return
    if config.sigma is None:  # a method without noise: named after the method (and variant)
        assert path.stem == config.method or path.stem.startswith(f"{config.method}_")
        return
    assert config.sigma in (0.12, 0.25, 0.5, 1.0)  # 0.12: Salman et al.'s denoisers
    assert path.stem.startswith(config.method)
    assert path.stem.endswith(f"_s{str(config.sigma).replace('.', '').ljust(3, '0')}")


def test_the_denoiser_recipes_are_salman_et_al_s_settings():
    """configs/cifar10: the authors' train_denoiser.py defaults (Adam 1e-3, weight decay 1e-4,
    StepLR 30 × 0.1, batch 256, 90 epochs, cifar_dncnn), their train_classifier.py defaults for
    the classifier (SGD 0.1, weight decay 5e-4, StepLR 30 × 0.1, 90 epochs, ResNet-110), and
    their MSE-then-stability fine-tuning (20 epochs of Adam at 1e-5)."""
    def config(name, **more):
        return TrainConfig.from_dict({**load_recipe(CONFIGS / "cifar10" / name), **more})

    mse = config("denoiser-mse_s025.yaml")
    assert (mse.arch, mse.arch_kwargs, mse.sigma) == ("dncnn", {"depth": 17, "width": 64}, 0.25)
    assert (mse.optimizer, mse.lr, mse.weight_decay, mse.batch_size, mse.epochs) == \
        ("adam", 1e-3, 1e-4, 256, 90)
    assert (mse.lr_schedule, mse.lr_step_size, mse.lr_gamma) == ("step", 30, 0.1)
    stab = config("denoiser-stability_s025.yaml", classifier="c.pt")
    assert (stab.method, stab.optimizer, stab.lr, stab.epochs) == \
        ("denoiser-stability", "adam", 1e-5, 20)
    clf = config("standard.yaml")
    assert (clf.arch, clf.sigma, clf.optimizer, clf.lr, clf.weight_decay, clf.epochs) == \
        ("cifar_resnet110", None, "sgd", 0.1, 5e-4, 90)
    assert (clf.lr_schedule, clf.lr_step_size, clf.batch_size) == ("step", 30, 256)


def test_every_recipe_states_the_config_format_it_is_written_in():
    for path in CONFIGS.rglob("*.yaml"):
        assert yaml.safe_load(path.read_text())["format_version"] == CONFIG_VERSION, path


def test_base_chain_and_method_params_merge(tmp_path):
    (tmp_path / "a.yaml").write_text("dataset: digits\narch: digits_cnn\nepochs: 3\n"
                                     "method_params: {num_noise: 2, lbd: 1.0}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nepochs: 5\nmethod_params: {lbd: 7.0}\n")
    assert load_recipe(tmp_path / "b.yaml") == {
        "dataset": "digits", "arch": "digits_cnn", "epochs": 5,
        "method_params": {"num_noise": 2, "lbd": 7.0}, "format_version": CONFIG_VERSION}
    fmnist = load_recipe(CONFIGS / "fashion-mnist" / "consistency_s050.yaml")
    assert fmnist["dataset"] == "fashion-mnist" and fmnist["lr_milestones"] == [30, 60]
    assert fmnist["method_params"]["lbd"] == 5.0


def test_bad_recipes(tmp_path):
    (tmp_path / "loop.yaml").write_text("base: loop.yaml\n")
    with pytest.raises(SmoothcertError, match="includes itself"):
        load_recipe(tmp_path / "loop.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(SmoothcertError, match="mapping"):
        load_recipe(tmp_path / "list.yaml")
    with pytest.raises(SmoothcertError, match="cannot read"):
        load_recipe(tmp_path / "missing.yaml")


@pytest.mark.parametrize("content, message", [
    (b"\x00\xff\xfe", r"recipe .*base\.yaml is not a text file: byte 0xff at offset 1 is not "
                     r"UTF-8"),
    (b"epochs: [1\nseed: 2\n", r"recipe .*base\.yaml is not valid YAML: expected ',' or ']', "
                               r"but got ':' \(line 2, column 5\)$"),
    (b"seed: !!python/name:os.system\n", r"tag '!!python/name:os.system' is not allowed"),
    (b"seed: !custom 3\n", r"tag '!custom' is not allowed, only plain YAML values "
                           r"\(line 1, column 7\)$"),
    (b"a: &x [*x]\n", r"base\.yaml contains itself"),
    (b"a: " + b"[" * 1000, r"base\.yaml is not valid YAML: nested too deeply$"),
])
def test_a_base_recipe_that_is_not_yaml_text_is_one_line_naming_it(tmp_path, content, message):
    # the chain names the file at fault, here the base, not the recipe the user gave
    (tmp_path / "base.yaml").write_bytes(content)
    (tmp_path / "r.yaml").write_text("base: base.yaml\nepochs: 3\n")
    with pytest.raises(SmoothcertError, match=message) as info:
        load_recipe(tmp_path / "r.yaml")
    assert "\n" not in str(info.value)


def test_a_folder_as_recipe(tmp_path):
    with pytest.raises(SmoothcertError, match=r"cannot read recipe .*: Is a directory$"):
        load_recipe(tmp_path)
