"""``smoothcert certify --certifier ablation`` through the CLI: listed in ``--help`` with its
options (from the registry), a bad option or a scheme that does not fit the images is one line
and exit 2 with no record file, and a checkpoint of ablation smoothing certifies without
--sigma."""

import pytest
import torch

from smoothcert.cli.app import main
from smoothcert.models.archs import build_model
from smoothcert.models.checkpoint import save_checkpoint, versions
from smoothcert.runs.records import read_manifest, read_records


def write_ablation_checkpoint(path, encoding="ablation"):
    """A freshly initialised digits_cnn with the ablation encoding, as ``train --method
    ablation`` stores it (no noise)."""
    torch.manual_seed(0)
    model = build_model("digits_cnn", 10, (1, 8, 8), [0.5], [0.5], input_encoding=encoding)
    meta = {"arch": "digits_cnn", "dataset": "digits", "num_classes": 10,
            "input_shape": [1, 8, 8], "mean": [0.5], "std": [0.5], "noise": None,
            "method": {"name": "ablation", "hparams": {}}, "epoch": 0,
            "versions": versions(), "config": {}}
    if encoding is not None:
        meta["input_encoding"] = encoding
    return save_checkpoint(path, model, meta)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ablation") / "abl.pt"
    write_ablation_checkpoint(path)
    return path


def test_help_lists_the_certifier_and_its_options(capsys):
    assert main(["certify", "--help"]) == 0
    text = capsys.readouterr().out
    assert "ablation" in text
    for option in ("mode (column|block|pixels, default column)", "size (int, default 4)",
                   "keep (int, default 45)", "threshold (float, default 0.2)"):
        assert option in text, option


@pytest.mark.parametrize(("opts", "says"), [
    (["--opt", "mode=rows"], "unknown mode 'rows'"),
    (["--opt", "size=9"], "a band of 9 columns is wider than the image (8 columns)"),
    (["--opt", "mode=block", "--opt", "size=9"], "a 9x9 block does not fit a 8x8 image"),
    (["--opt", "mode=pixels", "--opt", "keep=0"], "needs keep >= 1"),
    (["--opt", "mode=pixels", "--opt", "keep=-3"], "needs keep >= 1"),
    (["--opt", "threshold=2"], "threshold is a softmax score in [0, 1]"),
    (["--sigma", "0.25"], "draws no noise: drop --sigma and --noise"),
])
def test_bad_options_are_one_line_and_exit_2(opts, says, checkpoint, tmp_path, capsys):
    out = tmp_path / "r.tsv"
    code = main(["certify", str(checkpoint), "--certifier", "ablation", *opts, "--max", "2",
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert not list(tmp_path.iterdir())


def test_a_checkpoint_without_the_encoding_is_refused(tmp_path, capsys):
    plain = write_ablation_checkpoint(tmp_path / "plain.pt", encoding=None)
    code = main(["certify", str(plain), "--certifier", "ablation", "--max", "2",
                 "--out", str(tmp_path / "r.tsv")])
    err = capsys.readouterr().err
    assert code == 2 and "train it with --method ablation" in err and err.count("\n") == 1


def test_certify_then_report(checkpoint, tmp_path, capsys):
    out = tmp_path / "r.tsv"
    assert main(["certify", str(checkpoint), "--certifier", "ablation", "--opt", "size=3",
                 "--max", "3", "--out", str(out)]) in (0, None)
    rows = read_records(out).rows()
    assert len(rows) == 3 and all(r["n"] == 8 and r["n0"] == 0 for r in rows)
    assert read_manifest(out)["identity"]["options"] == {"mode": "column", "size": 3,
                                                          "keep": 45, "threshold": 0.2}
    capsys.readouterr()
    assert main(["report", str(out)]) in (0, None)
    assert "patch side, pixels" in capsys.readouterr().out


@pytest.mark.parametrize("certifier", ["certify", "sequential", "predict"])
def test_a_noise_certifier_refuses_an_ablation_model(certifier, checkpoint, tmp_path, capsys):
    """Gaussian noise on a model trained on ablated inputs certifies nothing its training
    prepared it for: the noise certifiers refuse it in one line, before any file."""
    out = tmp_path / "r.tsv"
    code = main(["certify", str(checkpoint), "--certifier", certifier, "--sigma", "0.25",
                 "--n", "20", "--max", "2", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "reads ablation-encoded inputs" in err and "--certifier ablation" in err, err
    assert not list(tmp_path.iterdir())
