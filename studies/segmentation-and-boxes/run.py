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
per-pixel votes are the same draws and the comparison is paired image by image. The same runs at
the authors' α defaults (AUTHORS_RUNS) are certified only when named with ``--only``; the
``alpha_*`` blocks put them, or what the records allow without them, beside ours.

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
    ACCURACY_EFFECT,
    RESAMPLES,
    SEED,
    SMOOTHCERT,
    call,
    complete,
    data_flags,
    judge,
    report_blocks,
    side,
    splice_block,
    start,
)

SEG_IMAGES, BOX_IMAGES, EVERY = 100, 250, 40  # every 40th test image
SIGMAS = {"025": "0.25", "050": "0.5"}
TAUS = {"075": "0.75", "095": "0.95"}
CORRECTIONS = ("holm", "bonferroni")
# Fischer et al.'s n0 = 100 selection draws; n = 300 estimation draws of their n ∈ {100, 300,
# 1000} (a CPU's budget: 784 pixels per draw); α = 0.001 is ours (their code's default is 1e-4:
# AUTHORS_ALPHA)
SEG_DRAWS = ["--n0", "100", "--n", "300", "--alpha", "0.001", "--batch", "400"]
# Chiang et al.'s n = 2,000 draws; α = 0.001 for all four coordinates and the ε grid together
# (the median certifier's Bonferroni default: 0.001 / 32 = 3.1e-5 per bound; theirs is 1e-5
# for each bound alone: AUTHORS_ALPHA)
BOX_DRAWS = ["--n", "2000", "--alpha", "0.001", "--batch", "2000"]
EPS = "0.1,0.25,0.36,0.5"
# The authors' α defaults, for the labelled rows beside ours: Fischer et al.'s code
# (eth-sri/segmentation-smoothing, code/multiclassify_utils.py: --alpha 0.0001, family-wise per
# image) and Chiang et al.'s (Ping-C/CertifiedObjectDetection, test_smooth.py: --cert_conf
# 0.99999, α = 1e-5 for each one-sided bound alone: the median certifier's correction "none")
AUTHORS_ALPHA = {"segment": 1e-4, "median": 1e-5}

RUNS = {  # record file: (model config, certify flags)
    **{f"seg_s{s}_t{t}_{c}": (f"seg_gaussian_s{s}", [
        "--certifier", "segment", "--sigma", v, "--opt", f"tau={tau}", "--opt",
        f"correction={c}", *SEG_DRAWS]) for s, v in SIGMAS.items() for t, tau in TAUS.items()
       for c in CORRECTIONS},
    **{f"median_s{s}": (f"box_gaussian_s{s}", [
        "--certifier", "median", "--sigma", v, "--opt", f"eps={EPS}", *BOX_DRAWS])
       for s, v in SIGMAS.items()},
}
# The runs at the authors' α whose records cannot be re-scored from ours (the records keep
# certified counts and bounds, not per-pixel votes or the 2,000 draws), run only when named with
# --only; each the same seed, hence the same draws, as our file it stands beside. At τ = 0.95 no
# run is needed: n = 300 votes of 300 cannot pass Fischer et al.'s α (write_authors_alpha).
AUTHORS_RUNS = {
    **{f"seg_s{s}_t075_{c}_a1e-4": (f"seg_gaussian_s{s}", [
        *RUNS[f"seg_s{s}_t075_{c}"][1], "--alpha", "0.0001"])  # the last --alpha counts
       for s in SIGMAS for c in CORRECTIONS},
    **{f"median_s{s}_a1e-5": (f"box_gaussian_s{s}", [
        *RUNS[f"median_s{s}"][1], "--opt", "correction=none", "--alpha", "0.00001"])
       for s in SIGMAS},
}
BLOCKS = {  # README block: (record files, report flags)
    "segment": ([n for n in RUNS if n.startswith("seg_")], []),
    "median": ([n for n in RUNS if n.startswith("median_")], []),
}
CLEAN = {"box_standard": None, **{f"box_gaussian_s{s}": f"median_s{s}" for s in SIGMAS}}


def main(argv=None) -> int:
    args, out, work, doc = start(argv, __doc__, HERE, "segmentation-and-boxes",
                                 {**RUNS, **AUTHORS_RUNS})
    for name in args.only or RUNS:
        certify(name, out, work, args)
    report_blocks(out, doc, BLOCKS)
    write_holm_verdicts(out, doc)
    write_clean_errors(out, doc, work, args)
    write_authors_alpha(out, doc)
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
    model, flags = {**RUNS, **AUTHORS_RUNS}[name]
    record = out / "records" / f"{name}.tsv"
    if args.quick:
        flags = [*flags, "--n0", "10", "--n", "100"]
    if complete(record, images(name, args)):
        return
    call([*SMOOTHCERT, "certify", checkpoint(model, work, args), *flags, "--skip", str(EVERY),
          "--max", str(images(name, args)), "--out", str(record), *device_flags(args)],
         capture=True)


def paired_interval(first: np.ndarray, second: np.ndarray):
    """The interval of mean(second) − mean(first) over paired images: the library's 95%
    percentile bootstrap (RESAMPLES resamples, seed SEED)."""
    from smoothcert.evaluation.intervals import paired_bootstrap

    return paired_bootstrap(first, second, resamples=RESAMPLES, seed=SEED)


def _cell(interval) -> str:
    """Holm − Bonferroni in points with the verdict on Fischer et al.'s claim (Holm certifies
    more; δ ACCURACY_EFFECT, 2 points)."""
    return judge(interval, ACCURACY_EFFECT).cell(100, 2)


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
        lines.append(f"| {SIGMAS[s]} | {TAUS[t]} | {len(rows)} | {_cell(acc)} | {_cell(cert)} "
                     f"| {more} of {len(rows)} |\n")
    head = ("| σ | τ | images | Holm − Bonferroni: certified pixel accuracy (points; claimed >, "
            f"δ {100 * ACCURACY_EFFECT:g}) | certified pixels (points of all pixels; claimed >, "
            f"δ {100 * ACCURACY_EFFECT:g}) | images where Holm certifies more |\n"
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
            i = paired_interval(errors["box_standard"], g)  # a description, no claim's
            versus = (f"{i.estimate:+.3f} [{i.low:+.3f}, {i.high:+.3f}] "
                      f"{side(i, 'g larger', 'g smaller')}")
        lines.append(f"| {model} | {len(idx)} | {errors[model].mean():.3f} | {smoothed} | "
                     f"{versus} |\n")
    head = ("| model | images | base regressor f, clean: mean abs. error (pixels) | "
            "median-smoothed g: mean abs. error (pixels) | g − unsmoothed f (box_standard), "
            "paired |\n| --- | ---: | ---: | ---: | --- |\n")
    splice_block(doc, "clean_error", head + "".join(lines))


def write_authors_alpha(out: Path, doc: Path) -> None:
    """README.md's ``alpha_segment`` and ``alpha_median`` blocks: each of our files beside the
    same run at its authors' α default (AUTHORS_ALPHA), labelled."""
    for block, lines, head in (("alpha_segment", *segment_alpha_rows(out)),
                               ("alpha_median", *median_alpha_rows(out))):
        if lines:
            splice_block(doc, block, head + "".join(lines))


def votes_needed(votes: np.ndarray, m: int, alpha: float, correction: str) -> str:
    """The fewest votes of n that certify a pixel among m at family-wise level α (``votes[k]``
    the p-value of k votes): Bonferroni's α/m, which is also Holm's first step, and for Holm
    "first … last", its last step's α."""
    first, last = (np.flatnonzero(votes <= level) for level in (alpha / m, alpha))
    cell = f"{first[0]}" if len(first) else "none"
    return cell if correction == "bonferroni" or not len(last) else f"{cell} … {last[0]}"


def segment_alpha_rows(out: Path) -> tuple[list[str], str]:
    """Per (σ, τ, correction) of our files, our row and the one at Fischer et al.'s α: from its
    own file where run (AUTHORS_RUNS); exactly none certified where n votes of n cannot pass
    the smallest threshold (α/m: Bonferroni's, and Holm's first step); else not run, with the
    command, and ours as a bound (a smaller α certifies a subset of the same draws' pixels)."""
    from smoothcert.evaluation.dense import summarize_segment
    from smoothcert.runs.records import read_records
    from smoothcert.stats.segmentation import holm_reject, pixel_pvalues

    lines, alpha = [], AUTHORS_ALPHA["segment"]
    for s, t, c in ((s, t, c) for s in SIGMAS for t in TAUS for c in CORRECTIONS):
        name, theirs = f"seg_s{s}_t{t}_{c}", f"seg_s{s}_t{t}_{c}_a1e-4"
        if not (out / "records" / f"{name}.tsv").is_file():
            continue
        r = read_records(out / "records" / f"{name}.tsv")
        n, m = int(r["n"][0]), int(r["certified"][0] + r["abstained"][0])
        votes = pixel_pvalues(np.arange(n + 1), n, float(TAUS[t]))  # p-value of k votes of n
        ours, row = summarize_segment(r), f"| {SIGMAS[s]} | {TAUS[t]} | {c} | "
        lines.append(row + f"{r['alpha'][0]:g} (ours) | records/{name}.tsv | "
                     f"{votes_needed(votes, m, float(r['alpha'][0]), c)} | "
                     f"{ours.pixel_accuracy:.1%} | {ours.abstain_rate:.1%} | {ours.miou:.1%} |\n")
        if (out / "records" / f"{theirs}.tsv").is_file():
            a = summarize_segment(read_records(out / "records" / f"{theirs}.tsv"))
            cells = (f"records/{theirs}.tsv", f"{a.pixel_accuracy:.1%}", f"{a.abstain_rate:.1%}",
                     f"{a.miou:.1%}")
        elif not holm_reject(np.full(m, votes[n]), alpha).any():
            cells = (f"exact: {n} of {n} votes give p = τⁿ = {votes[n]:.2g} > α/{m}", "0.0%",
                     "100.0%", "0.0%")
        else:
            cells = (f"not run: `python studies/segmentation-and-boxes/run.py --only {theirs}`",
                     f"≤ {ours.pixel_accuracy:.1%}", f"≥ {ours.abstain_rate:.1%}", "–")
        lines.append(row + f"{alpha:g} (Fischer et al.'s code) | {cells[0]} | "
                     f"{votes_needed(votes, m, alpha, c)} | {' | '.join(cells[1:])} |\n")
    head = ("| σ | τ | correction | α (family-wise, per image) | from | votes of n a pixel needs "
            "(Holm: first step … last) | cert. pixel acc | abstain | cert. mIoU |\n"
            "| ---: | ---: | --- | --- | --- | --- | ---: | ---: | ---: |\n")
    return lines, head


def median_alpha_rows(out: Path) -> tuple[list[str], str]:
    """Per σ, the mean certified width at each ε with our α (0.001 over all bounds: Bonferroni)
    and Chiang et al.'s (1e-5 for each bound alone), with the order statistics X_(k) that bound
    the median at each level (``smoothcert.stats.median``); their widths where that run's file
    exists (AUTHORS_RUNS), else not run."""
    from smoothcert.certifiers.columns import parse_vector
    from smoothcert.evaluation.dense import summarize_median
    from smoothcert.runs.records import read_records
    from smoothcert.stats.median import order_indices, side_alpha

    lines, grid = [], ()
    for s in SIGMAS:
        files = [out / "records" / f"median_s{s}{tail}.tsv" for tail in ("", "_a1e-5")]
        if not files[0].is_file():
            continue
        r = read_records(files[0])
        grid, outputs = summarize_median(r).eps, len(parse_vector(r["median"][0]))
        n, p, sigma = int(r["n"][0]), float(r["percentile"][0]), float(SIGMAS[s])
        for f, label, level in (
                (files[0], f"{r['alpha'][0]:g} for all bounds (ours)",
                 side_alpha(float(r["alpha"][0]), outputs, len(grid), "bonferroni")),
                (files[1], f"{AUTHORS_ALPHA['median']:g} each bound (Chiang et al.'s code)",
                 side_alpha(AUTHORS_ALPHA["median"], outputs, len(grid), "none"))):
            widths = summarize_median(read_records(f)).width if f.is_file() else None
            cells = []
            for e, eps in enumerate(grid):
                k = order_indices(n, p, eps / sigma, level)
                w = f"{widths[e]:.3f}" if widths else "not run"
                cells.append(f"{w} (X({k.k_lower}) … X({k.k_upper}))")
            source = f"records/{f.name}" if f.is_file() else (
                f"`python studies/segmentation-and-boxes/run.py --only {f.stem}`")
            lines.append(f"| {SIGMAS[s]} | {label} | {level:.2g} | {source} | "
                         f"{' | '.join(cells)} |\n")
    head = ("| σ | α | per bound | from | "
            + " | ".join(f"w@{e:g} (its order statistics)" for e in grid)
            + " |\n| ---: | --- | ---: | --- | " + " | ".join("---" for _ in grid) + " |\n")
    return lines, head


if __name__ == "__main__":
    sys.exit(main())
