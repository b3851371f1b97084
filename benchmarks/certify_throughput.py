"""Monte Carlo throughput of certification: reference loop vs smoothcert's engine vs ceiling.

For one model, batch size and number of noisy samples n, in one run on one device:

(a) ``reference``: a faithful re-implementation of the semantics of Cohen et al.'s
    ``Smooth._sample_noise`` (``code/core.py``): per batch ``x.repeat``, ``randn_like``,
    forward, predictions moved to the host and counted in a Python loop over the batch;
(b) ``smoothcert``: the engine behind ``Smoothed`` (``sampling.BatchedVotes``);
(c) ``ceiling``: the model's forward pass alone on a preallocated batch (no noise, no counting).

Throughput is noisy samples per second (median of ``--repeats`` timings). Random weights: the
cost of a forward pass does not depend on them.

    python benchmarks/certify_throughput.py --n 20000 --batch 1000
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import torch
from common import print_environment

from smoothcert import Gaussian
from smoothcert.models import build_model
from smoothcert.sampling import BatchedVotes

MODELS = {"lenet": (1, 28, 28), "cifar_resnet20": (3, 32, 32)}


def reference_counts(model, x, sigma, num, batch_size, num_classes):
    """Cohen et al.'s sampling loop, re-implemented with the same per-batch work."""
    with torch.no_grad():
        counts = np.zeros(num_classes, dtype=int)
        for _ in range(math.ceil(num / batch_size)):
            this_batch = min(batch_size, num)
            num -= this_batch
            batch = x.repeat((this_batch, 1, 1, 1))
            noise = torch.randn_like(batch) * sigma
            predictions = model(batch + noise).argmax(1)
            for idx in predictions.cpu().numpy():  # their _count_arr: one Python step per draw
                counts[idx] += 1
        return counts


def smoothcert_counts(model, x, sigma, num, batch_size, num_classes):
    generator = torch.Generator(device=x.device).manual_seed(0)
    return BatchedVotes().votes(model, x, Gaussian(sigma), num, num_classes, batch_size,
                                generator).cpu()


def ceiling(model, x, sigma, num, batch_size, num_classes):
    batch = x.expand((batch_size,) + tuple(x.shape)).contiguous()
    with torch.inference_mode():
        for _ in range(math.ceil(num / batch_size)):
            logits = model(batch)
        return logits.argmax(1).cpu()  # one sync at the end


def throughput(fn, model, x, args, device) -> float:
    times = []
    for _ in range(args.repeats + 1):  # the first run warms up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn(model, x, 0.25, args.n, args.batch, 10)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return args.n / statistics.median(times[1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="noisy samples per timing")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    print_environment(device)
    print(f"n = {args.n} noisy samples per timing, batch {args.batch}, median of {args.repeats}\n")
    print("| model | reference (a) | smoothcert (b) | ceiling (c) | b/a | b/c |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in args.models:
        shape = MODELS[name]
        model = build_model(name, 10, shape, [0.5] * shape[0], [0.25] * shape[0]).to(device)
        model.eval()
        x = torch.rand(shape, generator=torch.Generator().manual_seed(0)).to(device)
        a, b, c = (throughput(fn, model, x, args, device)
                   for fn in (reference_counts, smoothcert_counts, ceiling))
        print(f"| {name} | {a:,.0f} | {b:,.0f} | {c:,.0f} | {b / a:.2f} | {b / c:.2f} |")


if __name__ == "__main__":
    main()
