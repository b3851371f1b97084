"""The seed-claims recipes (configs/): every recipe resolves to a valid TrainConfig on the one
shared schedule, epoch-valued hyperparameters fall inside it, and run.py trains exactly these
runs. Fast (no training); not part of ``make test`` (``make studies-smoke`` runs it)."""

import sys
from pathlib import Path

import pytest
import yaml

from smoothcert.training import TrainConfig
from smoothcert.training.recipes import load_recipe

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as driver  # noqa: E402  (the driver next to this file)

SCHEDULE = HERE / "configs" / "_schedule.yaml"
RECIPES = sorted(p for p in (HERE / "configs").glob("*.yaml") if not p.name.startswith("_"))
# a fine-tune starts from a finished model for its own few epochs at its own lr
FINE_TUNE_KEYS = {"epochs", "lr", "lr_schedule", "init_checkpoint"}


def config(path: Path) -> TrainConfig:
    return TrainConfig.from_dict(load_recipe(path))


def schedule() -> dict:
    return yaml.safe_load(SCHEDULE.read_text(encoding="utf-8"))


def test_the_driver_trains_exactly_the_recipes():
    assert sorted(p.stem for p in RECIPES) == sorted(driver.RUNS)
    assert len(set(driver.RUNS)) == len(driver.RUNS)
    for run, parent in driver.FINE_TUNES.items():  # trained after the model it starts from
        assert driver.RUNS.index(parent) < driver.RUNS.index(run)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_extends_the_schedule_and_resolves(path):
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert raw["base"] == SCHEDULE.name
    allowed = FINE_TUNE_KEYS if path.stem in driver.FINE_TUNES else set()
    overridden = (set(raw) & set(schedule())) - allowed - {"format_version"}
    assert not overridden, f"{path.name} overrides the shared schedule: {sorted(overridden)}"
    cfg = config(path)
    sigma = 1e-6 if path.stem == "clean" else {"025": 0.25, "050": 0.5, "100": 1.0}[path.stem[-3:]]
    assert (cfg.sigma, cfg.dataset, cfg.arch) == (sigma, "fashion-mnist", "lenet")
    if path.stem in driver.FINE_TUNES:  # the path the driver trains the parent into
        parent = driver.FINE_TUNES[path.stem]
        assert cfg.init_checkpoint == f"runs/seed-claims/{parent}/checkpoint.pt"


def test_every_run_shares_the_schedule():
    shared = TrainConfig.from_dict({**schedule(), "sigma": 0.5, "method": "gaussian"}).to_dict()
    for path in RECIPES:
        cfg = config(path).to_dict()
        keys = set(schedule()) - (FINE_TUNE_KEYS if path.stem in driver.FINE_TUNES else set())
        assert all(cfg[k] == shared[k] for k in keys if k in shared), path.stem


def test_epoch_hyperparameters_fall_inside_the_schedule():
    epochs, first_decay = schedule()["epochs"], schedule()["lr_milestones"][0]
    cfgs = {p.stem: config(p) for p in RECIPES}
    assert cfgs["macer_s050"].method_params["deferred_epochs"] == first_decay
    for name in ("smoothadv_s050", "smoothadv_consistency_s050", "smoothmix_s050"):
        assert 0 < cfgs[name].method_params["warmup_epochs"] < epochs
    for name in ("easy_focus_s050", "easy_focus_discard_s050"):
        assert first_decay < cfgs[name].method_params["discard_epoch"] < epochs
    for name in ("gaussian_dd_s050", "gaussian_dd900_s050"):
        assert cfgs[name].sigma_mode == "data_dependent"
        assert 0 < cfgs[name].sigma_mode_params["start_epoch"] < epochs
    # the authors' number of σ updates: 10 per epoch over a 90-epoch run, to within one epoch's
    dd = cfgs["gaussian_dd900_s050"].sigma_mode_params
    updates = dd["num_steps"] * (epochs - dd["start_epoch"])
    assert abs(updates - 10 * 90) < dd["num_steps"] and dd["step_size"] == 1e-4


def test_catrs_with_its_teacher_is_the_variant_but_for_the_target():
    """catrs_teacher_s050 is catrs_s050 with the paper's ŷ: the teacher's votes, the teacher
    being the study's own gaussian_s025 (trained before it, where the driver trains it)."""
    variant, paper = (config(HERE / "configs" / f"{n}.yaml").method_params
                      for n in ("catrs_s050", "catrs_teacher_s050"))
    assert variant["target"] == "self" and paper["target"] == "teacher"
    same = ("num_noise", "epsilon", "num_steps", "lbd", "confidence_mask", "double_epsilon_epoch")
    assert all(variant[k] == paper[k] for k in same)
    teacher = driver.TEACHERS["catrs_teacher_s050"]
    assert paper["teacher_checkpoint"] == f"runs/seed-claims/{teacher}/checkpoint.pt"
    assert config(HERE / "configs" / f"{teacher}.yaml").sigma == paper["teacher_sigma"] == 0.25
    assert driver.RUNS.index(teacher) < driver.RUNS.index("catrs_teacher_s050")
