"""TrainConfig's names (Step 13, item 4): a misspelt method, arch, noise, dataset, optimizer,
schedule or σ mode is reported first, all of them in one line, with the registered name it is
closest to; a missing key comes after them."""

import pytest

from smoothcert.errors import SmoothcertError
from smoothcert.training import TrainConfig

GOOD = {"dataset": "digits", "arch": "digits_cnn", "sigma": 0.25, "epochs": 1}


def problems(**change) -> str:
    with pytest.raises(SmoothcertError) as info:
        TrainConfig.from_dict({k: v for k, v in {**GOOD, **change}.items() if v is not None})
    text = str(info.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("field, wrong, meant", [
    ("method", "gausian", "gaussian"),
    ("method", "consistancy", "consistency"),
    ("dataset", "fashion_mnist", "fashion-mnist"),
    ("arch", "lenet5", "lenet"),
    ("noise", "uniforn", "uniform"),
    ("optimizer", "adamw", "adam"),
    ("lr_schedule", "multisteps", "multistep"),
    ("sigma_mode", "data-dependent", "data_dependent"),
])
def test_a_misspelt_name_says_which_name_was_meant(field, wrong, meant):
    text = problems(**{field: wrong})
    assert text.startswith(f"unknown {field} {wrong!r}; known: ")
    assert text.endswith(f" (did you mean {meant!r}?)")


def test_a_name_far_from_every_entry_lists_them_without_a_guess():
    text = problems(method="zzz")
    assert text.startswith("unknown method 'zzz'; known: ") and "gaussian" in text
    assert "did you mean" not in text


def test_every_problem_at_once_names_first_and_the_missing_key_last():
    # before: "config is missing required key(s): epochs" alone, the misspelling unseen
    text = problems(method="gausian", noise="gausian", arch="lenet5", epochs=None)
    parts = text.split("; ")
    assert [p.split(" ")[1] for p in parts if p.startswith("unknown ")] == [
        "arch", "method", "noise"]  # in the order of the config's fields
    assert parts[0] == "unknown arch 'lenet5'"
    assert parts[-1] == "config is missing required key(s): epochs"


def test_an_unknown_key_suggests_the_field_and_comes_with_the_names():
    text = problems(epoch=3, epochs=None, method="gausian")
    assert text.startswith("unknown config key(s) epoch; valid: dataset, arch, epochs")
    assert "(did you mean epochs for epoch?)" in text and "unknown method 'gausian'" in text
    assert text.endswith("missing required key(s): epochs")


def test_external_archs_pass_the_name_check():
    # torchvision:NAME / timm:NAME are checked when the model is built, not against MODELS
    text = problems(arch="torchvision:resnet18", method="gausian")
    assert "unknown arch" not in text and "unknown method 'gausian'" in text


def test_the_constructor_also_says_which_name_was_meant():
    with pytest.raises(SmoothcertError, match=r"unknown method 'gausian'; known: .*"
                                              r" \(did you mean 'gaussian'\?\)$"):
        TrainConfig(**GOOD, method="gausian")


def test_a_sigma_beyond_the_noise_bound_is_refused_by_the_config_before_any_work():
    # the discrete Gaussian's exact sampler is bounded (Noise.max_sigma): TrainConfig refuses
    # σ = 1e9 itself, so `train` stops before a dataset or model is loaded
    from smoothcert.noise import NOISES

    bound = NOISES["discrete-gaussian"].max_sigma
    with pytest.raises(SmoothcertError, match=r"noise 'discrete-gaussian' takes sigma <= "):
        TrainConfig(dataset="digits", arch="digits_cnn", method="gaussian", epochs=1,
                    sigma=1e9, noise="discrete-gaussian")
    assert TrainConfig(dataset="digits", arch="digits_cnn", method="gaussian", epochs=1,
                       sigma=bound, noise="discrete-gaussian").sigma == bound
