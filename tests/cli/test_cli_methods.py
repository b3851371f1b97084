"""Every registered method trains from the CLI with its recipe (on digits, one epoch)."""

import math
from pathlib import Path

import pytest

from smoothcert.cli.app import main
from smoothcert.methods import METHODS
from smoothcert.models.checkpoint import load_checkpoint

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "fashion-mnist"
# Two steps of 128 balanced digits: the recipe's method runs end to end; its quality is tested
# in the method's own module.
COMMON = ["--dataset", "digits", "--arch", "digits_cnn", "--epochs", "1", "--batch", "128",
          "--train-size", "256", "--lr", "0.01", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    out = tmp_path_factory.mktemp("pre") / "gaussian"
    assert main(["train", "--config", str(CONFIGS / "gaussian_s050.yaml"), *COMMON,
                 "--out", str(out)]) == 0
    return out / "checkpoint.pt"


@pytest.mark.parametrize("method", sorted(METHODS))
def test_method_trains_from_the_cli_with_its_recipe(method, pretrained, tmp_path):
    extra = ["--init-from", str(pretrained), "--param", "num_steps=1"] if method == "heat" else []
    out = tmp_path / method
    assert main(["train", "--config", str(CONFIGS / f"{method}_s050.yaml"), *COMMON, *extra,
                 "--out", str(out)]) == 0
    meta = load_checkpoint(out / "checkpoint.pt").meta
    assert meta["method"]["name"] == method and meta["epoch"] == 1
    assert meta["num_hparams"] == len(meta["method"]["hparams"])
    header, row = (out / "log.tsv").read_text().splitlines()
    values = dict(zip(header.split("\t"), row.split("\t")))
    assert float(values["seconds"]) > 0 and float(values["peak_mem_mb"]) > 0
    assert math.isfinite(float(values["loss"]))


def test_heat_without_a_pretrained_checkpoint_is_refused(tmp_path, capsys):
    assert main(["train", "--config", str(CONFIGS / "heat_s050.yaml"), *COMMON,
                 "--param", "num_steps=1", "--out", str(tmp_path / "h")]) == 2
    assert "--init-from" in capsys.readouterr().err
