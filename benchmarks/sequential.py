"""Sequential certification vs fixed-n CERTIFY: forward passes, certified accuracy, wall time.

On one trained checkpoint and the same test images (every ``--skip``-th, ``--max`` of them):

* fixed-n: Cohen et al.'s CERTIFY, n0 = 100, n = 100,000, α = 0.001 (records in
  ``OUT_DIR/fixed_n.tsv``; an existing file with the same configuration is resumed, not redone);
* sequential: ``--certifier sequential`` with n_max = 100,000, same n0 and α, for each radius
  grid and each sequential test (records ``OUT_DIR/sequential_<test>_<grid>.tsv``).

Printed per (grid, test): mean forward passes (noisy samples, selection included) per image and
their ratio to fixed-n; the oracle floor (the draws any level-α test needs, with every draw a
hit, to certify the grid radius fixed-n certifies); certified accuracy at every grid radius for
both and the largest gap; the wall-clock ratio. Wall clock is measured in this process, one
after the other on the same machine: the sequential run over all images, and fixed-n CERTIFY
over ``--timing-images`` images before it and again after it (the mean per image).

    python benchmarks/sequential.py --checkpoint studies/sequential/records/fmnist_lenet_s025.pt
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import print_environment
from scipy.stats import norm

from smoothcert.evaluation.metrics import certified_accuracy
from smoothcert.io import file_sha256
from smoothcert.models import load_checkpoint
from smoothcert.runs import RunConfig, run_dataset
from smoothcert.runs.records import read_records
from smoothcert.stats import clopper_pearson_lower


def config(args, certifier: str, **options) -> RunConfig:
    meta = load_checkpoint(args.checkpoint).meta
    return RunConfig(certifier=certifier, checkpoint_sha256=file_sha256(args.checkpoint),
                     dataset=meta["dataset"], split="test", sigma=float(meta["noise"]["sigma"]),
                     n=args.n, alpha=args.alpha, batch=args.batch, seed=args.seed,
                     skip=args.skip, max_count=args.max, n0=args.n0, options=options,
                     device_type=torch.device(args.device).type)


def run(args, cfg: RunConfig, out: Path) -> tuple:
    start = time.perf_counter()
    path = run_dataset(cfg, args.checkpoint, out, device=args.device, data_root=args.data_root,
                       progress=False)
    return read_records(path), time.perf_counter() - start


def fixed_seconds_per_image(args) -> float:
    """Fixed-n CERTIFY timed afresh (a throw-away record file) on ``--timing-images`` images
    spread over the benchmark's images."""
    cfg = config(args, "certify")
    spread = {"skip": args.skip * max(1, args.max // args.timing_images),
              "max_count": args.timing_images}
    with tempfile.TemporaryDirectory() as tmp:
        records, seconds = run(args, RunConfig(**{**cfg.__dict__, **spread}),
                               Path(tmp) / "fixed.tsv")
    return seconds / len(records["idx"])


def draws_per_image(records) -> np.ndarray:
    return np.asarray(records["n0"], dtype=np.float64) + np.asarray(records["n"], np.float64)


def oracle_floor(fixed, radii: np.ndarray, sigma: float, args) -> float:
    """Mean draws that ANY level-α test needs to certify, per image, the largest grid radius that
    fixed-n certifies (correct or not): even if every draw is a hit, p_A > p_j is certified only
    once p_j^t ≤ α, i.e. t ≥ ln α / ln p_j; plus the n0 selection draws."""
    radius = np.asarray(fixed["radius"], dtype=np.float64)
    abstained = np.asarray(fixed["predict"]) == -1
    level = np.searchsorted(radii, radius, side="right") - 1
    p = norm.cdf(radii[level] / sigma)
    floor = np.where(abstained, 0.0, np.ceil(np.log(args.alpha) / np.log(p)))
    return float(np.mean(args.n0 + floor))


def expected_hits_oracle(fixed, radii: np.ndarray, sigma: float, args) -> float:
    """Mean draws of a clairvoyant test that knows each image's p_A (taken as fixed-n's
    n_A/n) and needs only the EXPECTED hits: the fewest t with Clopper–Pearson at the full α,
    one look, ⌊p_A·t⌋ hits of t, past the grid threshold fixed-n certifies; plus n0. Unlike the
    floor it counts the misses, which near a threshold cost tens of thousands of draws."""
    radius = np.asarray(fixed["radius"], dtype=np.float64)
    p_hat = np.asarray(fixed["nA"], dtype=np.float64) / np.asarray(fixed["n"], np.float64)
    level = np.searchsorted(radii, radius, side="right") - 1
    draws = [fewest_draws(p, norm.cdf(radii[j] / sigma), args.alpha)
             if fixed["predict"][i] != -1 else 0 for i, (p, j) in enumerate(zip(p_hat, level))]
    return float(np.mean(args.n0 + np.array(draws)))


def fewest_draws(p: float, threshold: float, alpha: float) -> int:
    """The fewest t with clopper_pearson_lower(⌊p·t⌋, t, α) > threshold (p > threshold)."""
    def passes(t):
        return clopper_pearson_lower(math.floor(p * t), t, alpha) > threshold

    high = math.ceil(math.log(alpha) / math.log(threshold))  # the all-hit floor
    while not passes(high):
        high *= 2
    low = high // 2  # passes(high), not passes(low) unless low is below the floor
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if passes(middle) else (middle, high)
    return high


def compare(grid: np.ndarray, fixed, seq) -> tuple[np.ndarray, np.ndarray]:
    by_idx = np.argsort(np.asarray(seq["idx"]))
    order = np.asarray(fixed["idx"])[np.argsort(np.asarray(fixed["idx"]))]
    assert np.array_equal(order, np.asarray(seq["idx"])[by_idx]), "not the same images"
    return certified_accuracy(fixed, grid), certified_accuracy(seq, grid)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out-dir", default="runs/sequential")
    p.add_argument("--grids", nargs="+", default=["0,0.25,0.5,0.75", "0,0.25,0.5"])
    p.add_argument("--tests", nargs="+", default=["union", "mixture"])
    p.add_argument("--skip", type=int, default=50)
    p.add_argument("--max", type=int, default=200)
    p.add_argument("--n0", type=int, default=100)
    p.add_argument("--n", type=int, default=100_000, help="fixed n, and the sequential n_max")
    p.add_argument("--alpha", type=float, default=0.001)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timing-images", type=int, default=10,
                   help="fixed-n images timed for the wall clock; 0: no wall clock")
    p.add_argument("--data-root")
    p.add_argument("--device", default="cpu", help="cpu, cuda, ...: where the draws run")
    args = p.parse_args()
    print_environment(torch.device(args.device))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fixed, _ = run(args, config(args, "certify"), out / "fixed_n.tsv")
    fixed_draws = draws_per_image(fixed).mean()
    print(f"{len(fixed['idx'])} images (every {args.skip}th test image), α = {args.alpha}, "
          f"n0 = {args.n0}; fixed n = n_max = {args.n}\n")
    rows = []
    for grid in args.grids:
        for test in args.tests:
            cfg = config(args, "sequential", radii=grid, test=test)
            name = f"sequential_{test}_{grid.replace(',', '_')}.tsv"
            seq, _ = run(args, cfg, out / name)
            radii = np.array(sorted({0.0, *(float(r) for r in grid.split(","))}))
            acc_fixed, acc_seq = compare(radii, fixed, seq)
            floor = oracle_floor(fixed, radii, cfg.sigma, args)
            rows.append((grid, test, seq, acc_fixed, acc_seq, radii, floor))
        expected = expected_hits_oracle(fixed, radii, cfg.sigma, args)
        print(f"grid {grid}: expected-hits oracle {expected:,.0f} forward passes per image "
              f"({fixed_draws / expected:.1f}× fewer than fixed-n)")
    print("| grid | test | forward passes / image | × fewer than fixed-n | oracle floor "
          "(× fewer) | certified accuracy fixed-n → sequential (per radius) | max gap (points) |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: |")
    for grid, test, seq, acc_fixed, acc_seq, radii, floor in rows:
        mean = draws_per_image(seq).mean()
        cells = ", ".join(f"r={r:g}: {100 * a:.1f} → {100 * b:.1f}"
                          for r, a, b in zip(radii, acc_fixed, acc_seq))
        gap = 100 * np.max(np.abs(acc_fixed - acc_seq))
        print(f"| {grid} | {test} | {mean:,.0f} | {fixed_draws / mean:.1f} | {floor:,.0f} "
              f"({fixed_draws / floor:.1f}) | {cells} | {gap:.1f} |")
    print(f"\nfixed-n: {fixed_draws:,.0f} forward passes per image")
    if args.timing_images:
        wall_clock(args, rows)


def wall_clock(args, rows) -> None:
    """Time, in this process, the fixed-n CERTIFY of a few images and every sequential run."""
    grid, test = rows[0][0], rows[0][1]
    before = fixed_seconds_per_image(args)
    with tempfile.TemporaryDirectory() as tmp:
        seq, seconds = run(args, config(args, "sequential", radii=grid, test=test),
                           Path(tmp) / "seq.tsv")
    after = fixed_seconds_per_image(args)
    per_image_fixed = (before + after) / 2
    per_image_seq = seconds / len(seq["idx"])
    print(f"wall clock ({grid}, {test}): fixed-n {per_image_fixed:.2f} s/image "
          f"(timed on {args.timing_images} images, before and after), sequential "
          f"{per_image_seq:.3f} s/image over all {len(seq['idx'])} images: "
          f"{per_image_fixed / per_image_seq:.1f}× faster")


if __name__ == "__main__":
    main()
