"""Ablation certification (Levine & Feizi): seconds per image of column, block and pixels.

A patch certificate costs one forward pass per band (W) or per block (H·W) position of every
image, an ℓ0 certificate n0 + n (CERTIFY's draws). The engine packs those passes into full
batches across images (``Smoothed.run`` over the certifier's programs, ``BatchedVotes``); the
authors' loop (``utils_band.py`` / ``utils_block.py: predict_and_certify``) forwards one position
at a time for a batch of images. For each mode, timed in one run on one device and model
(``lenet`` at Fashion-MNIST's 1×28×28 behind the ablation encoding, random weights: the cost of
a forward does not depend on them), median over ``--rounds`` interleaved rounds:

* ``engine``: ``certify_dataset(..., certifier="ablation")`` on ``--images`` images, the whole
  record pipeline but the file (the rows are returned), at ``--batch``;
* ``authors' loop`` (column and block): per position, the ablated copies of all the images in
  one forward, votes counted per position on the device, as their code does (with our masks
  and encoding, so only the batching differs).

    python benchmarks/ablation_certify.py                       # CPU, ~1 minute
    python benchmarks/ablation_certify.py --device cuda --images 100 --batch 4000
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import print_environment

from smoothcert.models import build_model
from smoothcert.runs import certify_dataset
from smoothcert.smoothing.ablation import Ablation, ablate_

SHAPE, CLASSES = (1, 28, 28), 10
MODES = {"column": {"mode": "column", "size": 4}, "block": {"mode": "block", "size": 4},
         "pixels": {"mode": "pixels", "keep": 45}}
"""The authors' defaults: band and block 4 (``certify_mnist_*.py``), k = 45 (AAAI, MNIST)."""


def make_model(device) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("lenet", CLASSES, SHAPE, [0.5], [0.25],
                       input_encoding="ablation").to(device).eval()


def engine(model, xs, options, args) -> float:
    data = torch.utils.data.TensorDataset(xs, torch.zeros(len(xs), dtype=torch.long))
    start = time.perf_counter()
    certify_dataset(model, data, certifier="ablation", options=options, n0=args.n0, n=args.n,
                    batch=args.batch, num_classes=CLASSES, device=xs.device)
    return (time.perf_counter() - start) / len(xs)


@torch.inference_mode()
def authors_loop(model, xs, options, args) -> float:
    """One forward per position over all the images, threshold votes summed per position."""
    ablation = Ablation(options["mode"], options["size"])
    counts = torch.zeros((len(xs), CLASSES), dtype=torch.long, device=xs.device)
    out = torch.empty_like(xs)
    start = time.perf_counter()
    for p in range(ablation.positions(SHAPE)):
        mask = ablation.sweep_masks(SHAPE, p, 1, xs.device).expand(len(xs), -1, -1)
        counts += (model(ablate_(out, xs, mask)).softmax(dim=1) >= 0.2).long()
    counts.cpu()  # the host sync of their .cpu().numpy()
    return (time.perf_counter() - start) / len(xs)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--images", type=int, default=20)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--n0", type=int, default=100, help="pixels: selection draws (AAAI: 1000)")
    p.add_argument("--n", type=int, default=10_000, help="pixels: estimation draws (AAAI)")
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    print_environment(device)
    print(f"\nworkload: {args.images} images of 1x28x28, lenet (random weights) behind the "
          f"ablation encoding, batch {args.batch}; pixels: n0 = {args.n0}, n = {args.n}; "
          f"seconds per image, median of {args.rounds} interleaved rounds\n")
    print("| mode | forwards per image | engine s/image | authors' loop s/image | × |")
    print("| --- | ---: | ---: | ---: | ---: |", flush=True)
    model = make_model(device)
    xs = torch.rand((args.images, *SHAPE), generator=torch.Generator().manual_seed(1)).to(device)
    times = {m: {"engine": [], "loop": []} for m in args.modes}
    for _ in range(args.rounds):
        for mode in args.modes:
            times[mode]["engine"].append(engine(model, xs, MODES[mode], args))
            if mode != "pixels":
                times[mode]["loop"].append(authors_loop(model, xs, MODES[mode], args))
    for mode in args.modes:
        passes = {"column": 28, "block": 28 * 28}.get(mode, args.n0 + args.n)
        ours = statistics.median(times[mode]["engine"])
        loop = statistics.median(times[mode]["loop"]) if times[mode]["loop"] else None
        theirs = f"{loop:.4f}" if loop is not None else "–"
        ratio = f"{loop / ours:.1f}" if loop is not None else "–"
        print(f"| {mode} ({MODES[mode]}) | {passes} | {ours:.4f} | {theirs} | {ratio} |",
              flush=True)


if __name__ == "__main__":
    main()
