"""The step-5 study (configs/fashion-mnist/study/, results/step5_study.sh): every recipe resolves
to a valid TrainConfig on the one shared schedule, and the driver trains exactly these runs."""

import re
from pathlib import Path

import pytest
import yaml

from smoothcert.recipes import load_recipe
from smoothcert.training import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "configs" / "fashion-mnist" / "study"
SCHEDULE = STUDY / "_schedule.yaml"
RECIPES = sorted(p for p in STUDY.glob("*.yaml") if not p.name.startswith("_"))
DRIVER = ROOT / "results" / "step5_study.sh"
# heat fine-tunes the finished gaussian_s050 model for its own few epochs at its own lr
FINE_TUNE = {"heat_s050": {"epochs", "lr", "lr_schedule"}}


def _config(path: Path) -> TrainConfig:
    return TrainConfig.from_dict(load_recipe(path))


def _schedule() -> dict:
    return yaml.safe_load(SCHEDULE.read_text(encoding="utf-8"))


def test_the_study_has_the_runs_of_issue_6():
    names = {p.stem for p in RECIPES}
    sigmas = {f"{m}_s{s}" for m in ("gaussian", "consistency") for s in ("025", "050", "100")}
    at_050 = {f"{m}_s050" for m in ("stability", "smoothadv", "smoothadv_consistency", "macer",
                                     "easy_focus", "easy_focus_discard", "easy_focus_reweigh",
                                     "easy_focus_attack", "heat", "gaussian_dd")}
    assert names == sigmas | at_050


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_extends_the_schedule_and_resolves(path):
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert raw["base"] == SCHEDULE.name
    overridden = (set(raw) & set(_schedule())) - FINE_TUNE.get(path.stem, set())
    assert not overridden, f"{path.name} overrides the shared schedule: {sorted(overridden)}"
    config = _config(path)
    sigma = {"025": 0.25, "050": 0.5, "100": 1.0}[path.stem[-3:]]
    assert config.sigma == sigma and config.dataset == "fashion-mnist" and config.arch == "lenet"


def test_every_run_shares_the_schedule():
    schedule = TrainConfig.from_dict(
        {**_schedule(), "sigma": 0.5, "method": "gaussian"}).to_dict()
    for path in RECIPES:
        config = _config(path).to_dict()
        for key in _schedule():
            if key not in FINE_TUNE.get(path.stem, set()):
                assert config[key] == schedule[key], f"{path.stem}: {key}"


def test_epoch_hyperparameters_fall_inside_the_schedule():
    epochs, first_decay = _schedule()["epochs"], _schedule()["lr_milestones"][0]
    configs = {p.stem: _config(p) for p in RECIPES}
    assert configs["macer_s050"].method_params["deferred_epochs"] == first_decay
    for name in ("smoothadv_s050", "smoothadv_consistency_s050"):
        assert 0 < configs[name].method_params["warmup_epochs"] < epochs
    for name in ("easy_focus_s050", "easy_focus_discard_s050"):
        assert first_decay < configs[name].method_params["discard_epoch"] < epochs
    dd = configs["gaussian_dd_s050"]
    assert dd.sigma_mode == "data_dependent" and 0 < dd.dd_start_epoch < epochs


def test_method_hyperparameters_follow_the_papers():
    configs = {p.stem: _config(p) for p in RECIPES}
    # Jeong & Shin, MNIST (supplement Table 2): λ = 10 at σ = 0.25, 5 at 0.5 and 1.0; m = 2, η = ½
    for name, lbd in (("consistency_s025", 10.0), ("consistency_s050", 5.0),
                      ("consistency_s100", 5.0)):
        params = configs[name].method_params
        assert (params["lbd"], params["num_noise"], params["eta"]) == (lbd, 2, 0.5)
    assert configs["smoothadv_consistency_s050"].method_params["lbd"] == 1.0
    assert configs["smoothadv_s050"].method_params["lbd"] == 0.0
    parts = {name: tuple(configs[name].method_params[k] for k in ("discard", "reweigh", "attack"))
             for name in configs if name.startswith("easy_focus")}
    assert parts == {"easy_focus_s050": (True, True, True),
                     "easy_focus_discard_s050": (True, False, False),
                     "easy_focus_reweigh_s050": (False, True, False),
                     "easy_focus_attack_s050": (False, False, True)}
    assert configs["heat_s050"].init_checkpoint == "runs/step5/gaussian_s050/checkpoint.pt"


def test_the_driver_trains_exactly_the_study_recipes():
    text = DRIVER.read_text(encoding="utf-8")
    runs = re.search(r"^RUNS=\(([^)]*)\)", text, flags=re.MULTILINE).group(1).split()
    assert sorted(runs) == sorted(p.stem for p in RECIPES)
    assert runs.index("gaussian_s050") < runs.index("heat_s050")  # heat starts from it
    assert "configs/fashion-mnist/study" in text and "set -euo pipefail" in text
