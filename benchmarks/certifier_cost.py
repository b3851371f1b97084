"""Seconds per image of the certifiers that certify more from the same models (issue 38) next
to CERTIFY's, in one run: `certify`, `dsrs` (the same total draws, half under Q), `cascade` over
three levels (one model per σ) and `aces` (entropy selection, with a core model), each through
``certify_dataset`` on the same images, interleaved rounds, median.

    python benchmarks/certifier_cost.py [--checkpoints S100 S050 S025] [--core CORE]
                                        [--images 10] [--n0 100] [--n 10000] [--rounds 3]
                                        [--device cpu|cuda] [--threads T]

Without checkpoints the models are LeNets with random weights on 1×28×28 inputs (10 classes):
then every draw votes alike, the cascade answers at its first level and ACES' entropy is
whatever the random logits give, so the costs are those of the best case; with the study's
checkpoints (studies/tighter-certificates: Gaussian LeNets at σ = 1.0, 0.5, 0.25 and a standard
core) the cost follows where each certifier stops. CERTIFY, DSRS and ACES use the middle
checkpoint (σ = 0.5); the cascade all three. What each costs beside its forwards: DSRS its
radius search (a cached table per (σ, d, Q) and a bisection per image), the cascade up to K
levels of n0 + n draws, ACES a second n0 + n draws (its selection) and a clean core forward.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import print_environment

from smoothcert.models import build_model
from smoothcert.runs import certify_dataset

SHAPE, CLASSES = (1, 28, 28), 10
SIGMAS = (1.0, 0.5, 0.25)


def models(args) -> tuple[list, object]:
    """The three level models (largest σ first) and the core model."""
    if args.checkpoints:
        return list(args.checkpoints), args.core
    torch.manual_seed(0)
    made = [build_model("lenet", CLASSES, SHAPE, (0.5,), (0.5,)) for _ in range(4)]
    for m in made:
        m.num_classes = CLASSES
    return made[:3], made[3]


def runs(levels, core, args) -> dict:
    """name → keyword arguments of certify_dataset (besides model, data and the draws)."""
    middle = levels[1]
    return {
        "certify": dict(model=middle, sigma=0.5),
        "dsrs": dict(model=middle, sigma=0.5, certifier="dsrs"),
        "cascade": dict(model=levels[0], sigma=1.0, certifier="cascade",
                        options={"sigmas": "1.0,0.5,0.25"},
                        models={"level2": levels[1], "level3": levels[2]}),
        "aces": dict(model=middle, sigma=0.5, certifier="aces",
                     options={"selection": "entropy", "entropy_threshold": args.threshold},
                     models={"core": core}),
    }


def images(args) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    xs = torch.randint(0, 256, (args.images, *SHAPE), generator=g).float() / 255
    if args.data:
        from smoothcert.data.datasets import load_dataset

        test = load_dataset("fashion-mnist", "test", data_root=args.data)
        picks = range(0, len(test), len(test) // args.images)
        xs = torch.stack([test[i][0] for i in list(picks)[:args.images]])
    return torch.utils.data.TensorDataset(xs, torch.zeros(len(xs), dtype=torch.long))


def measure(args) -> dict:
    levels, core = models(args)
    data, jobs = images(args), runs(levels, core, args)
    times: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(args.rounds):
        for name, kwargs in jobs.items():
            tic = time.perf_counter()
            certify_dataset(kwargs["model"], data, **_call(kwargs, data, args))
            times[name].append((time.perf_counter() - tic) / args.images)
    return times


def _call(kwargs: dict, data, args) -> dict:
    rest = {k: v for k, v in kwargs.items() if k != "model"}
    return dict(rest, n0=args.n0, n=args.n, alpha=0.001, batch=args.batch, seed=0,
                num_classes=CLASSES, device=args.device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoints", nargs=3, metavar=("S100", "S050", "S025"))
    p.add_argument("--core", help="the core model's checkpoint (with --checkpoints)")
    p.add_argument("--data", help="a Fashion-MNIST folder: certify its test images (default: "
                                  "random 8-bit images)")
    p.add_argument("--images", type=int, default=10)
    p.add_argument("--n0", type=int, default=100)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threshold", type=float, default=0.3, help="ACES' entropy threshold")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, help="torch threads (CPU)")
    args = p.parse_args()
    if args.checkpoints and not args.core:
        p.error("--checkpoints needs --core")
    if args.threads:
        torch.set_num_threads(args.threads)
    print_environment(torch.device(args.device))
    source = "the given checkpoints" if args.checkpoints else "LeNets with random weights"
    print(f"\nworkload: {args.images} images of 1x28x28, {source}, n0 = {args.n0}, "
          f"n = {args.n}, batch {args.batch}, alpha = 0.001; seconds per image, median of "
          f"{args.rounds} interleaved rounds\n")
    times = measure(args)
    base = statistics.median(times["certify"])
    print("| certifier | s/image | × certify | per round |\n| --- | ---: | ---: | --- |")
    for name, values in times.items():
        median = statistics.median(values)
        rounds = "/".join(f"{v:.3f}" for v in values)
        print(f"| {name} | {median:.3f} | {median / base:.2f} | {rounds} |")


if __name__ == "__main__":
    main()
