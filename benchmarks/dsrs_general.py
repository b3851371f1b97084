"""The generalized Gaussian and DSRS at the paper's setting (d = 784, k = 380): seconds per image
of CERTIFY with ``general-gaussian:k=380`` against Gaussian noise (the draws differ: a gamma
radius per row), of the radius computations alone (Neyman–Pearson for this P; DSRS with Q of
scale 0.8σ and with P's ball, ``x``), and of the ``dsrs`` certifier end to end (``x+`` and
``q=scale``) against CERTIFY, in one run on one device (``lenet`` at 1×28×28, random weights),
median over ``--rounds`` interleaved rounds.

    python benchmarks/dsrs_general.py --threads 1 --images 2 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from certify_throughput import make_model
from common import print_environment

from smoothcert.certifiers import dsrs
from smoothcert.noise import NOISES, general_gaussian
from smoothcert.runs import certify_dataset

SHAPE, CLASSES, DIM, K = (1, 28, 28), 10, 784, 380
GG = f"general-gaussian:k={K}"


def run(model, data, args, noise, certifier="certify", options=None):
    certify_dataset(model, data, noise=noise, sigma=args.sigma, n0=args.n0, n=args.n,
                    batch=args.batch, num_classes=CLASSES, device=args.device,
                    certifier=certifier, options=options or {})


def radii(args, kind):
    """Fresh caches; 5 distinct probabilities (p, and q = p + 0.005 for DSRS)."""
    dsrs._radius.cache_clear()
    noise = NOISES[GG](args.sigma)
    general_gaussian._unit_radius.cache_clear()
    for p in (0.7, 0.8, 0.9, 0.95, 0.99):
        if kind == "np":
            noise.radius(p, DIM)
        else:
            dsrs.dsrs_certificate(int(p * 1000), 1000, int(p * 1000) + 5, 1000, 0.001, 0.5,
                                  args.sigma, DIM, 0.5, k=K, q=kind)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=2)
    p.add_argument("--n0", type=int, default=100)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--sigma", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print_environment(device)
    model = make_model("lenet", device)
    g = torch.Generator().manual_seed(0)
    xs = torch.randint(0, 256, (args.images, *SHAPE), generator=g).float() / 255
    data = torch.utils.data.TensorDataset(xs, torch.zeros(args.images, dtype=torch.long))
    jobs = {
        "certify, gaussian": lambda: run(model, data, args, "gaussian"),
        f"certify, {GG}": lambda: run(model, data, args, GG),
        "dsrs x+ (ball), gaussian": lambda: run(model, data, args, "gaussian", "dsrs"),
        f"dsrs x+ (ball), {GG}": lambda: run(model, data, args, GG, "dsrs"),
        f"dsrs q=scale, {GG}": lambda: run(model, data, args, GG, "dsrs", {"q": "scale"}),
        "radius NP, 5 p (per p)": lambda: radii(args, "np"),
        "radius DSRS ball, 5 (p, q) (per pair)": lambda: radii(args, "ball"),
        "radius DSRS scale, 5 (p, q) (per pair)": lambda: radii(args, "scale"),
    }
    times = {name: [] for name in jobs}
    for _ in range(args.rounds):
        for name, job in jobs.items():
            start = time.perf_counter()
            job()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["certify, gaussian"]) / args.images
    print(f"images {args.images}, n0 {args.n0}, n {args.n}, batch {args.batch}, "
          f"sigma {args.sigma}")
    print("| job | seconds per image (or per radius) | × CERTIFY-Gaussian per image |")
    print("|---|---:|---:|")
    for name, ts in times.items():
        per = statistics.median(ts) / (5 if name.startswith("radius") else args.images)
        print(f"| {name} | {per:.3f} | {per / base:.2f} |")


if __name__ == "__main__":
    main()
