"""The step-5 study (configs/fashion-mnist/study/, results/step5_study.sh): every recipe resolves
to a valid TrainConfig on the one shared schedule, and the driver trains exactly these runs."""

import re
from pathlib import Path

import pytest
import yaml

from smoothcert.training import TrainConfig
from smoothcert.training.recipes import load_recipe

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "configs" / "fashion-mnist" / "study"
SCHEDULE = STUDY / "_schedule.yaml"
RECIPES = sorted(p for p in STUDY.glob("*.yaml") if not p.name.startswith("_"))
DRIVER = ROOT / "results" / "step5_study.sh"
# heat fine-tunes a finished model (heat_s050: gaussian_s050, heat_g*: clean) for its own few
# epochs at its own lr
HEAT_SWEEP = ("heat_g0006_s050", "heat_g001_s050", "heat_g003_s050", "heat_g01_s050")
FINE_TUNE = {name: {"epochs", "lr", "lr_schedule"} for name in ("heat_s050", *HEAT_SWEEP)}


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
    step9 = {"smoothmix_s050", "catrs_s050", "clean", "gaussian_dd900_s050", *HEAT_SWEEP}
    assert names == sigmas | at_050 | step9


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_extends_the_schedule_and_resolves(path):
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert raw["base"] == SCHEDULE.name
    overridden = (set(raw) & set(_schedule())) - FINE_TUNE.get(path.stem, set())
    assert not overridden, f"{path.name} overrides the shared schedule: {sorted(overridden)}"
    config = _config(path)
    sigma = 1e-6 if path.stem == "clean" else {"025": 0.25, "050": 0.5, "100": 1.0}[path.stem[-3:]]
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
    assert 0 < configs["smoothmix_s050"].method_params["warmup_epochs"] < epochs
    for name in ("gaussian_dd_s050", "gaussian_dd900_s050"):
        dd = configs[name]
        assert dd.sigma_mode == "data_dependent" and 0 < dd.dd_start_epoch < epochs
    # the authors' number of σ updates: 10 per epoch over a 90-epoch run, to within one epoch's
    dd = configs["gaussian_dd900_s050"]
    updates = dd.dd_steps * (epochs - dd.dd_start_epoch)
    assert abs(updates - 10 * 90) < dd.dd_steps and dd.dd_step_size == 1e-4


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
    # SmoothMix, MNIST σ = 0.5 (EXPERIMENTS.MD): m = 4, T = 4, α = 1, η = 5, mix_step 0
    params = configs["smoothmix_s050"].method_params
    assert (params["num_noise"], params["num_steps"], params["alpha"], params["eta"],
            params["mix_step"]) == (4, 4, 1.0, 5.0, 0)
    # CAT-RS, MNIST: m = 4, ε = 1 (256/256), T = 4, λ = 1
    params = configs["catrs_s050"].method_params
    assert (params["num_noise"], params["epsilon"], params["num_steps"], params["lbd"]) == (
        4, 1.0, 4, 1.0)
    # HeatSmoothing as the final ImageNet script, one epoch from the clean model, γ bracketing
    # the ImageNet-equivalent 0.006
    assert configs["clean"].method == "gaussian" and configs["clean"].sigma < 1 / 255 / 100
    gammas = []
    for name in HEAT_SWEEP:
        config = configs[name]
        params = config.method_params
        assert config.init_checkpoint == "runs/step5/clean/checkpoint.pt"
        assert (config.epochs, config.lr, params["num_steps"], params["fd_step"],
                params["distance"], params["noise_schedule"]) == (
            1, 0.01, 1, 0.01, "softmax_mse", "linear")
        gammas.append(params["gamma"])
    assert min(gammas) == 0.006 and max(gammas) >= 10 * 0.006


def test_the_driver_trains_exactly_the_study_recipes():
    text = DRIVER.read_text(encoding="utf-8")
    runs = re.search(r"^RUNS=\(([^)]*)\)", text, flags=re.MULTILINE).group(1).split()
    assert sorted(runs) == sorted(p.stem for p in RECIPES)
    assert runs.index("gaussian_s050") < runs.index("heat_s050")  # heat starts from it
    assert all(runs.index("clean") < runs.index(name) for name in HEAT_SWEEP)
    assert "configs/fashion-mnist/study" in text and "set -euo pipefail" in text
