"""The validators of smoothcert.errors: each refuses booleans, NaN, infinities and strings."""

import math
from pathlib import Path

import numpy as np
import pytest

from smoothcert.errors import (
    SmoothcertError,
    check_bool,
    check_count,
    check_in_range,
    check_nonnegative,
    check_plain_name,
    check_positive_finite,
    check_probability,
    printable,
    unsafe_character,
)

# validator → (values it accepts, with what it returns; extra values it refuses)
NUMBER_VALIDATORS = {
    "positive_finite": (check_positive_finite, [(2, 2.0), (0.5, 0.5), (1e-300, 1e-300),
                                                (np.float64(3.0), 3.0), (np.float32(0.25), 0.25),
                                                (np.int64(2), 2.0)], [0, 0.0, -1.0]),
    "nonnegative": (check_nonnegative, [(0, 0.0), (0.0, 0.0), (7, 7.0), (2.5, 2.5)],
                    [-1e-9, -1]),
    "probability": (check_probability, [(0.001, 0.001), (0.5, 0.5), (np.float64(0.05), 0.05)],
                    [0, 0.0, 1, 1.0, -0.5, 1.5]),
    "in_range": (lambda name, v: check_in_range(name, v, 0, 1),
                 [(0, 0.0), (0.3, 0.3), (1, 1.0)], [-0.1, 1.01]),
    "in_range_half_open": (lambda name, v: check_in_range(name, v, 0, 1, include_high=False),
                           [(0, 0.0), (0.99, 0.99)], [1, 1.0, -1]),
    # numpy's integers are integers (Step 13: np.int64 n was refused); 1.0 is not
    "count": (check_count, [(1, 1), (10**12, 10**12), (np.int64(3), 3), (np.uint8(7), 7)],
              [0, -1, 1.0, 2.5, np.float64(3.0)]),
    "count_from_zero": (lambda name, v: check_count(name, v, minimum=0), [(0, 0), (5, 5)],
                        [-1, 0.0]),
}
REFUSED_BY_ALL = [True, False, np.bool_(True), math.nan, math.inf, -math.inf, "1", "0.5", None,
                  [1], 1 + 0j]


@pytest.mark.parametrize("kind", NUMBER_VALIDATORS)
def test_number_validators_accept_valid_values(kind):
    check, accepted, _ = NUMBER_VALIDATORS[kind]
    for value, returned in accepted:
        out = check("x", value)
        assert out == returned and type(out) is type(returned)


@pytest.mark.parametrize("kind", NUMBER_VALIDATORS)
def test_number_validators_refuse_bools_nan_inf_strings_and_out_of_range(kind):
    check, _, refused = NUMBER_VALIDATORS[kind]
    for value in REFUSED_BY_ALL + refused:
        with pytest.raises(SmoothcertError, match=r"^x must (be|lie) .*, got "):
            check("x", value)


def test_check_bool_accepts_only_true_and_false():
    assert check_bool("flag", True) is True and check_bool("flag", False) is False
    for value in [1, 0, 1.0, np.bool_(True), "true", "yes", None, math.nan, math.inf]:
        with pytest.raises(SmoothcertError, match="flag must be true or false"):
            check_bool("flag", value)


@pytest.mark.parametrize("check, value, message", [
    (check_positive_finite, True, "sigma must be a positive finite number, got True"),
    (check_probability, True, "sigma must lie strictly between 0 and 1, got True"),
    (check_nonnegative, False, "sigma must be a finite number >= 0, got False"),
    (check_count, True, "sigma must be an integer >= 1, got True"),
    (lambda n, v: check_in_range(n, v, 0, 1), True,
     r"sigma must be a number in \[0, 1\], got True"),
    (lambda n, v: check_in_range(n, v, 0.0, 1.0, include_high=False), 1.0,
     r"sigma must be a number in \[0.0, 1.0\), got 1.0"),
])
def test_the_messages_name_the_value_and_what_is_wanted(check, value, message):
    with pytest.raises(SmoothcertError, match=f"^{message}$"):
        check("sigma", value)


def test_a_bool_is_refused_where_methods_and_attacks_take_numbers():
    from smoothcert.methods import build_method
    from smoothcert.smoothing.attacks import DDN, PGDL2

    for make in (lambda: PGDL2(rel_stepsize=True), lambda: DDN(gamma=True),
                 lambda: DDN(init_norm=True), lambda: build_method("heat", noise_fraction=True),
                 lambda: build_method("easy_focus", discard_threshold=False),
                 lambda: build_method("macer", lbd=True),
                 lambda: build_method("smoothadv", multi_noise=1)):
        with pytest.raises(SmoothcertError):
            make()


def test_sequential_tests_take_numpy_counts_but_not_bools():
    from smoothcert.stats.sequential_tests import SEQUENTIAL_TESTS

    test = SEQUENTIAL_TESTS["union"]()
    assert test.looks(np.int64(1000)) == test.looks(1000)
    with pytest.raises(SmoothcertError, match="n_max must be an integer >= 1"):
        test.looks(True)
    with pytest.raises(SmoothcertError, match="n_max must be an integer >= 1"):
        test.looks(np.bool_(True))


# --------------------------------------------------------------------------- text in messages
HOSTILE_TEXT = ["\x1b]0;pwned\x07", "\x1b[2J", "a\x00b", "tab\there", "line\nbreak", "cr\r",
                "del\x7f", "c1\x9b31m", "nel\x85", "ls\u2028", "rlo\u202eevil", "iso\u2066x",
                "surrogate\udcff"]


@pytest.mark.parametrize("text", HOSTILE_TEXT)
def test_printable_escapes_what_repr_escapes_and_nothing_else(text):
    shown = printable(text)
    assert shown.isprintable() and shown == repr(text)[1:-1]
    assert unsafe_character(text) is not None
    with pytest.raises(SmoothcertError, match=r"^here names class '.*', which holds the control "
                                              r"character U\+[0-9A-F]{4}; .*: fix it$") as info:
        check_plain_name(text, "here names class", "fix it")
    assert str(info.value).isprintable() and shown in str(info.value)


@pytest.mark.parametrize("text", ["plain", "T-shirt/top", "it's", 'say "hi"', "back\\slash",
                                  "猫 café", "👩\u200d🔬", "no\u00a0break", "rtl\u200fmark"])
def test_printable_keeps_plain_text_and_plain_names_pass(text):
    assert unsafe_character(text) is None and check_plain_name(text, "w", "h") == text
    if text.isprintable():
        assert printable(text) == text  # quotes and backslashes stay as they are
    assert printable(text).isprintable()  # a zero-width joiner or NBSP is shown escaped
    assert printable(Path("/x") / text) == printable(f"/x/{text}")
