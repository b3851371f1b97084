"""The frontier of the sequential tests: forward passes per image against certified-accuracy loss.

Two modes, same table (per grid and test: mean forward passes per image, × fewer than fixed-n
CERTIFY with n = n_max, and the worst certified-accuracy loss against fixed-n over the grid
radii, in points):

* ``--simulate`` (default; seconds, no model): each image's top-class probability p_A is taken
  from fixed-n CERTIFY records (``fixed_n.tsv``, n = 100,000: p_A = nA/n; the rest of the mass is
  split evenly over the fewest other classes that each stay below p_A). The library's REAL
  procedure (:func:`smoothcert.stats.sequential_levels.run_levels`, selection and stopping rules
  included) is driven by a fake sampler drawing binomial counts from those probabilities with a
  fixed numpy generator; fixed-n CERTIFY is simulated from the same p's. Every image is repeated
  ``--reps`` times, so accuracies are expected values and the loss is an expected loss, not
  one draw's. ``--validate`` compares the simulation with the real sequential records beside
  ``fixed_n.tsv`` (mean passes and accuracy per radius). Writes a PNG of the frontier.
* ``--real``: the real checkpoint through :mod:`sequential` (records in ``--out-dir``; an
  existing fixed-n file with the same configuration is resumed, not redone).

    python benchmarks/sequential_frontier.py --simulate --reps 20 --png frontier.png
    python benchmarks/sequential_frontier.py --real --checkpoint CK --max 500 --skip 20
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from common import print_environment

import smoothcert.stats.sequential_tests as tests_module
from smoothcert.certifiers.sequential import DEFAULT_TEST
from smoothcert.runs.records import read_records
from smoothcert.stats import clopper_pearson_lower
from smoothcert.stats.sequential_levels import run_levels, thresholds
from smoothcert.stats.sequential_tests import SEQUENTIAL_TESTS, Targeted, TargetedFinal

RECORDS = Path(__file__).parent.parent / "studies/sequential/records"
GRIDS = ("0,0.25,0.5,0.75", "0,0.25,0.5")  # the 3σ and 2σ grids at σ = 0.25, as sequential.py


# --------------------------------------------------------------------------- the images
@dataclass(frozen=True)
class Images:
    """What the simulation needs per image: p_A of fixed-n's class ĉ_A, whether ĉ_A is the
    label, the other classes' probability (each) and how many there are."""

    p_top: np.ndarray
    correct: np.ndarray
    p_other: np.ndarray
    n_other: np.ndarray
    sigma: float
    idx: np.ndarray


def load_images(fixed_path: Path, sequential_paths=()) -> Images:
    """From fixed-n records; ĉ_A's correctness where fixed-n abstained comes from a sequential
    record that predicted (else: not the label; such images have p_A ≲ ½ and never count)."""
    fixed = read_records(fixed_path)
    p_top = np.asarray(fixed["nA"], np.float64) / np.asarray(fixed["n"], np.float64)
    correct = np.asarray(fixed["correct"], dtype=bool)
    abstained = np.asarray(fixed["predict"]) == -1
    for path in sequential_paths:
        seq = dict(zip(read_records(path)["idx"], zip(read_records(path)["predict"],
                                                       read_records(path)["label"])))
        for i, idx in enumerate(fixed["idx"]):
            predict, label = seq.get(idx, (-1, None))
            if abstained[i] and predict != -1:
                correct[i] = predict == label
    p_top = np.clip(p_top, 1e-9, 1.0)
    n_other = np.ceil((1.0 - p_top) / p_top - 1e-12).astype(int)  # each other class ≤ p_A
    p_other = np.where(n_other > 0, (1.0 - p_top) / np.maximum(n_other, 1), 0.0)
    return Images(p_top, correct, p_other, n_other, float(fixed["sigma"][0]),
                  np.asarray(fixed["idx"]))


def select(images: Images, i: int, n0: int, rng) -> tuple[int, int, float, bool]:
    """CERTIFY's selection from n0 draws: (hits of ĉ, n0, P(hit) of ĉ, ĉ is the label)."""
    probs = [images.p_top[i]] + [images.p_other[i]] * int(images.n_other[i])
    counts = rng.multinomial(n0, np.asarray(probs) / np.sum(probs))
    c = int(np.argmax(counts))
    return int(counts[c]), n0, float(probs[c]), bool(c == 0 and images.correct[i])


# --------------------------------------------------------------------------- the simulation
def memoized_bounds():
    """The library's Clopper–Pearson bound, memoized for the simulation: the same pure function,
    computed once per (k, t, level) instead of once per call (the procedure asks for the same
    bounds over and over when most draws hit)."""
    exact = clopper_pearson_lower

    @functools.lru_cache(maxsize=1_000_000)
    def scalar(k, n, alpha):
        return exact(k, n, alpha)

    def bound(k, n, alpha):
        k, n = np.asarray(k), np.asarray(n)
        if k.ndim == 0 and n.ndim == 0:
            return scalar(float(k), float(n), float(alpha))
        return exact(k, n, alpha)

    tests_module.clopper_pearson_lower = bound


def simulate_sequential(test, images: Images, radii, alpha, n0, n_max, reps, seed):
    """(mean passes per image, expected certified accuracy per grid radius), over reps."""
    thr = thresholds(radii, images.sigma)
    rng = np.random.default_rng(seed)
    passes, hits_at = 0.0, np.zeros(len(thr))
    for _ in range(reps):
        for i in range(len(images.p_top)):
            hits, n0_, p, right = select(images, i, n0, rng)
            out = run_levels(test, thr, alpha, n_max, functools.partial(_draw, rng, p),
                             (hits, n0_))
            passes += n0 + out.draws
            if right and out.level >= 0:
                hits_at[: out.level + 1] += 1
    total = reps * len(images.p_top)
    return passes / total, hits_at / total


def _draw(rng, p: float, m: int) -> int:
    """The fake sampler: hits of ĉ among m draws whose hit probability is p."""
    return int(rng.binomial(m, p))


def simulate_fixed(images: Images, radii, alpha, n0, n, reps, seed):
    """Expected certified accuracy per grid radius of fixed-n CERTIFY, same p's."""
    thr = thresholds(radii, images.sigma)
    rng = np.random.default_rng(seed)
    hits_at = np.zeros(len(thr))
    for _ in range(reps):
        for i in range(len(images.p_top)):
            _, _, p, right = select(images, i, n0, rng)
            lower = clopper_pearson_lower(int(rng.binomial(n, p)), n, alpha)
            level = int(np.searchsorted(thr, lower, side="left")) - 1
            if right and level >= 0:
                hits_at[: level + 1] += 1
    return hits_at / (reps * len(images.p_top))


# targeted variants (target share w, final share f at n_max, futility optimism c) of the frontier
VARIANTS = ("0.6,0,2", "0.6,0,3", "0.6,0.2,1", "0.6,0.2,1.25", "0.4,0.3,2", "final:0.2,1",
            "final:0.3,1.25", "final:0.2,1.5")


def candidates(names, variants) -> dict:
    """Every registered test (or those in ``names``) with its defaults, and targeted variants."""
    tests = {name: SEQUENTIAL_TESTS[name]() for name in SEQUENTIAL_TESTS
             if not names or name in names}
    for text in variants:
        if text.startswith("final:"):  # targeted-final: f, c near the reach, final_reach
            f, c, near = ([float(v) for v in text[6:].split(",")] + [0.7])[:3]
            tests[f"targeted-final f={f:g} c_near={c:g} reach={near:g}"] = TargetedFinal(
                final_share=f, near_optimism=c, final_reach=near)
            continue
        w, f, c, ratio = ([float(v) for v in text.split(",")] + [1.5])[:4]
        tests[f"targeted w={w:g} f={f:g} c={c:g}" + f" ratio={ratio:g}" * (ratio != 1.5)] = (
            Targeted(target_share=w, final_share=f, optimism=c, ratio=ratio))
    return tests


def frontier(args) -> list:
    memoized_bounds()
    fixed_path = Path(args.records) / "fixed_n.tsv"
    images = load_images(fixed_path, sorted(Path(args.records).glob("sequential_*.tsv")))
    rows = []
    for grid in args.grids:
        radii = np.array(sorted({0.0, *(float(r) for r in grid.split(","))}))
        acc_fixed = simulate_fixed(images, radii, args.alpha, args.n0, args.n, args.reps,
                                   args.seed)
        for name, test in candidates(args.tests, args.variants).items():
            start = time.perf_counter()
            passes, acc = simulate_sequential(test, images, radii, args.alpha, args.n0,
                                              args.n, args.reps, args.seed)
            loss = 100 * float(np.max(acc_fixed - acc))
            rows.append((grid, name, passes, (args.n0 + args.n) / passes, loss, acc_fixed, acc))
            print(f"| {grid} | {name} | {passes:,.0f} | {(args.n0 + args.n) / passes:.1f} | "
                  f"{loss:.2f} | {time.perf_counter() - start:.0f} s |", flush=True)
    return rows


def validate(args) -> None:
    """Simulated against real: per real sequential record file beside fixed_n.tsv, the mean
    passes and the certified accuracy per radius, simulated (reps) and measured (one draw)."""
    memoized_bounds()
    images = load_images(Path(args.records) / "fixed_n.tsv",
                         sorted(Path(args.records).glob("sequential_*.tsv")))
    print("| record file | passes real | passes simulated (±2 SE) | accuracy real | simulated |")
    print("| --- | ---: | ---: | --- | --- |")
    for path in sorted(Path(args.records).glob("sequential_*.tsv")):
        records = read_records(path)
        name, grid = path.stem.split("_")[1], path.stem.split("_", 2)[2].replace("_", ",")
        if name not in SEQUENTIAL_TESTS:
            continue
        radii = np.array(sorted({0.0, *(float(r) for r in grid.split(","))}))
        real = np.asarray(records["n0"], float) + np.asarray(records["n"], float)
        sims = [simulate_sequential(SEQUENTIAL_TESTS[name](), images, radii, args.alpha,
                                    args.n0, args.n, 1, args.seed + r) for r in range(args.reps)]
        passes = np.array([s[0] for s in sims])
        acc = np.mean([s[1] for s in sims], axis=0)
        acc_real = [np.mean((np.asarray(records["radius"]) >= r - 1e-12)
                            & (np.asarray(records["correct"]) == 1)) for r in radii]
        spread = 2 * passes.std(ddof=1) if len(passes) > 1 else 0.0
        print(f"| {path.name} | {real.mean():,.0f} | {passes.mean():,.0f} "
              f"(± {spread / math.sqrt(len(passes)):,.0f}; one draw's spread ± {spread:,.0f}) | "
              + ", ".join(f"{100 * a:.1f}" for a in acc_real) + " | "
              + ", ".join(f"{100 * a:.1f}" for a in acc) + " |", flush=True)


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grids = sorted({r[0] for r in rows}, key=len, reverse=True)
    fig, axes = plt.subplots(1, len(grids), figsize=(6 * len(grids), 4.5))
    for ax, grid in zip(np.atleast_1d(axes), grids):
        for _, name, _, ratio, loss, *_ in (r for r in rows if r[0] == grid):
            default = name == DEFAULT_TEST  # the certifier's default: a star
            ax.scatter(loss, ratio, s=90 if default else 18, marker="*" if default else "o")
            ax.annotate(name, (loss, ratio), fontsize=6)
        ax.axvline(0.5, color="grey", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set(title=f"grid {grid}", xlabel="worst expected certified-accuracy loss (points)",
               ylabel="× fewer forward passes than fixed-n")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    print(f"wrote {path}")


def real(args) -> None:
    """The real measurement through benchmarks/sequential.py (records resumed in --out-dir)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import sequential

    argv = ["--checkpoint", args.checkpoint, "--out-dir", args.out_dir, "--skip", str(args.skip),
            "--max", str(args.max), "--n0", str(args.n0), "--n", str(args.n),
            "--alpha", str(args.alpha), "--batch", str(args.batch), "--seed", str(args.seed),
            "--timing-images", str(args.timing_images), "--grids", *args.grids,
            "--tests", *(args.tests or sorted(SEQUENTIAL_TESTS))]
    if args.data_root:
        argv += ["--data-root", args.data_root]
    argv += ["--device", args.device]
    sys.argv = ["sequential.py", *argv]
    sequential.main()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--simulate", action="store_true", help="(default) the simulated frontier")
    mode.add_argument("--validate", action="store_true", help="simulation vs real records")
    mode.add_argument("--real", action="store_true", help="the real measurement")
    p.add_argument("--records", default=str(RECORDS), help="folder with fixed_n.tsv (simulate)")
    p.add_argument("--grids", nargs="+", default=list(GRIDS))
    p.add_argument("--tests", nargs="*", default=[], help="registered tests (default: all)")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS),
                   help="targeted variants 'w,f,c[,ratio]' (target share, final share, optimism, "
                        "growth of the fallback looks) or targeted-final ones "
                        "'final:f,c_near[,final_reach]'")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--png", default="sequential_frontier.png")
    p.add_argument("--checkpoint")
    p.add_argument("--out-dir", default="runs/sequential")
    p.add_argument("--skip", type=int, default=20)
    p.add_argument("--max", type=int, default=500)
    p.add_argument("--n0", type=int, default=100)
    p.add_argument("--n", type=int, default=100_000, help="fixed n, and the sequential n_max")
    p.add_argument("--alpha", type=float, default=0.001)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timing-images", type=int, default=0)
    p.add_argument("--data-root")
    p.add_argument("--device", default="cpu", help="--real: where the draws run")
    args = p.parse_args()
    if args.real:
        if not args.checkpoint:
            p.error("--real needs --checkpoint")
        real(args)
    elif args.validate:
        print_environment(torch.device("cpu"))
        validate(args)
    else:
        print_environment(torch.device("cpu"))
        print(f"simulated: {args.reps} repetitions of every image in {args.records}/fixed_n.tsv,"
              f" n0 = {args.n0}, n_max = n = {args.n}, α = {args.alpha}")
        print("| grid | test | passes / image | × fewer | worst loss (points) | time |")
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        plot(frontier(args), Path(args.png))


if __name__ == "__main__":
    main()
