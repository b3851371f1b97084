"""TSS's sampling-based certification of rotation and scaling (Li et al., CCS 2021; issue 47,
item 5): seconds per image of its two parts against the authors' loops and against CERTIFY.

In one run on one device, on ``--images`` random 8-bit inputs of ``--shape`` (default
Fashion-MNIST's 1×28×28; ``lenet``, random weights: the cost of a forward does not depend on
them), median over ``--rounds`` interleaved rounds:

* ``bound``: the interpolation bound of every slice (``slice_bounds``: all S·(R + 1)
  transformed images of a block in one batched call, float64), against (``--authors PATH``)
  the authors' aliasing analysis, the ``__main__`` block of their
  ``semantic/strict_rotation_aliasing_analyze.py`` (or ``strict_resize_aliasing_analyze.py``)
  run as it is on the same image at our grid (one ``proc`` call per sub-interval end, float32;
  their rotation grid visits S + 2 slices, ours S: the ratio is per slice);
* ``certify``: ``certify_dataset(..., certifier="tss")`` with the rotation: n0 selection draws,
  then n draws at each of the S samples, against CERTIFY with Gaussian noise at the same σ, n0
  and n. A random-weight model on random images has a large interpolation bound and would stop
  at the first slices, so the bound is set to 0 in this job (the cost of a robust input, whose
  every sample is visited; "visited" below counts them from the model's forwards). "×
  Gaussian" is the time ratio (about S: the price of sampling), "per draw" divides it by the
  draws' ratio (S·n + n0)/(n + n0).

    python benchmarks/tss_sampling.py --threads 2 --authors /tmp/tss
    python benchmarks/tss_sampling.py --device cuda --images 10 --n 10000 --batch 2000
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import io
import math
import os
import statistics
import tempfile
import time
import types
from pathlib import Path

import torch
from certify_throughput import make_model
from common import start_run
from sound_noise import timed
from tss_cost import interleaved, load_authors

from smoothcert.errors import SmoothcertError
from smoothcert.runs import certify_dataset
from smoothcert.transforms import build_transformation

CLASSES = 10


FILES = {"rotation": ("strict_rotation_aliasing_analyze.py", ("get_finer_lipschitz_bound",)),
         "scaling": ("strict_resize_aliasing_analyze.py", ("calc_dist_map", "get_local_maps"))}
"""Per family: their aliasing analysis' file and the functions its ``__main__`` block calls."""


def their_aliasing(root: Path, family: str):
    """Their aliasing analysis' functions (a namespace) and ``__main__`` block, as code
    (importing the file would parse our command line)."""
    name, functions = FILES[family]
    tree = ast.parse((root / "semantic" / name).read_text())
    kept = [node for node in tree.body if isinstance(node, ast.FunctionDef)
            and node.name in functions]
    block = next(node for node in tree.body if isinstance(node, ast.If))
    namespace = {"torch": torch, "math": math, "EPS": 1e-5}  # their resize file's EPS
    exec(compile(ast.Module(kept, []), "aliasing", "exec"), namespace)
    return namespace, compile(ast.Module(block.body, []), "aliasing-main", "exec")


def their_arguments(t, folder: str) -> argparse.Namespace:
    """Their command line for our grid: rotation's slice counts slices of 360 degrees (S of
    ours in 2Δ), scaling's slice and subslice count points (S + 1, R + 1)."""
    common = dict(dataset="ours", aliasfile=os.path.join(folder, "alias"), start=0, max=-1,
                  skip=1, split="test", verbstep=10**9)
    if t.name == "rotation":
        return argparse.Namespace(**common, slice=round(360 * t.slices / (2 * t.angle)),
                                  subslice=t.subslices, partial=t.angle)
    return argparse.Namespace(**common, sl=t.low, sr=t.high, slice=t.slices + 1,
                              subslice=t.subslices + 1, uniform=False)


def authors_bound(tr, their, x: torch.Tensor, t) -> None:
    """Their ``__main__`` on x at our grid (:func:`their_arguments`)."""
    functions, code = their
    with tempfile.TemporaryDirectory() as folder:
        namespace = {**functions, "args": their_arguments(t, folder), "os": os,
                     "time": time.time, "datetime": datetime,
                     "RotationTransformer": tr.RotationTransformer,
                     "ResizeTransformer": tr.ResizeTransformer,
                     "get_dataset": lambda *_: [(x.cpu(), 0)],
                     "setproctitle": types.SimpleNamespace(setproctitle=lambda *_: None)}
        with contextlib.redirect_stdout(io.StringIO()):
            exec(code, namespace)


def jobs(model, xs, t, args, tr=None, their=None) -> dict:
    """(row) -> a function of no arguments returning seconds."""
    device = xs.device
    data = torch.utils.data.TensorDataset(xs.cpu(), torch.zeros(len(xs), dtype=torch.long))
    common = dict(n0=args.n0, n=args.n, batch=args.batch, num_classes=CLASSES, device=device)
    out = {
        "bound": lambda: timed(lambda: [t.slice_bounds(x) for x in xs], device),
        "certify": lambda: timed(lambda: every_sample(t, lambda: certify_dataset(
            model, data, certifier="tss", options={"transform": args.transform}, **common)),
            device),
        "gaussian": lambda: timed(lambda: certify_dataset(
            model, data, noise="gaussian", sigma=t.sigma, **common), device),
    }
    if tr is not None:
        out["authors bound"] = lambda: timed(
            lambda: [authors_bound(tr, their, x, t) for x in xs], torch.device("cpu"))
    return out


def every_sample(t, run):
    """``run()`` with every slice's bound of ``t``'s class 0: each sample is visited (the
    ``certify`` job in the module docstring)."""
    cls = type(t)
    saved = cls.slice_bounds
    cls.slice_bounds = lambda self, x: torch.zeros(self.slices, dtype=torch.float64)
    try:
        return run()
    finally:
        cls.slice_bounds = saved


def visited(model, xs, t, args) -> str:
    """How many samples the program visited per image (the run's rows say nothing of it:
    count the engine's forwards)."""
    calls = [0]
    handle = model.register_forward_hook(lambda m, i, o: calls.__setitem__(0, calls[0]
                                                                           + len(i[0])))
    data = torch.utils.data.TensorDataset(xs.cpu(), torch.zeros(len(xs), dtype=torch.long))
    every_sample(t, lambda: certify_dataset(
        model, data, certifier="tss", options={"transform": args.transform}, n0=args.n0,
        n=args.n, batch=args.batch, num_classes=CLASSES, device=xs.device))
    handle.remove()
    per_image = (calls[0] / len(xs) - args.n0) / args.n
    return f"samples visited per image: {per_image:.1f}"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--transform", default="rotation:sigma=0.25,angle=10,slices=100,"
                                          "subslices=50")
    p.add_argument("--shape", default="1,28,28")
    p.add_argument("--images", type=int, default=2)
    p.add_argument("--n0", type=int, default=100)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int)
    p.add_argument("--authors", metavar="PATH", help="a clone of AI-secure/semantic-"
                                                     "randomized-smoothing")
    args = p.parse_args(argv)
    if build_transformation(args.transform).name not in FILES:
        raise SmoothcertError(f"{args.transform}: this benchmark times rotation and scaling")
    args.shape = tuple(int(s) for s in args.shape.split(","))
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    t = build_transformation(args.transform)
    shape = args.shape
    t.check_shape(shape)
    load = start_run(args.device, args.threads)
    tr, line, _ = load_authors(args.authors)
    their = their_aliasing(Path(args.authors), t.name) if tr is not None else None
    print(line)
    device = torch.device(args.device)
    model = make_model("lenet" if shape == (1, 28, 28) else "cifar_resnet20", device)
    g = torch.Generator().manual_seed(0)
    xs = (torch.randint(0, 256, (args.images, *shape), generator=g).float() / 255).to(device)
    print(f"\nworkload: {args.transform} on {args.images} random images of {shape}, n0 = "
          f"{args.n0}, n = {args.n}, batch {args.batch}; median of {args.rounds} rounds\n")
    times = interleaved(jobs(model, xs, t, args, tr, their), args.rounds)
    print(table(times, t, args))
    print("\n" + visited(model, xs, t, args))
    if load:
        print(f"load average at end: {os.getloadavg()[0]:.2f}")


def their_slices(t) -> int:
    """Slices their loop visits: rotation's touch [−Δ, Δ] (one more each side), scaling's S."""
    return t.slices + 2 if t.name == "rotation" else t.slices


def table(times: dict, t, args) -> str:
    """Seconds per image (medians over rounds) and each ratio as the median over rounds of the
    two jobs' times in the same round (the drift of a shared machine cancels), then each
    round's ratios."""
    per = {key: statistics.median(v) / args.images for key, v in times.items()}
    draws = (t.slices * args.n + args.n0) / (args.n + args.n0)
    certify = [a / b for a, b in zip(times["certify"], times["gaussian"])]
    lines = ["| part | ours s/image | compared with | its s/image | ratio |",
             "| --- | ---: | --- | ---: | ---: |"]
    bound = []
    if "authors bound" in per:  # per our S slices
        bound = [a * t.slices / their_slices(t) / b
                 for a, b in zip(times["authors bound"], times["bound"])]
        theirs = per["authors bound"] * t.slices / their_slices(t)
        lines.append(f"| interpolation bound | {per['bound']:.3f} | authors' aliasing loop "
                     f"| {theirs:.3f} | authors ÷ ours {statistics.median(bound):.1f} |")
    else:
        lines.append(f"| interpolation bound | {per['bound']:.3f} | – (no --authors) | – | – |")
    ratio = statistics.median(certify)
    lines.append(f"| certification (S = {t.slices} samples) | {per['certify']:.3f} | CERTIFY, "
                 f"Gaussian σ = {t.sigma:g} | {per['gaussian']:.3f} | × Gaussian "
                 f"{ratio:.1f}; per draw {ratio / draws:.2f} |")
    lines.append("\nper round: certify × Gaussian " + "/".join(f"{v:.1f}" for v in certify)
                 + ("; authors ÷ ours (bound) " + "/".join(f"{v:.1f}" for v in bound)
                    if bound else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
