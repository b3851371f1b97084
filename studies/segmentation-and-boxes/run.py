"""Driver of the segmentation-and-boxes study: certified segmentation (Fischer, Baader & Vechev
2021) on fashion-mnist-seg, Holm against Bonferroni at the same α and the same draws, and
median smoothing (Chiang et al. 2020) of a box regressor on fashion-mnist-box.

    python studies/segmentation-and-boxes/run.py [--device D] [--data-root DIR] [--quick]
                                                 [--out DIR] [--only NAME ...]

The models are trained from configs/ into runs/segmentation-and-boxes/NAME (out of git) while a
record file that needs them is missing or partial. Each run of RUNS is certified into
records/NAME.tsv (a segmentation run's certified maps beside it, records/NAME.tsv.map/); the
tables (``smoothcert report --into README.md``) and the verdicts go into README.md's generated
blocks. Holm's and Bonferroni's files of one (σ, τ) are certified from the same seed, so their
per-pixel votes are the same draws and the comparison is paired image by image.

Guarantees: resumable (training resumes from its checkpoint, certification row by row; a
complete record file is not touched again); committed records are never rewritten; ``--quick``
(1 epoch on 300 examples, 3 images, small n) writes only under
runs/studies-quick/segmentation-and-boxes (or ``--out``), with a copy of README.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # studies/driver.py
from driver import (  # noqa: E402
    RESAMPLES,
    SEED,
    SMOOTHCERT,
    call,
    complete,
    data_flags,
    report_blocks,
    splice_block,
    start,
)

SEG_IMAGES, BOX_IMAGES, EVERY = 100, 250, 40  # every 40th test image
SIGMAS = {"025": "0.25", "050": "0.5"}
TAUS = {"075": "0.75", "095": "0.95"}
CORRECTIONS = ("holm", "bonferroni")
# Fischer et al.'s n0 = 100 selection draws; n = 300 estimation draws of their n ∈ {100, 300,
# 1000} (a CPU's budget: 784 pixels per draw); their α = 0.001
SEG_DRAWS = ["--n0", "100", "--n", "300", "--alpha", "0.001", "--batch", "400"]
# Chiang et al.'s n = 2,000 draws; α = 0.001 for all four coordinates and the ε grid together
# (the median certifier's Bonferroni default; theirs is per bound)
BOX_DRAWS = ["--n", "2000", "--alpha", "0.001", "--batch", "2000"]
EPS = "0.1,0.25,0.36,0.5"

RUNS = {  # record file: (model config, certify flags)
    **{f"seg_s{s}_t{t}_{c}": (f"seg_gaussian_s{s}", [
        "--certifier", "segment", "--sigma", v, "--opt", f"tau={tau}", "--opt",
        f"correction={c}", *SEG_DRAWS]) for s, v in SIGMAS.items() for t, tau in TAUS.items()
       for c in CORRECTIONS},
    **{f"median_s{s}": (f"box_gaussian_s{s}", [
        "--certifier", "median", "--sigma", v, "--opt", f"eps={EPS}", *BOX_DRAWS])
       for s, v in SIGMAS.items()},
}
BLOCKS = {  # README block: (record files, report flags)
    "segment": ([n for n in RUNS if n.startswith("seg_")], []),
    "median": ([n for n in RUNS if n.startswith("median_")], []),
}
CLEAN = {"box_standard": None, **{f"box_gaussian_s{s}": f"median_s{s}" for s in SIGMAS}}


def main(argv=None) -> int:
    args, out, work, doc = start(argv, __doc__, HERE, "segmentation-and-boxes", RUNS)
    for name in args.only or RUNS:
        certify(name, out, work, args)
    report_blocks(out, doc, BLOCKS)
    write_holm_verdicts(out, doc)
    write_clean_errors(out, doc, work, args)
    return 0


def device_flags(args) -> list[str]:
    return ["--device", args.device, "--no-progress", *data_flags(args)]


def checkpoint(name: str, work: Path, args) -> str:
    """The checkpoint of configs/NAME.yaml, trained into ``work`` first (resumed)."""
    quick = ["--epochs", "1", "--train-size", "300"] if args.quick else []
    call([*SMOOTHCERT, "train", "--config", str(HERE / "configs" / f"{name}.yaml"),
          "--out", str(work / name), "--resume", *quick, *device_flags(args)], capture=True)
    return str(work / name / "checkpoint.pt")


def images(name: str, args) -> int:
    return 3 if args.quick else SEG_IMAGES if name.startswith("seg_") else BOX_IMAGES


def certify(name: str, out: Path, work: Path, args) -> None:
    """Certify NAME's examples into its record file (training its model first)."""
    model, flags = RUNS[name]
    record = out / "records" / f"{name}.tsv"
    if args.quick:
        flags = [*flags, "--n0", "10", "--n", "100"]
    if complete(record, images(name, args)):
        return
    call([*SMOOTHCERT, "certify", checkpoint(model, work, args), *flags, "--skip", str(EVERY),
          "--max", str(images(name, args)), "--out", str(record), *device_flags(args)],
         capture=True)


def paired_interval(first: np.ndarray, second: np.ndarray) -> tuple[float, float, float]:
    """(estimate, low, high) of mean(second) − mean(first) over paired images: the library's
    95% percentile bootstrap (RESAMPLES resamples, seed SEED)."""
    from smoothcert.evaluation.intervals import paired_bootstrap

    i = paired_bootstrap(first, second, resamples=RESAMPLES, seed=SEED)
    return i.estimate, i.low, i.high


def _cell(estimate: float, low: float, high: float, scale: float = 100.0) -> str:
    word = "tie" if low <= 0 <= high else ("Holm more" if low > 0 else "Bonferroni more")
    return (f"{scale * estimate:+.2f} [{scale * low:+.2f}, {scale * high:+.2f}] {word}")


def write_holm_verdicts(out: Path, doc: Path) -> None:
    """Per (σ, τ): Holm − Bonferroni in certified pixel accuracy and in certified pixels (both
    in points of the image's pixels), paired over the images both files hold, and how many
    images Holm certifies more pixels of (it never certifies fewer: it rejects a superset)."""
    from smoothcert.runs.records import read_records

    lines = []
    for s, t in ((s, t) for s in SIGMAS for t in TAUS):
        files = [out / "records" / f"seg_s{s}_t{t}_{c}.tsv" for c in CORRECTIONS]
        if not all(f.is_file() for f in files):
            continue
        holm, bonf = (read_records(f) for f in files)
        both = np.intersect1d(holm["idx"], bonf["idx"])
        h, b = ({int(i): k for k, i in enumerate(r["idx"])} for r in (holm, bonf))
        rows = [(h[int(i)], b[int(i)]) for i in both]
        pixels = (holm["certified"] + holm["abstained"])[[a for a, _ in rows]].astype(float)
        a, c = (np.array(side) for side in zip(*rows))
        acc = paired_interval(bonf["pixel_accuracy"][c], holm["pixel_accuracy"][a])
        cert = paired_interval(bonf["certified"][c] / pixels, holm["certified"][a] / pixels)
        more = int(np.sum(holm["certified"][a] > bonf["certified"][c]))
        lines.append(f"| {SIGMAS[s]} | {TAUS[t]} | {len(rows)} | {_cell(*acc)} | {_cell(*cert)} "
                     f"| {more} of {len(rows)} |\n")
    head = ("| σ | τ | images | Holm − Bonferroni: certified pixel accuracy (points) | "
            "certified pixels (points of all pixels) | images where Holm certifies more |\n"
            "| ---: | ---: | ---: | --- | --- | ---: |\n")
    if lines:
        splice_block(doc, "verdict_holm", head + "".join(lines))


def write_clean_errors(out: Path, doc: Path, work: Path, args) -> None:
    """The clean error of each box model f on the median files' images, mean |f(x) − target|
    over the images and the 4 coordinates, beside the smoothed median's (from its records),
    and the paired interval of g − the unsmoothed regressor (``box_standard``) over images."""
    import torch

    from smoothcert.certifiers.columns import parse_vector
    from smoothcert.data.datasets import load_dataset
    from smoothcert.models.checkpoint import model_from_checkpoint
    from smoothcert.runs.records import read_records

    first = out / "records" / f"median_s{next(iter(SIGMAS))}.tsv"
    if not first.is_file():
        return
    idx = read_records(first)["idx"].astype(np.int64)
    data = load_dataset("fashion-mnist-box", "test", args.data_root)
    x, y = data.batch(torch.as_tensor(idx))
    errors, lines = {}, []
    for model, median in CLEAN.items():
        net, _ = model_from_checkpoint(checkpoint(model, work, args))
        with torch.no_grad():
            errors[model] = (net(x) - y).abs().mean(dim=1).double().numpy()  # per image
        smoothed, versus = "–", "–"
        if median is not None and (out / "records" / f"{median}.tsv").is_file():
            r = read_records(out / "records" / f"{median}.tsv")
            m = np.stack([parse_vector(c) for c in r["median"]])
            t = np.stack([parse_vector(c) for c in r["target"]])
            g = np.abs(m - t).mean(axis=1)
            smoothed = f"{g.mean():.3f}"
            e, lo, hi = paired_interval(errors["box_standard"], g)
            word = "tie" if lo <= 0 <= hi else "g larger" if lo > 0 else "g smaller"
            versus = f"{e:+.3f} [{lo:+.3f}, {hi:+.3f}] {word}"
        lines.append(f"| {model} | {len(idx)} | {errors[model].mean():.3f} | {smoothed} | "
                     f"{versus} |\n")
    head = ("| model | images | base regressor f, clean: mean abs. error (pixels) | "
            "median-smoothed g: mean abs. error (pixels) | g − unsmoothed f (box_standard), "
            "paired |\n| --- | ---: | ---: | ---: | --- |\n")
    splice_block(doc, "clean_error", head + "".join(lines))


if __name__ == "__main__":
    sys.exit(main())
