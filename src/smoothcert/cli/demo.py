"""``smoothcert demo``: the whole workflow on the embedded digits data, in a couple of CPU minutes.

Train a small CNN on scikit-learn's 8×8 digits with Gaussian noise augmentation (σ = 0.25), certify
every test digit with CERTIFY, then print the certified-accuracy table and write its plot. Every
step resumes, so a second run only prints the report.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .common import add_common, command, progress_mode, resolve_device

SIGMA = 0.25
# n = 10,000 draws per digit gives radii up to σ·Φ⁻¹(0.001^(1/10000)) ≈ 3.2σ = 0.80 at α = 0.001.
N0, N, ALPHA, BATCH = 100, 10_000, 0.001, 5_000
MAX = None  # test digits certified: all 359 (tests/test_readme.py shrinks it with the rest)
RADII = "0:1:0.125"


def __getattr__(name: str):
    """``TRAIN``, the demo's TrainConfig, built on first use: importing this module (every
    ``smoothcert`` command does, ``--help`` too) must not import torch."""
    if name != "TRAIN":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ..training import TrainConfig

    globals()["TRAIN"] = TrainConfig(
        dataset="digits", arch="digits_cnn", method="gaussian", sigma=SIGMA, epochs=30,
        batch_size=64, lr=0.05, lr_schedule="step", lr_step_size=15, weight_decay=5e-4, seed=0)
    return globals()["TRAIN"]


def run_demo(out, device="cpu", progress=True) -> str:
    """Train, certify and report into folder ``out``, each step resumed from its files there;
    the markdown table printed last is returned. ``progress``: True or "bar" (bars), "lines"
    (plain lines while certifying), False (quiet but for the steps' lines)."""
    from ..evaluation.metrics import parse_radii
    from ..evaluation.report import report
    from ..io import file_sha256
    from ..runs import RunConfig, run_dataset
    from ..training import train

    config = sys.modules[__name__].TRAIN  # a test's smaller one, else built by __getattr__
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # one line per step, so that a log without progress bars (not a terminal) still says where
    # the couple of minutes go
    print(f"training the digits CNN ({config.epochs} epochs, σ={SIGMA}) into {out / 'train'}",
          flush=True)
    bars = progress in (True, "bar")
    checkpoint = train(config, out / "train", device=device, resume=True, progress=bars,
                       epoch_lines=True)
    # N counts noise draws per image, the table's n images: the lines say which is which
    print(f"certifying the digits test split ({N:,} noise draws per image) into "
          f"{out / 'certify.tsv'}", flush=True)
    cfg = RunConfig(certifier="certify", checkpoint_sha256=file_sha256(checkpoint),
                    dataset="digits", split="test", sigma=SIGMA, n=N, alpha=ALPHA, batch=BATCH,
                    seed=0, n0=N0, max_count=MAX,
                    device_type=device.type if hasattr(device, "type") else str(device))
    records = run_dataset(cfg, checkpoint, out / "certify.tsv", device=device, progress=progress)
    table = report([records], parse_radii(RADII), fmt="md", plot=out / "certified_accuracy.png")
    print(f"\nCertified accuracy of the σ={SIGMA} smoothed digits CNN ({N:,} noise draws per "
          f"image, α={ALPHA}; the table's n counts test images):\n")
    print(table)
    print(f"records: {records}\nplot: {out / 'certified_accuracy.png'}")
    return table


def _demo_args(p):
    p.add_argument("--out", default="runs/demo", help="folder for the demo's files")
    add_common(p)


@command(
    "demo", "train a digits CNN with Gaussian noise, certify its test split, report", _demo_args
)
def cmd_demo(args):
    run_demo(args.out, device=resolve_device(args.device), progress=progress_mode(args))
