"""Monte Carlo throughput of certification: reference loop vs smoothcert's engine vs ceiling.

One workload — CERTIFY of ``--images`` inputs with n0 selection and n estimation draws each —
timed in one run, on one device, model and batch size:

(a) ``reference``: a faithful re-implementation of the semantics of Cohen et al.'s
    ``Smooth._sample_noise`` (``code/core.py``): per batch ``x.repeat``, ``randn_like``,
    forward, predictions moved to the host and counted in a Python loop over the batch; one
    input at a time (n0 draws, then n draws);
(b) ``smoothcert``: ``Smoothed.run`` over the inputs' CERTIFY programs — batches filled across
    inputs, noise drawn in place from each input's generator, votes counted on device — at
    default settings, then with each optional acceleration (``--accelerations``);
(c) ``ceiling``: the model's forward pass alone on a preallocated batch of noisy inputs (drawn
    once, before the timing), as many full batches as the workload has draws (no noise drawn,
    no counting, one sync at the end). ``c, one input`` is the same on copies of one clean
    input, for comparison: on a CPU its forward runs faster than on noisy inputs (max-pool and
    ReLU branch the same way for every row), a speed no certification workload can reach.

Throughput is noisy samples per second, median over ``--rounds`` rounds in which every variant
runs once (interleaved, so that drift of a shared machine hits all of them alike). Random
weights: the cost of a forward pass does not depend on them.

    python benchmarks/certify_throughput.py --n 20000 --batch 1000
    python benchmarks/certify_throughput.py --device cuda --n 100000 --models lenet \
        cifar_resnet20 cifar_resnet110 resnet50 --seconds-per-image
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
from smoothcert.smoothing.engine import BatchedVotes
from smoothcert.smoothing.smoothed import Smoothed

MODELS = {"lenet": (1, 28, 28), "cifar_resnet20": (3, 32, 32), "cifar_resnet110": (3, 32, 32),
          "resnet50": (3, 224, 224)}
ACCELERATIONS = {"channels_last": {"channels_last": True}, "compile": {"compile": True},
                 "bf16": {"precision": "bf16"}, "fp16": {"precision": "fp16"}}
SIGMA, NUM_CLASSES = 0.25, 10


def make_model(name: str, device, num_classes: int = NUM_CLASSES) -> torch.nn.Module:
    """Random weights behind our normalization layer; ``resnet50`` is torchvision's ImageNet
    ResNet-50 (ImageNet mean and std). The model carries ``num_classes`` and ``input_shape``."""
    shape = MODELS[name]
    if name == "resnet50":
        mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    else:
        mean, std = [0.5] * shape[0], [0.25] * shape[0]
    return build_model(name, num_classes, shape, mean, std).to(device).eval()


def reference(model, xs, args):
    """Cohen et al.'s sampling loop, re-implemented with the same per-batch work."""
    def sample_noise(x, num):
        counts = np.zeros(model.num_classes, dtype=int)
        with torch.no_grad():
            for _ in range(math.ceil(num / args.batch)):
                this_batch = min(args.batch, num)
                num -= this_batch
                batch = x.repeat((this_batch, 1, 1, 1))
                noise = torch.randn_like(batch) * SIGMA
                predictions = model(batch + noise).argmax(1)
                for idx in predictions.cpu().numpy():  # their _count_arr: a Python step a draw
                    counts[idx] += 1
        return counts

    for x in xs:
        sample_noise(x, args.n0), sample_noise(x, args.n)


def engine(settings: dict | BatchedVotes):
    """CERTIFY of every input through ``Smoothed.run``, with an engine of these settings (or
    this engine: its prepared, e.g. compiled, model is then kept across calls)."""
    votes = settings if isinstance(settings, BatchedVotes) else BatchedVotes(**settings)

    def run(model, xs, args):
        smoothed = Smoothed(model, Gaussian(SIGMA), model.num_classes, votes)
        programs = [(i, smoothed.certify_program(x, args.n0, args.n, 0.001,
                                                 torch.Generator(x.device).manual_seed(i)))
                    for i, x in enumerate(xs)]
        for _ in smoothed.run(programs, args.batch):
            pass
    return run


def ceiling(model, xs, args, votes: BatchedVotes | None = None):
    """The forward passes alone, on one batch of noisy inputs drawn before the timing."""
    g = torch.Generator(xs[0].device).manual_seed(0)
    noise = torch.randn((args.batch,) + tuple(xs[0].shape), generator=g, device=xs[0].device)
    return forward_only(model, xs[0] + SIGMA * noise, len(xs), args, votes)


def ceiling_identical(model, xs, args):
    """The same, on ``batch`` copies of one clean input: data-dependent branches (max-pool,
    ReLU) then always take the same path, which is faster than any noisy workload can be."""
    batch = xs[0].expand((args.batch,) + tuple(xs[0].shape)).contiguous()
    return forward_only(model, batch, len(xs), args)


def forward_only(model, batch, images, args, votes: BatchedVotes | None = None):
    """As many forward passes of ``batch`` as the workload has full batches; with ``votes``,
    the model, input layout and autocast are that engine's (its ``prepare`` and ``forward``)."""
    forward = model
    if votes is not None:
        num_classes, runnable = model.num_classes, votes.prepare(model)
        forward = lambda b: votes.forward(runnable, b, b.shape[0], num_classes)  # noqa: E731
        batch = batch.contiguous(memory_format=torch.channels_last if votes.channels_last
                                 else torch.contiguous_format)
    with torch.inference_mode():
        for _ in range(math.ceil(images * (args.n0 + args.n) / args.batch)):
            logits = forward(batch)
        logits.argmax(1).cpu()  # one sync at the end


def timed(fn, model, xs, args, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn(model, xs, args)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def variants(args) -> dict:
    out = {"reference (a)": reference, "smoothcert (b)": engine({})}
    for name in args.accelerations:
        out[f"b + {name}"] = engine(ACCELERATIONS[name])
    out["ceiling (c)"] = ceiling
    out["c, one input"] = ceiling_identical
    return out


def bench_model(name: str, args, device) -> dict:
    model = make_model(name, device)
    g = torch.Generator().manual_seed(0)
    xs = [torch.rand(MODELS[name], generator=g).to(device) for _ in range(args.images)]
    runs = variants(args)
    for fn in runs.values():  # warm-up (and compilation) outside the timings
        fn(model, xs[:1], argparse.Namespace(**{**vars(args), "n": args.batch}))
    times = {key: [] for key in runs}
    for _ in range(args.rounds):
        for key, fn in runs.items():
            times[key].append(timed(fn, model, xs, args, device))
    draws = args.images * (args.n0 + args.n)
    return {key: draws / statistics.median(t) for key, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="estimation draws per image")
    p.add_argument("--n0", type=int, default=100, help="selection draws per image")
    p.add_argument("--images", type=int, default=4, help="images per timing")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", nargs="+", default=["lenet", "cifar_resnet20"],
                   choices=list(MODELS))
    p.add_argument("--accelerations", nargs="*", default=["channels_last", "compile", "bf16"],
                   choices=list(ACCELERATIONS))
    p.add_argument("--seconds-per-image", action="store_true",
                   help="also print seconds per certified image at n0=100, n=100,000")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    print_environment(device)
    print(f"workload: CERTIFY of {args.images} images, n0 = {args.n0}, n = {args.n}, "
          f"batch {args.batch}; noisy samples/s, median of {args.rounds} interleaved rounds\n")
    keys = list(variants(args))
    print("| model | " + " | ".join(keys) + " | b/a | b/c | best/a |")
    print("| --- |" + " ---: |" * (len(keys) + 3))
    for name in args.models:
        r = bench_model(name, args, device)
        best = max(v for k, v in r.items() if k == "smoothcert (b)" or k.startswith("b + "))
        cells = " | ".join(f"{r[k]:,.0f}" for k in keys)
        b, a, c = r["smoothcert (b)"], r["reference (a)"], r["ceiling (c)"]
        print(f"| {name} | {cells} | {b / a:.2f} | {b / c:.2f} | {best / a:.2f} |")
        if args.seconds_per_image:
            print(f"|   {name}: seconds per certified image at n0=100, n=100,000: "
                  f"reference {100_100 / a:.3f}, smoothcert {100_100 / b:.3f}, "
                  f"best {100_100 / best:.3f} |")


if __name__ == "__main__":
    main()
