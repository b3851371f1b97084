"""Step 13 (items 4, 5.3, 5.9): what a user types wrong in KEY=VALUE flags, recipes, run folders,
radii and names ends in ONE line on stderr and exit code 2, nothing written, and no YAML tag is
ever run."""

import warnings

import pytest

from conftest import write_checkpoint
from smoothcert.cli.app import main
from smoothcert.cli.common import parse_params
from smoothcert.errors import SmoothcertError

TRAIN = ["train", "--dataset", "digits", "--arch", "digits_cnn", "--sigma", "0.25", "--epochs",
         "1", "--no-progress", "--device", "cpu"]
CERTIFY = ["--n0", "20", "--batch", "64", "--max", "1", "--no-progress", "--device", "cpu"]
HOSTILE = '!!python/object/apply:os.system ["touch PWNED"]'


def one_line_error(capsys, argv) -> str:
    """Run ``argv``: exit 2 and exactly one line on stderr, which is returned."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("flag", ["--param", "--sigma-param", "--arch-param"])
@pytest.mark.parametrize("value, problem", [
    ("[unclosed", "expected ',' or ']', but got '<stream end>' (line 1, column 10)"),
    (HOSTILE, "tag '!!python/object/apply:os.system' is not allowed"),
])
def test_train_key_value_that_is_not_yaml(flag, value, problem, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a run tag would have left PWNED
    err = one_line_error(capsys, [*TRAIN, flag, f"eta={value}", "--out", str(tmp_path / "r")])
    assert f"{flag} 'eta=" in err and "the value of eta is not valid YAML" in err and problem in err
    assert list(tmp_path.iterdir()) == []  # no run folder, no PWNED


@pytest.mark.parametrize("value, problem", [
    ("[unclosed", "expected ',' or ']'"), (HOSTILE, "is not allowed"),
    ("&a [*a]", "contains itself")])
def test_certify_opt_that_is_not_yaml(value, problem, tmp_path, capsys):
    checkpoint = write_checkpoint(tmp_path / "c.pt")
    err = one_line_error(capsys, ["certify", str(checkpoint), *CERTIFY, "--n", "100",
                                  "--opt", f"radii={value}", "--out", str(tmp_path / "r.tsv")])
    assert "--opt 'radii=" in err and problem in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_parse_params_keeps_yaml_values_and_cuts_long_items():
    assert parse_params(["a=1e-4", "b=[1, 2]", "c=x", "d=&x [1]"]) == {
        "a": 1e-4, "b": [1, 2], "c": "x", "d": [1]}
    with pytest.raises(SmoothcertError) as err:
        parse_params(["eta=" + "[" * 1000])  # deeper than YAML's composer recurses
    message = str(err.value)
    assert "nested too deeply" in message and len(message) < 150


@pytest.mark.parametrize("content, problem", [
    (b"\x00\xff\xfe", "is not a text file: byte 0xff at offset 1 is not UTF-8"),
    (b"dataset: digits\nmethod_params: [1\nepochs: 2\n",
     "is not valid YAML: expected ',' or ']', but got ':' (line 3, column 7)"),
    (b"epochs: !!python/object/apply:os.system ['touch PWNED']\n",
     "is not valid YAML: tag '!!python/object/apply:os.system' is not allowed"),
    (b"a: 1\x00\n", "is not valid YAML: unacceptable character #x0000"),
    (b"method_params: &p {lbd: *p}\n", "contains itself"),
])
def test_train_recipe_that_is_not_a_yaml_text(content, problem, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "b.yaml").write_bytes(content)
    err = one_line_error(capsys, ["train", "--config", "b.yaml", "--out", "r"])
    assert err.startswith("smoothcert train: error: recipe b.yaml ") and problem in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.yaml"]


def test_train_reports_every_misspelt_name_before_the_missing_epochs(tmp_path, capsys):
    out = tmp_path / "r"
    err = one_line_error(capsys, ["train", "--method", "gausian", "--dataset", "digits",
                                  "--arch", "digits_cnn", "--sigma", "0.25", "--out", str(out)])
    assert "unknown method 'gausian'; known: " in err and "(did you mean 'gaussian'?)" in err
    assert err.index("unknown method") < err.index("missing required key(s): epochs")
    err = one_line_error(capsys, ["train", "--method", "gausian", "--dataset", "digitz",
                                  "--arch", "lenet5", "--noise", "gausian", "--epochs", "1",
                                  "--out", str(out)])
    for wrong, meant in [("method 'gausian'", "gaussian"), ("dataset 'digitz'", "digits"),
                         ("arch 'lenet5'", "lenet"), ("noise 'gausian'", "gaussian")]:
        assert f"unknown {wrong}; known: " in err and f"(did you mean '{meant}'?)" in err
    assert not out.exists()


def test_sequential_radii_beyond_any_distance_are_refused_without_a_warning(tmp_path, capsys):
    checkpoint = write_checkpoint(tmp_path / "c.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the old path printed an overflow RuntimeWarning
        err = one_line_error(capsys, ["certify", str(checkpoint), "--certifier", "sequential",
                                      "--radii=1e308", *CERTIFY, "--n", "100",
                                      "--out", str(tmp_path / "r.tsv")])
    assert "1e308 is above 1e+12" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_sequential_n_too_small_for_the_default_grid(tmp_path, capsys):
    # --n 1 at alpha 0.001: even 1 hit of 1 gives p_lower = 0.001, so the default grid (radii
    # fixed-n CERTIFY could reach with n draws) is empty; the user gave no radii.
    checkpoint = write_checkpoint(tmp_path / "c.pt")
    err = one_line_error(capsys, ["certify", str(checkpoint), "--certifier", "sequential",
                                  *CERTIFY, "--n", "1", "--out", str(tmp_path / "r.tsv")])
    assert "n = 1 draws cannot certify any radius at alpha 0.001" in err
    assert "use n >= 10" in err and "array(" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
