"""Driver of the threat-models study: certificates beyond ℓ2 on Fashion-MNIST — ℓ1 and ℓ∞ from
Yang et al.'s noise families at matched σ, patches from Levine & Feizi's column and block
smoothing, and ℓ0 from their randomized ablation.

    python studies/threat-models/run.py [--device D] [--data-root DIR] [--quick] [--out DIR]
                                        [--only NAME ...]

Each run of RUNS is trained from its recipe in configs/ into runs/threat-models/NAME (out of
git) while its record file is missing or partial, then certified into records/NAME.tsv; the
tables (``smoothcert report --into README.md``) and the verdicts (paired bootstrap intervals on
the images every file holds) go into README.md's generated blocks.

Guarantees: resumable (training resumes from its checkpoint, certification row by row; a
complete record file is not touched again); committed records are never rewritten; ``--quick``
(1 epoch on 300 examples, 3 images, n = 300) writes only under runs/studies-quick/threat-models
(or ``--out``), with a copy of README.md for the tables.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/driver.py
from driver import (  # noqa: E402
    ACCURACY_EFFECT,
    RESAMPLES,
    SEED,
    SMOOTHCERT,
    Comparison,
    call,
    complete,
    data_flags,
    judge,
    report_blocks,
    splice_block,
    start,
    summary,
    write_verdicts,
)

NOISE_CERTIFY = ["--n0", "100", "--n", "10000", "--alpha", "0.001", "--batch", "2000"]
# Levine & Feizi's own budgets: θ = 0.2 (patchSmoothing certify_mnist_*.py); ℓ0: 1,000
# selection and 10,000 estimation draws at α = 0.05 (randomizedAblation mnist_certify.py)
PATCH = ["--certifier", "ablation", "--opt", "threshold=0.2", "--batch", "2000"]
PIXELS = ["--certifier", "ablation", "--opt", "mode=pixels", "--opt", "keep=45",
          "--n0", "1000", "--n", "10000", "--alpha", "0.05", "--batch", "2000"]
NOISES = ["gaussian", "laplace", "uniform", "pareto", "exp-inf"]
RUNS = {  # record file name: (recipe in configs/, certify flags, test images, every k-th)
    **{f"{noise}_s050": (f"{noise}_s050", ["--noise", noise, "--sigma", "0.5", *NOISE_CERTIFY],
                         200, 20) for noise in NOISES},
    # the ℓ1 claim's σ sweep: a second σ for the three noises it compares
    **{f"{noise}_s100": (f"{noise}_s100", ["--noise", noise, "--sigma", "1.0", *NOISE_CERTIFY],
                         200, 20) for noise in ("gaussian", "laplace", "uniform")},
    "column_b2": ("ablation_column2", [*PATCH, "--opt", "mode=column", "--opt", "size=2"],
                  500, 20),
    "block_b10": ("ablation_block10", [*PATCH, "--opt", "mode=block", "--opt", "size=10"],
                  500, 20),
    "pixels_k45": ("ablation_pixels45", PIXELS, 100, 100),
}
BLOCKS = {  # README block: (record files, report flags)
    "l1": ([f"{n}_s050" for n in NOISES], ["--norm", "l1", "--radii", "0:2.5:0.25"]),
    "l1_sigmas": ([f"{n}_s{s}" for n in ("gaussian", "laplace", "uniform") for s in ("050", "100")],
                  ["--norm", "l1", "--radii", "0:4:0.5"]),
    "linf": ([f"{n}_s050" for n in NOISES], ["--norm", "linf", "--radii", "0:0.055:0.005"]),
    "l2": ([f"{n}_s050" for n in NOISES], ["--norm", "l2", "--radii", "0:1.5:0.25"]),
    "patches": (["column_b2", "block_b10"], ["--radii", "0:5:1"]),
    "l0": (["pixels_k45"], ["--radii", "0,1,2,4,6,8,10,12,15,20"]),
}
# verdicts: second − first, each claimed greater (the claims of README.md's Verdicts), with the
# driver's default margins: δ = 2 points of certified accuracy, ACR δ = 5% of the first's ACR
LINF = (0.005, 0.01, 0.02)
VERDICTS = [
    *[Comparison("verdict_l1", f"{n}_s050", "uniform_s050", (0.5, 1.0, 1.5), "l1")
      for n in ("laplace", "gaussian")],
    *[Comparison("verdict_linf", f"{n}_s050", "gaussian_s050", LINF, "linf")
      for n in ("uniform", "laplace", "exp-inf")],
    Comparison("verdict_patches", "block_b10", "column_b2", (1, 2, 3, 4, 5)),
]
PATCH_PAPER = 5  # Levine & Feizi's MNIST operating point: 5×5 patches


# Yang et al.'s comparison: each noise at its best σ for each ℓ1 radius (the σ whose file
# certifies the most there), second − first, paired on the images
BEST_SIGMA = [("verdict_l1_best_sigma", "laplace", "uniform", [0.5, 1.0, 1.5, 2.0]),
              ("verdict_l1_best_sigma", "gaussian", "uniform", [0.5, 1.0, 1.5, 2.0])]
SIGMAS = ("050", "100")


def main(argv=None) -> int:
    args, out, work, doc = start(argv, __doc__, HERE, "threat-models", RUNS)
    for name in args.only or RUNS:
        train_and_certify(name, out, work, args)
    report_blocks(out, doc, BLOCKS)
    found = write_verdicts(out, doc, VERDICTS)
    best = write_best_sigma_verdicts(out, doc)
    write_claims(doc, found, best)
    return 0


def train_and_certify(name: str, out: Path, work: Path, args) -> None:
    """Train NAME's recipe while its record file is incomplete, then certify the rest of it."""
    recipe, flags, images, every = RUNS[name]
    record = out / "records" / f"{name}.tsv"
    quick = ["--epochs", "1", "--train-size", "300"] if args.quick else []
    if args.quick:
        images, flags = 3, [*flags, "--n0", "20", "--n", "300"]
    if complete(record, images):
        return
    device = ["--device", args.device, "--no-progress", *data_flags(args)]
    run = work / recipe
    call([*SMOOTHCERT, "train", "--config", str(HERE / "configs" / f"{recipe}.yaml"),
          "--out", str(run), "--resume", *quick, *device], capture=True)
    call([*SMOOTHCERT, "certify", str(run / "checkpoint.pt"), *flags, "--skip", str(every),
          "--max", str(images), "--out", str(record), *device], capture=True)
    log = out / "records" / f"{name}.train_log.tsv"
    if not log.exists():
        log.write_bytes((run / "log.tsv").read_bytes())


def write_best_sigma_verdicts(out: Path, doc: Path) -> dict:
    """BEST_SIGMA's rows: at each radius, each noise's file of SIGMAS that certifies the most
    ℓ1 accuracy there, and the paired interval of the difference (second − first) with its
    verdict (claimed greater, δ ACCURACY_EFFECT). Returns {first noise: {"r=R": Verdict}}."""
    from smoothcert.evaluation.intervals import certified_accuracy_difference
    from smoothcert.evaluation.metrics import certified_accuracy
    from smoothcert.evaluation.norms import in_norm
    from smoothcert.runs.records import read_records

    def best(noise: str, radius: float):
        files = [out / "records" / f"{noise}_s{s}.tsv" for s in SIGMAS]
        if not all(f.is_file() for f in files):
            return None
        records = [(f.stem, in_norm(read_records(f), "l1")) for f in files]
        return max(records, key=lambda pair: float(certified_accuracy(pair[1], [radius])[0]))

    rows: dict[str, list[str]] = {}
    found: dict[str, dict] = {}
    for block, first, second, radii in BEST_SIGMA:
        for r in radii:
            a, b = best(first, r), best(second, r)
            if a is None or b is None:
                continue
            i = certified_accuracy_difference(a[1], b[1], r, resamples=RESAMPLES, seed=SEED)
            v = found.setdefault(first, {})[f"r={r:g}"] = judge(i, ACCURACY_EFFECT)
            rows.setdefault(block, []).append(
                f"| {r:g} | {b[0]} − {a[0]} | {i.count} | {v.cell()} |\n")
    for block, lines in rows.items():
        head = ("| ℓ1 radius | second − first (each at its best σ there) | images | "
                f"certified accuracy (claimed >, δ {ACCURACY_EFFECT:.2g}) |\n"
                "| ---: | --- | ---: | --- |\n")
        splice_block(doc, block, head + "".join(lines))
    return found


def write_claims(doc: Path, found: dict, best: dict) -> None:
    """README.md's ``claims`` block: each question's verdicts, as :func:`driver.summary`
    groups the intervals of its comparisons (those whose files exist)."""
    lines = []
    if best:
        vs = "; ".join(f"against {n}: {summary(v)}" for n, v in best.items())
        lines.append("- **(a) ℓ1: uniform noise certifies the most, each noise at its better σ "
                     f"of 0.5 and 1.0 (Yang et al.)** — {vs}\n")
    linf = {n: found[f"{n}_s050", "gaussian_s050"] for n in ("uniform", "laplace", "exp-inf")
            if (f"{n}_s050", "gaussian_s050") in found}
    if linf:
        vs = "; ".join(f"against {n}: {summary(v)}" for n, v in linf.items())
        lines.append(f"- **(b) ℓ∞: Gaussian noise certifies the most** — {vs}\n")
    patches = found.get(("block_b10", "column_b2"))
    if patches:
        paper = patches[f"r={PATCH_PAPER}"]
        lines.append("- **(c) Patches: column smoothing (b = 2) certifies more than block "
                     f"smoothing (b = 10) (Levine & Feizi)** — {summary(patches)}; at the "
                     f"paper's operating point, {PATCH_PAPER}×{PATCH_PAPER} patches, "
                     f"{paper.cell()}\n")
    if lines:
        splice_block(doc, "claims", "".join(lines))


if __name__ == "__main__":
    sys.exit(main())
