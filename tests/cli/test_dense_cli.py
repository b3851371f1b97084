"""The dense tasks at the command line and through the engine's options: certify --help lists
segment and median, a certifier of another task is one line and exit 2, and segment honours a
denoiser, reduced precision and the batch size."""

import sys
from pathlib import Path

import pytest
import torch

from smoothcert.cli.app import build_parser, main
from smoothcert.denoisers.dncnn import DnCNN
from smoothcert.models import build_model, checkpoint_meta, save_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "certifiers"))
from test_segment import run  # noqa: E402


def test_certify_help_lists_the_dense_certifiers(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["certify", "--help"])
    text = capsys.readouterr().out
    assert "segment" in text and "median" in text


def _digits_classifier(path: Path) -> Path:
    model = build_model("digits_cnn", 10, (1, 8, 8), [0.5], [0.5])
    meta = checkpoint_meta(arch="digits_cnn", dataset="digits", num_classes=10,
                           input_shape=(1, 8, 8), mean=[0.5], std=[0.5],
                           noise={"name": "gaussian", "sigma": 0.25},
                           method={"name": "gaussian", "hparams": {}}, epoch=1, config={})
    save_checkpoint(path, model, meta)
    return path


@pytest.mark.parametrize("certifier", ["segment", "median"])
def test_a_dense_certifier_on_a_classifier_is_one_line(tmp_path, capsys, certifier):
    ckpt = _digits_classifier(tmp_path / "c.pt")
    out = tmp_path / "r.tsv"
    code = main(["certify", str(ckpt), "--certifier", certifier, "--n", "50", "--max", "2",
                 "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "certifies" in err[0] and "--certifier" in err[0]
    assert not out.exists()


def test_segment_honours_a_denoiser_precision_and_batch():
    plain = run()
    same = run(batch=7)  # the draws do not depend on the batch
    assert [r["map_sha256"] for r in plain] == [r["map_sha256"] for r in same]
    bf16 = run(engine={"precision": "bf16"})
    # bf16 may round a logit near a band's edge (on the CPU here: the same maps)
    assert all(abs(a["certified"] - b["certified"]) <= 1 for a, b in zip(plain, bf16))
    identity = DnCNN(1, depth=3, width=4)
    with torch.no_grad():
        for p in identity.parameters():
            p.zero_()  # a DnCNN predicts the noise and subtracts it: zero weights, x itself
    denoised = run(denoiser=identity)
    assert [r["map_sha256"] for r in denoised] == [r["map_sha256"] for r in plain]


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(),
                    reason="Fashion-MNIST is not installed (Debian: dataset-fashion-mnist)")
def test_a_classification_certifier_on_a_segmenter_is_one_line(tmp_path, capsys):
    model = build_model("fcn_small", 11, (1, 28, 28), [0.286], [0.353], {"width": 2})
    meta = checkpoint_meta(arch="fcn_small", dataset="fashion-mnist-seg", num_classes=11,
                           input_shape=(1, 28, 28), mean=[0.286], std=[0.353],
                           noise={"name": "gaussian", "sigma": 0.25},
                           method={"name": "gaussian", "hparams": {}}, epoch=1, config={},
                           arch_kwargs={"width": 2}, task="segmentation")
    save_checkpoint(tmp_path / "seg.pt", model, meta)
    out = tmp_path / "r.tsv"
    code = main(["certify", str(tmp_path / "seg.pt"), "--n", "50", "--max", "2", "--out",
                 str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--certifier segment" in err[0], err
    assert not out.exists()
