"""Every registered noise (``smoothcert.noise.NOISES``): seconds per image of CERTIFY, the noise's
drawing alone, and the time to build its radius tables, against Gaussian noise.

For each noise at the same σ, timed in one run on one device and model (``lenet`` at
Fashion-MNIST's 1×28×28, random weights: the cost of a forward does not depend on them), on
``--images`` random 8-bit inputs (on the 1/255 grid, which the discrete Gaussians need and every
other noise accepts), median over ``--rounds`` interleaved rounds (every noise runs once per
round, so drift of a shared machine hits all of them alike):

* ``certify``: ``certify_dataset(model, ..., noise=NAME)`` with n0 and n draws per image at
  ``--batch``: the engine and the record pipeline but the file (radii in every norm included);
* ``draws``: the noise alone, ``perturb_`` into a ``--batch``-row buffer (what the engine draws
  through: ``sample_`` plus the input, or the discrete Gaussian's exact noisy inputs), as many
  batches as the certification has draws;
* ``radii``: ``noise.radii`` of 1,000 probabilities at d = 784 in a fresh process state, first
  call (the differential method's tables are built: laplace ℓ∞, exp1 ℓ1), then again (the
  tables memoized); a noise without a table computes closed forms in both.

"× Gaussian" is the median over rounds of the noise's time over Gaussian's in the same round.

    python benchmarks/lp_noises.py --threads 1 --images 2 --rounds 3
    python benchmarks/lp_noises.py --device cuda --images 20 --batch 1000
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from contextlib import contextmanager

import numpy as np
import torch
from certify_throughput import make_model
from common import start_run
from sound_noise import timed

from smoothcert.noise import NOISES, tables
from smoothcert.noise.base import noise_examples
from smoothcert.runs import certify_dataset

SHAPE, CLASSES, DIM = (1, 28, 28), 10, 784


def certify(model, data, name: str, args) -> None:
    certify_dataset(model, data, noise=name, sigma=args.sigma, n0=args.n0, n=args.n,
                    batch=args.batch, num_classes=CLASSES, device=args.device)


def draws(noise, xs: torch.Tensor, args) -> None:
    """``perturb_`` of every image's n0 + n draws into one buffer, a batch at a time."""
    buffer = torch.empty((args.batch, *SHAPE), device=xs.device)
    g = torch.Generator(xs.device).manual_seed(0)
    for x in xs:
        for _ in range(max(1, (args.n0 + args.n) // args.batch)):
            noise.perturb_(buffer, x, g)
    buffer.sum().item()  # one sync at the end


@contextmanager
def fresh_tables():
    """The tables' per-process memo empty inside (as in a new process), restored on leaving."""
    memo = dict(tables._MEMO)
    tables._MEMO.clear()
    try:
        yield
    finally:
        tables._MEMO.clear()
        tables._MEMO.update(memo)


def radii_times(noise) -> tuple[float, float]:
    """Seconds of ``noise.radii`` at d = 784: first in a fresh process's state (the tables are
    built), then again (memoized)."""
    p = np.linspace(0.5, 1.0 - 1e-6, 1000)
    out = []
    with fresh_tables():
        for _ in range(2):
            start = time.perf_counter()
            noise.radii(p, DIM)
            out.append(time.perf_counter() - start)
    return out[0], out[1]


def jobs(model, xs, args) -> dict:
    """(noise, what) -> a function of no arguments returning seconds, for every noise."""
    device = xs.device
    data = torch.utils.data.TensorDataset(xs.cpu(), torch.zeros(len(xs), dtype=torch.long))
    out = {}
    for name in args.noises:
        noise = NOISES[name](args.sigma)
        out[name, "certify"] = lambda name=name: timed(lambda: certify(model, data, name, args),
                                                       device)
        out[name, "draws"] = lambda noise=noise: timed(lambda: draws(noise, xs, args), device)
        out[name, "radii"] = lambda noise=noise: radii_times(noise)
    return out


def measure(args) -> dict:
    """Every job once as a warm-up (kernels, allocator, tables in memory), then ``--rounds``
    interleaved rounds; returns the list of times of every job."""
    device = torch.device(args.device)
    model = make_model("lenet", device)
    g = torch.Generator().manual_seed(0)
    xs = (torch.randint(0, 256, (args.images, *SHAPE), generator=g).float() / 255).to(device)
    work = jobs(model, xs, args)
    times = {key: [] for key in work}
    with fresh_tables():
        for key, job in work.items():  # the warm-up puts certify's tables in memory
            if key[1] != "radii":
                job()
        for _ in range(args.rounds):
            for key, job in work.items():
                times[key].append(job())
    return times


def ratio(times: dict, name: str, what: str) -> float:
    """Median over rounds of the noise's time over Gaussian's in the same round."""
    return statistics.median(t / g for t, g in zip(times[name, what], times["gaussian", what]))


def per_round(times: dict, args) -> list[str]:
    """Each round's time over Gaussian's in that round, certify and draws, for every noise."""
    lines = []
    for what in ("certify", "draws"):
        cells = [f"{name} " + "/".join(f"{t / g:.2f}" for t, g in
                                      zip(times[name, what], times["gaussian", what]))
                 for name in args.noises[1:]]
        lines.append(f"per round, {what} × Gaussian: " + ", ".join(cells))
    return lines


def table(times: dict, args) -> list[str]:
    draws_per_image = args.n0 + args.n
    rows = ["| noise | norms certified directly | certify s/image | × Gaussian | draws/s "
            "(perturb_) | × Gaussian (time) | radii, first call (ms) | radii, memoized (ms) |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in args.noises:
        cert = statistics.median(times[name, "certify"]) / args.images
        drawn = max(1, draws_per_image // args.batch) * args.batch * args.images
        rate = drawn / statistics.median(times[name, "draws"])
        build = statistics.median(t[0] for t in times[name, "radii"]) * 1e3
        read = statistics.median(t[1] for t in times[name, "radii"]) * 1e3
        norms = ", ".join(NOISES[name].certified_norms())
        rows.append(f"| {name} | {norms} | {cert:.3f} | {ratio(times, name, 'certify'):.2f} | "
                    f"{rate:,.0f} | {ratio(times, name, 'draws'):.2f} | {build:,.1f} | "
                    f"{read:,.1f} |")
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--noises", nargs="+", default=list(noise_examples()),
                   choices=list(noise_examples()),
                   help="default: every registered noise (gaussian is always added)")
    p.add_argument("--sigma", type=float, default=0.5)
    p.add_argument("--images", type=int, default=2)
    p.add_argument("--n0", type=int, default=100)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    args.noises = ["gaussian"] + [n for n in args.noises if n != "gaussian"]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    load = start_run(args.device, args.threads)
    print(f"\nworkload: CERTIFY of {args.images} random 8-bit images of 1x28x28, lenet (random "
          f"weights), σ = {args.sigma}, n0 = {args.n0}, n = {args.n}, batch {args.batch}; "
          f"radii at d = {DIM}; median of {args.rounds} interleaved rounds\n", flush=True)
    times = measure(args)
    print("\n".join(table(times, args)))
    print("\n" + "\n".join(per_round(times, args)))
    if load:
        print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
