"""The one options idiom (``smoothcert.registry``): typed parsing of KEY=VALUE text and Python
values alike, one-line errors naming the plug-in and the key, ``--help`` lines from the
dataclass, and every registered method and attack built through it with the identity it had."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from smoothcert.certifiers import CERTIFIERS, build_certifier, certifying
from smoothcert.errors import SmoothcertError, check_count
from smoothcert.methods import METHODS, build_method
from smoothcert.registry import (
    Configurable,
    describe_options,
    option,
    option_defaults,
    parse_options,
)
from smoothcert.smoothing.attacks import ATTACKS
from smoothcert.training.sigma_modes import SIGMA_MODES, build_sigma_mode


@dataclass(frozen=True)
class Toy:
    steps: int = option(3, "T: steps")
    rate: float = option(0.5, "step size, pixel units")
    fresh: bool = option(False, "redraw every step")
    mode: Literal["a", "b"] = option("a", "which variant")
    kind: str = option("x", "a string with choices", choices=("x", "y"))
    cap: float | None = option(None, "an optional cap (null: none)")
    clamp: tuple[float, ...] = option((0.1, 0.9), "bounds")

    def __post_init__(self):
        check_count("steps", self.steps)


def parse(**given):
    return parse_options("method", "toy", Toy, given, what="hyperparameter")


# --------------------------------------------------------------------------- parsing
def test_text_and_typed_values_give_equal_options():
    text = parse(steps="4", rate="1e-2", fresh="True", mode="b", kind="y", cap="null",
                 clamp="[0.2, 0.8]")
    typed = parse(steps=4, rate=0.01, fresh=True, mode="b", kind="y", cap=None,
                  clamp=[0.2, 0.8])
    assert text == typed == Toy(4, 0.01, True, "b", "y", None, (0.2, 0.8))
    assert parse(clamp="0.2,0.8").clamp == (0.2, 0.8)


def test_an_int_is_widened_to_a_float_field_and_stays_typed():
    options = parse(rate=1, cap=2)
    assert (options.rate, options.cap) == (1.0, 2.0)
    assert type(options.rate) is float and type(options.cap) is float


def test_nothing_given_is_the_defaults():
    assert parse() == Toy()
    assert option_defaults(Toy) == {"steps": 3, "rate": 0.5, "fresh": False, "mode": "a",
                                    "kind": "x", "cap": None, "clamp": (0.1, 0.9)}


@pytest.mark.parametrize(
    "given, match",
    [
        ({"stepz": 1}, r"^unknown hyperparameter\(s\) stepz for method 'toy'; valid: steps, "
                       r"rate, fresh, mode, kind, cap, clamp$"),
        ({"steps": 2.5}, r"^method 'toy': steps must be an integer, got 2.5$"),
        ({"steps": True}, "steps must be an integer, got True"),
        ({"steps": "two"}, "steps must be an integer, got 'two'"),
        ({"rate": "fast"}, "rate must be a number, got 'fast'"),
        ({"rate": False}, "rate must be a number"),
        ({"fresh": "yes"}, "fresh must be true or false, got 'yes'"),
        ({"fresh": 1}, "fresh must be true or false"),
        ({"mode": "c"}, "unknown mode 'c'; mode must be one of a, b"),
        ({"kind": "z"}, "unknown kind 'z'; kind must be one of x, y"),
        ({"cap": "far"}, "cap must be a number or null, got 'far'"),
        ({"clamp": "0.1,x"}, "clamp must be a list of numbers"),
        ({"clamp": 0.5}, "clamp must be a list of numbers"),
        ({"steps": 0}, r"^method 'toy': steps must be an integer >= 1, got 0$"),  # __post_init__
    ],
)
def test_bad_options_raise_one_line_naming_plugin_and_key(given, match):
    with pytest.raises(SmoothcertError, match=match) as err:
        parse(**given)
    assert "\n" not in str(err.value)


def test_describe_options_lists_type_default_and_doc():
    assert describe_options(Toy) == [
        "steps (int, default 3): T: steps",
        "rate (float, default 0.5): step size, pixel units",
        "fresh (bool, default false): redraw every step",
        "mode (a|b, default a): which variant",
        "kind (x|y, default x): a string with choices",
        "cap (float|null, default null): an optional cap (null: none)",
        "clamp (list, default 0.1,0.9): bounds",
    ]


def test_a_mutable_default_is_refused():
    with pytest.raises(TypeError, match="mutable"):
        option([1, 2], "a list")


# --------------------------------------------------------------------------- Configurable
class Plugin(Configurable):
    plugin_kind = "toy plug-in"
    Options = Toy
    name = "toy"

    def setup(self):
        self.derived = self.steps * self.rate


def test_keywords_and_an_options_instance_build_the_same_plugin():
    by_keywords = Plugin(steps=4, rate=1)
    by_instance = Plugin(Toy(steps=4, rate=1))  # an int in a float field: re-parsed, widened
    assert by_keywords.option_values() == by_instance.option_values()
    assert type(by_instance.rate) is float and by_instance.settings == Toy(4, 1.0)
    assert by_keywords.derived == 4.0  # setup() ran after the options were copied


def test_positional_values_and_mixed_calls_are_refused():
    with pytest.raises(TypeError):
        Plugin(4)
    with pytest.raises(TypeError):
        Plugin(Toy(), steps=2)


def test_errors_name_the_plugin():
    with pytest.raises(SmoothcertError, match="^toy plug-in 'toy': steps must be an integer"):
        Plugin(steps="many")


def test_an_option_may_not_shadow_an_attribute():
    with pytest.raises(TypeError, match="steps shadow"):
        class Clash(Configurable):  # noqa: F841 - the class statement itself raises
            Options = Toy

            def steps(self):
                return None


# --------------------------------------------------------------------------- every plug-in
DEFAULT_HPARAMS = {  # what checkpoints and configs stored before the idiom: keys, order, types
    "gaussian": {"num_noise": 1},
    "stability": {"lbd": 2.0},
    "consistency": {"num_noise": 2, "lbd": 10.0, "eta": 0.5, "variant": "default"},
    "macer": {"num_noise": 16, "lbd": 12.0, "gamma": 8.0, "beta": 16.0, "deferred_epochs": 0},
    "smoothadv": {"attack": "pgd", "epsilon": 1.0, "num_steps": 10, "num_noise": 4,
                  "multi_noise": True, "warmup_epochs": 10, "lbd": 0.0, "eta": 0.5},
    "smoothmix": {"num_noise": 4, "num_steps": 8, "alpha": 1.0, "eta": 1.0, "mix_step": 0,
                  "maxnorm": None, "maxnorm_s": None, "warmup_epochs": 10},
    "catrs": {"num_noise": 4, "epsilon": 1.0, "num_steps": 4, "lbd": 1.0,
              "confidence_mask": False, "double_epsilon_epoch": None, "target": "teacher",
              "teacher_checkpoint": "t.pt", "teacher_sigma": 0.25, "teacher_draws": 10000},
    "heat": {"num_steps": 1, "gamma": 0.006, "num_projections": 10, "fd_step": 0.01,
             "noise_fraction": 0.5, "distance": "softmax_mse", "noise_schedule": "linear"},
    "easy_focus": {"num_noise": 4, "discard": True, "reweigh": True, "attack": True,
                   "discard_epoch": 60, "discard_threshold": 0.5, "attack_steps": 3,
                   "attack_step_size": 0.25},
    # Step 12's methods have no hyperparameters: their objectives are fixed by the papers.
    "standard": {}, "denoiser-mse": {}, "denoiser-stability": {}, "diffusion": {},
    # Step 16: what is kept (Levine & Feizi 2020): band/block side b, or k pixels
    "ablation": {"mode": "column", "size": 4, "keep": 45},
    # Step 22: the transformation of TSS (Li et al. 2021), required where it is used
    "transform": {"transform": ""},
}


# What a method cannot be built without (CAT-RS's default target is a teacher's ŷ).
NEEDS = {"catrs": {"teacher_checkpoint": "t.pt"}}


def _text(value) -> str:
    """``value`` as a user would type it after KEY=."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


@pytest.mark.parametrize("name", sorted(DEFAULT_HPARAMS))
def test_default_hyperparameters_are_what_checkpoints_stored(name):
    hparams = build_method(name, **NEEDS.get(name, {})).hparams()
    assert list(hparams.items()) == list(DEFAULT_HPARAMS[name].items())
    assert [type(v) for v in hparams.values()] == [type(v) for v in DEFAULT_HPARAMS[name].values()]


def test_every_registered_method_is_pinned_above():
    assert set(METHODS) == set(DEFAULT_HPARAMS)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_hyperparameters_round_trip_as_values_and_as_text(name):
    method = build_method(name, **NEEDS.get(name, {}))
    again = build_method(name, **method.hparams())
    from_text = build_method(name, **{k: _text(v) for k, v in method.hparams().items()})
    assert again.hparams() == from_text.hparams() == method.hparams()
    assert [type(v) for v in from_text.hparams().values()] == \
        [type(v) for v in method.hparams().values()]


REGISTRIES = {"methods": METHODS, "attacks": ATTACKS, "certifiers": CERTIFIERS,
              "sigma modes": SIGMA_MODES}


@pytest.mark.parametrize("registry", REGISTRIES.values(), ids=REGISTRIES.keys())
def test_every_plugin_declares_one_options_dataclass_with_a_help_line_per_option(registry):
    for cls in registry.values():
        assert issubclass(cls, Configurable), cls
        lines = describe_options(cls.Options)
        assert len(lines) == len(option_defaults(cls.Options))
        assert all(not line.endswith(": ") for line in lines), cls  # a doc on every option


DEFAULT_OPTIONS = {  # the run identities' and configs' options before the idiom
    "certify": {}, "predict": {}, "deterministic": {}, "lbound-heuristic": {}, "runner-up": {},
    "lbound": {"bound": "pairwise", "select": "clean"},
    "sequential": {"radii": "auto", "test": "targeted-patient"},
    "data-dependent": {"num_steps": 100, "step_size": 0.0001, "num_samples": 1, "memory": True},
    "ablation": {"mode": "column", "size": 4, "keep": 45, "threshold": 0.2},
    # Step 17: the cascade over σ (Jeong & Shin 2023) and ACES (Horváth et al. 2022)
    "cascade": {"sigmas": "", "p0": 0.5, "alpha_split": "bonferroni",
                "off_class": "clopper-pearson"},
    "aces": {"selection": "checkpoint", "entropy_threshold": None, "alpha_split": 0.5,
             "selection_n": None},
    # Step 17: double sampling (Li et al. 2022)
    "dsrs": {"q": "ball", "th": "x+", "q_scale": 0.8, "q_share": 0.5, "alpha_split": 0.5,
             "bounds": "lower", "count": "selection", "tol": 1e-4},
    # Step 18: certified segmentation (Fischer et al. 2021)
    "segment": {"tau": 0.75, "correction": "holm"},
    # Step 18: median smoothing (Chiang et al. 2020)
    "median": {"percentile": 0.5, "eps": "0.1,0.25,0.36,0.5", "correction": "bonferroni"},
    # Step 22: transformation-specific smoothing (Li et al. 2021), its transformation required
    "tss": {"transform": ""},
    # Step 22: translations by enumeration (the authors' black padding)
    "shift-enumeration": {"padding": "black", "max_shift": None},
}


@pytest.mark.parametrize("name", certifying())
def test_certifier_identities_are_what_record_manifests_stored(name):
    options = build_certifier(CERTIFIERS[name], {}).options()
    assert list(options.items()) == list(DEFAULT_OPTIONS[name].items())
    assert build_certifier(CERTIFIERS[name], options).options() == options  # resumes


def test_sigma_mode_parameters_are_what_configs_stored():
    assert build_sigma_mode("fixed").params() == {}
    params = build_sigma_mode("data_dependent", step_size=1).params()
    assert list(params.items()) == [("num_steps", 1), ("step_size", 1.0), ("num_samples", 1),
                                    ("start_epoch", 0)]
    assert type(params["step_size"]) is float


def test_a_float_hyperparameter_given_as_an_int_is_stored_as_the_float():
    method = build_method("stability", lbd=3)
    assert method.hparams() == {"lbd": 3.0} and type(method.hparams()["lbd"]) is float
