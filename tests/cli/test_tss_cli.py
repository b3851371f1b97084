"""``smoothcert certify --transform`` (the ``tss`` certifier, Li et al. 2021) through the CLI:
``--help`` lists every transformation with its parameters, ``--transform T`` is ``--certifier
tss --opt transform=T``, bad parameters are one line and exit 2 with no file, ``report`` labels
the radius with the transformation's unit, and ``train --help`` offers the method."""

from __future__ import annotations

import pytest
import torch

from smoothcert.cli.app import main
from smoothcert.models.archs import build_model
from smoothcert.models.checkpoint import save_checkpoint, versions
from smoothcert.registry import describe_options
from smoothcert.runs.records import read_manifest, read_records
from smoothcert.transforms import TRANSFORMS

RUN = ["--n0", "10", "--n", "60", "--max", "2", "--batch", "64", "--no-progress"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A freshly initialised digits_cnn, as ``train --method transform`` stores it (no
    noise)."""
    torch.manual_seed(0)
    model = build_model("digits_cnn", 10, (1, 8, 8), [0.5], [0.5])
    meta = {"arch": "digits_cnn", "dataset": "digits", "num_classes": 10,
            "input_shape": [1, 8, 8], "mean": [0.5], "std": [0.5], "noise": None,
            "method": {"name": "transform",
                       "hparams": {"transform": "brightness:sigma_b=0.2,sigma_k=0.0,"
                                                "k_low=1.0,k_high=1.0"}},
            "epoch": 0, "versions": versions(), "config": {}}
    return save_checkpoint(tmp_path_factory.mktemp("tss") / "t.pt", model, meta)


def listing(text: str, flag: str) -> dict[str, str]:
    """The rows under ``flag NAME`` of the help's names: NAME -> its lines, joined."""
    rows, name = {}, ""
    section = text.split(f"\n{flag} NAME\n", 1)[1].split("\n\n", 1)[0]
    for line in section.splitlines():
        if line.startswith("   "):
            rows[name] += " " + line.strip()
        else:
            name, _, rest = line.strip().partition(" ")
            rows[name] = rest.strip()
    return rows


def test_certify_help_lists_every_transformation_with_its_parameters(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["certify", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--transform NAME[:KEY=VALUE,...]" in text
    listed = listing(text, "--transform")
    assert list(listed) == list(TRANSFORMS)
    for name, cls in TRANSFORMS.items():
        assert "Li et al. 2021" in listed[name]
        assert all(line in listed[name] for line in describe_options(cls.Options)), name


def test_train_help_offers_the_method(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["train", "--help"]) == 0
    text = capsys.readouterr().out
    assert "transform (str, default ): the transformation and its smoothing parameters" in text


def without_time(rows):
    return [{k: v for k, v in r.items() if k != "time"} for r in rows]


def test_transform_is_the_tss_certifier_with_that_option(checkpoint, tmp_path, capsys):
    flag, opt = tmp_path / "flag.tsv", tmp_path / "opt.tsv"
    assert main(["certify", str(checkpoint), "--transform", "brightness:sigma_b=0.3", *RUN,
                 "--out", str(flag)]) in (0, None)
    assert main(["certify", str(checkpoint), "--certifier", "tss", "--opt",
                 "transform=brightness:sigma_b=0.30,sigma_k=0", *RUN, "--out", str(opt)]) \
        in (0, None)
    assert read_manifest(flag)["identity"] == read_manifest(opt)["identity"]
    identity = read_manifest(flag)["identity"]
    assert identity["certifier"] == "tss" and identity["noise"] == "none"
    assert identity["options"]["transform"] == \
        "brightness:sigma_b=0.3,sigma_k=0.0,k_low=1.0,k_high=1.0"
    rows = read_records(flag).rows()
    assert len(rows) == 2 and without_time(rows) == without_time(read_records(opt).rows())
    capsys.readouterr()
    assert main(["report", str(flag)]) in (0, None)
    assert "brightness shift, pixel units" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "says"), [
    (["--transform", "brightness:sigma_b=0"], "sigma_b must be a positive finite number"),
    (["--transform", "brightness:sigma_b=-0.2"], "sigma_b must be a positive finite number"),
    (["--transform", "translation:sigma=9"], "translation sigma 9 pixels is larger than the 8x8 "
                                             "image; give sigma <= 8"),
    (["--transform", "blur:distribution=box"], "unknown distribution 'box'"),
    (["--transform", "brightness:sigma_k=0.2,k_low=1.5"], "k_low is the smallest contrast "
                                                          "factor certified, in (0, 1]"),
    (["--transform", "contrast:sigma_k=-1"], "sigma_k must be a positive finite number"),
    (["--transform", "rotate:angle=10"], "invalid choice: 'rotate:angle=10' (choose from "
                                         "blur, brightness, contrast, rotation, scaling, "
                                         "translation)"),
    (["--transform", "rotation:angle=0"], "angle is the half-width of a range of angles in "
                                          "degrees, in (0, 180], got 0.0"),
    (["--transform", "rotation:angle=200"], "in (0, 180], got 200.0"),
    (["--transform", "scaling:low=0"], "low is a scale factor, a finite number > 0"),
    (["--transform", "scaling:low=-0.5"], "low is a scale factor, a finite number > 0"),
    (["--transform", "scaling:low=0.5,high=2,slices=2"], "in 1/scale are too wide for a 8x8 "
                                                         "image"),
    (["--transform", "rotation:angle=40,slices=4"], "slices of 20 degrees are too wide for a "
                                                    "8x8 image"),
    (["--transform", "brightness", "--sigma", "0.25"], "certifier 'tss' draws no noise: drop "
                                                       "--sigma and --noise"),
    (["--transform", "brightness", "--certifier", "certify"], "--transform certifies with "
                                                              "--certifier tss, not certify"),
    (["--transform", "brightness", "--opt", "transform=blur"], "--transform and --opt "
                                                               "transform=... both name"),
    (["--certifier", "tss"], "certifier 'tss' needs a transformation: pass --transform "
                             "NAME[:KEY=VALUE,...] (or --opt transform=...) with NAME one of"),
])
def test_bad_parameters_are_one_line_exit_2_and_no_file(args, says, checkpoint, tmp_path,
                                                        capsys):
    out = tmp_path / "r.tsv"
    code = main(["certify", str(checkpoint), *args, *RUN, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert not list(tmp_path.iterdir())
