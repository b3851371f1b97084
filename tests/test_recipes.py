"""The recipes in configs/: each resolves to a valid TrainConfig, and `base` chains merge."""

import inspect
from pathlib import Path

import pytest
import yaml

from smoothcert.errors import SmoothcertError
from smoothcert.training import TrainConfig
from smoothcert.training.recipes import load_recipe

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
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


def test_base_chain_and_method_params_merge(tmp_path):
    (tmp_path / "a.yaml").write_text("dataset: digits\narch: digits_cnn\nepochs: 3\n"
                                     "method_params: {num_noise: 2, lbd: 1.0}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nepochs: 5\nmethod_params: {lbd: 7.0}\n")
    assert load_recipe(tmp_path / "b.yaml") == {
        "dataset": "digits", "arch": "digits_cnn", "epochs": 5,
        "method_params": {"num_noise": 2, "lbd": 7.0}}
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


# --------------------------------------------------------------------------- committed runs
RESULTS = CONFIGS.parent / "results"
RUN_CONFIGS = sorted(RESULTS.rglob("*config.yaml"))
OLD_KEYS = {"dd_steps": "num_steps", "dd_step_size": "step_size", "dd_num_samples": "num_samples",
            "dd_start_epoch": "start_epoch"}


def test_the_old_dd_keys_are_the_documented_ones():
    from smoothcert.training.config import LEGACY_SIGMA_PARAMS

    assert LEGACY_SIGMA_PARAMS == OLD_KEYS
    names = list(inspect.signature(TrainConfig).parameters)
    assert names[-len(OLD_KEYS):] == list(OLD_KEYS)  # the init-only arguments, in this order


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_committed_run_configs_still_load(path):
    """Every config.yaml written by a committed run reads as the run it was: those written
    before noise and sigma_mode_params were fields as Gaussian noise with their dd_* keys as the
    data-dependent σ mode's parameters, the newer ones as they state."""
    fields = yaml.safe_load(path.read_text())
    config = TrainConfig.from_dict(fields)
    assert config.noise == fields.get("noise", "gaussian") == "gaussian"
    if "sigma_mode_params" in fields:
        assert config.sigma_mode_params == fields["sigma_mode_params"]
    elif config.sigma_mode == "data_dependent":
        assert config.sigma_mode_params == {new: fields[old] for old, new in OLD_KEYS.items()}
    else:
        assert config.sigma_mode_params == {}
    assert TrainConfig.from_dict(config.to_dict()) == config


def test_committed_checkpoint_config_still_loads():
    from smoothcert.models.checkpoint import load_checkpoint

    meta = load_checkpoint(RESULTS / "step4" / "fmnist_lenet_s025.pt").meta
    config = TrainConfig.from_dict(meta["config"])
    assert (config.noise, config.sigma_mode, config.sigma) == ("gaussian", "fixed", 0.25)
    assert meta["noise"] == {"name": config.noise, "sigma": config.sigma}


def test_the_data_dependent_recipe_in_either_spelling(tmp_path):
    path = CONFIGS / "fashion-mnist" / "study" / "gaussian_dd_s050.yaml"
    old = TrainConfig.from_dict(load_recipe(path))
    assert old.sigma_mode_params == {"num_steps": 1, "step_size": 1e-4, "num_samples": 1,
                                     "start_epoch": 4}
    text = path.read_text()
    for key in OLD_KEYS:
        text = "\n".join(line for line in text.splitlines() if not line.startswith(key))
    (tmp_path / "new.yaml").write_text(
        text.replace("base: _schedule.yaml", f"base: {path.parent / '_schedule.yaml'}")
        + "\nsigma_mode_params: {start_epoch: 4}\n")
    assert TrainConfig.from_dict(load_recipe(tmp_path / "new.yaml")) == old
