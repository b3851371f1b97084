"""The sound discrete Gaussian against float Gaussian noise: throughput and certified accuracy.

Throughput (goal: the discrete noise at most 10% slower): CERTIFY of ``--images`` 8-bit inputs
(random, on the 1/255 grid) with n0 and n draws, through ``Smoothed.run``, once with
``Gaussian(σ)`` and once with ``DiscreteGaussian(σ)``, on random-weight models; plus the noise
alone (``perturb_`` into a batch buffer). Median of ``--rounds`` interleaved rounds, so drift
of a shared machine hits both alike; the ratio is within one run.

Accuracy (goal: within 1 point at every radius): with ``--checkpoint``, the same test images
certified under both noises (record files in ``--out-dir``, resumable), and certified accuracy
at ``--radii`` for each, with the largest difference in points.

    python benchmarks/sound_noise.py --models lenet cifar_resnet20 --n 10000
    python benchmarks/sound_noise.py --models \
        --checkpoint runs/seed-claims/gaussian_s050/checkpoint.pt --dataset fashion-mnist \
        --max 100 --skip 20 --n 10000 --out-dir runs/sound
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from certify_throughput import MODELS, make_model
from common import print_environment

from smoothcert.data.datasets import load_dataset
from smoothcert.evaluation.metrics import certified_accuracy
from smoothcert.noise.base import NOISES
from smoothcert.runs import certify_dataset
from smoothcert.runs.records import read_records
from smoothcert.smoothing.engine import BatchedVotes
from smoothcert.smoothing.smoothed import Smoothed

NOISE_NAMES = ("gaussian", "discrete-gaussian")


def certify_all(model, xs, noise, args):
    smoothed = Smoothed(model, noise, model.num_classes, BatchedVotes())
    programs = [(i, smoothed.certify_program(x, args.n0, args.n, 0.001,
                                             torch.Generator(x.device).manual_seed(i)))
                for i, x in enumerate(xs)]
    for _ in smoothed.run(programs, args.batch):
        pass


def noise_only(xs, noise, args):
    buffer = torch.empty((args.batch,) + tuple(xs[0].shape), device=xs[0].device)
    g = torch.Generator(xs[0].device).manual_seed(0)
    for x in xs:
        for _ in range(max(1, (args.n0 + args.n) // args.batch)):
            noise.perturb_(buffer, x, g)
    buffer.sum().item()  # one sync at the end


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def bench_model(name: str, args, device) -> dict:
    model = make_model(name, device)
    g = torch.Generator().manual_seed(0)
    xs = [(torch.randint(0, 256, MODELS[name], generator=g).float() / 255).to(device)
          for _ in range(args.images)]
    noises = {key: NOISES[key](args.sigma) for key in NOISE_NAMES}
    jobs = {}
    for key, noise in noises.items():
        jobs[f"certify, {key}"] = lambda noise=noise: certify_all(model, xs, noise, args)
        jobs[f"noise only, {key}"] = lambda noise=noise: noise_only(xs, noise, args)
    for job in jobs.values():  # warm-up: tables, allocator, kernels
        job()
    times = {key: [] for key in jobs}
    for _ in range(args.rounds):
        for key, job in jobs.items():
            times[key].append(timed(job, device))
    draws = args.images * (args.n0 + args.n)
    return {key: draws / statistics.median(t) for key, t in times.items()}


def throughput(args, device) -> None:
    print(f"workload: CERTIFY of {args.images} 8-bit images, n0 = {args.n0}, n = {args.n}, "
          f"batch {args.batch}, σ = {args.sigma}; noisy samples/s, median of {args.rounds} "
          "interleaved rounds\n")
    print("| model | certify, float Gaussian | certify, discrete | slower by | noise only, "
          "float | noise only, discrete |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in args.models:
        r = bench_model(name, args, device)
        f, d = r["certify, gaussian"], r["certify, discrete-gaussian"]
        print(f"| {name} | {f:,.0f} | {d:,.0f} | {100 * (f / d - 1):.1f}% | "
              f"{r['noise only, gaussian']:,.0f} | {r['noise only, discrete-gaussian']:,.0f} |")


def accuracy(args, device) -> None:
    dataset = load_dataset(args.dataset, "test", data_root=args.data_root)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    curves, p_hat = {}, {}
    for key in NOISE_NAMES:
        out = out_dir / f"{key}.tsv"
        certify_dataset(args.checkpoint, dataset, noise=key, n0=args.n0, n=args.n,
                        alpha=args.alpha, batch=args.batch, skip=args.skip,
                        max_count=args.max, device=device, out=out)
        records = read_records(out)
        curves[key] = certified_accuracy(records, args.radii)
        p_hat[key] = np.asarray(records["nA"], dtype=np.float64) / np.asarray(records["n"])
    gap = 100 * np.abs(curves["gaussian"] - curves["discrete-gaussian"])
    diff = p_hat["discrete-gaussian"] - p_hat["gaussian"]  # paired: the same images
    print(f"\ncertified accuracy (%), {args.checkpoint}, {args.dataset} test, every "
          f"{args.skip}th of the first {args.max} images, n0 = {args.n0}, n = {args.n}, "
          f"α = {args.alpha}")
    print("| noise | " + " | ".join(f"r = {r:g}" for r in args.radii) + " |")
    print("| --- |" + " ---: |" * len(args.radii))
    for key in NOISE_NAMES:
        print(f"| {key} | " + " | ".join(f"{100 * a:.1f}" for a in curves[key]) + " |")
    print(f"largest difference: {gap.max():.1f} points (one image: {100 / len(diff):.1f})")
    se = diff.std(ddof=1) / np.sqrt(len(diff))
    print(f"paired p̂_A, discrete − float: mean {diff.mean():+.5f} ± {se:.5f} (standard "
          f"error), largest |·| {np.abs(diff).max():.4f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="*", default=["lenet", "cifar_resnet20"],
                   choices=list(MODELS))
    p.add_argument("--sigma", type=float, default=0.5)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--n0", type=int, default=100)
    p.add_argument("--images", type=int, default=4)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--checkpoint", help="certify its test images under both noises")
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--data-root")
    p.add_argument("--max", type=int, default=100)
    p.add_argument("--skip", type=int, default=20)
    p.add_argument("--alpha", type=float, default=0.001)
    p.add_argument("--radii", type=float, nargs="+", default=[0, 0.25, 0.5, 0.75, 1, 1.25, 1.5])
    p.add_argument("--out-dir", default="runs/sound_noise")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    print_environment(device)
    if args.models:
        throughput(args, device)
    if args.checkpoint:
        accuracy(args, device)


if __name__ == "__main__":
    main()
