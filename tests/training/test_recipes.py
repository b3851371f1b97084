"""The recipes in configs/: each resolves to a valid TrainConfig, and `base` chains merge.
(Recipes and run configs of older versions: tests/test_upgrade.py.)"""

from pathlib import Path

import pytest
import yaml

from smoothcert.errors import SmoothcertError
from smoothcert.training import TrainConfig
from smoothcert.training.recipes import load_recipe
from smoothcert.upgrade import CONFIG_VERSION

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RECIPES = sorted(p for p in CONFIGS.rglob("*.yaml") if not p.name.startswith("_"))


def test_there_are_recipes_for_every_registered_method_on_fashion_mnist():
    from smoothcert.methods import METHODS

    methods = {load_recipe(p)["method"] for p in CONFIGS.glob("fashion-mnist/*.yaml")
               if not p.name.startswith("_")}
    assert methods >= set(METHODS)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recipe_is_a_valid_train_config(path):
    fields = load_recipe(path)
    config = TrainConfig.from_dict(fields)
    assert config.epochs >= 1
    if path.stem == "clean":  # the study's clean-trained model: σ far below one grey level
        assert config.sigma < 1 / 255 / 100
        return
    assert config.sigma in (0.25, 0.5, 1.0)
    assert f"s{str(config.sigma).replace('.', '').ljust(3, '0')}" in path.stem


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
