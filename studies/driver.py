"""What the study drivers share: one CLI call that stops the driver when it fails, the flags
every driver takes (--data-root, --quick, --out), and where a run writes.

A driver is a user of the library: it calls the ``smoothcert`` command line, and the Python API
only for what the command line does not print (the paired bootstrap intervals of its verdicts,
:func:`acr_interval`). ``--quick`` writes under ``runs/studies-quick/<topic>/`` (or ``--out``),
never over the committed records.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOOTHCERT = [sys.executable, "-m", "smoothcert.cli"]


# the verdicts' paired bootstrap: resampled image sets and the generator's seed (fixed, so a
# rerun of the report writes the same intervals)
RESAMPLES, SEED = 10_000, 0


def acr_interval(first: Path, second: Path, level: float = 0.95):
    """Paired bootstrap interval of ACR(second) − ACR(first) on the images both record files
    hold (``smoothcert.evaluation.intervals``)."""
    from smoothcert.evaluation.intervals import acr_difference
    from smoothcert.runs.records import read_records

    return acr_difference(read_records(first), read_records(second), resamples=RESAMPLES,
                          seed=SEED, level=level)


def accuracy_interval(first: Path, second: Path, radius: float, level: float = 0.95):
    """Paired bootstrap interval of the difference (second − first) in certified accuracy at
    ``radius`` on the images both record files hold."""
    from smoothcert.evaluation.intervals import certified_accuracy_difference
    from smoothcert.runs.records import read_records

    return certified_accuracy_difference(read_records(first), read_records(second), radius,
                                         resamples=RESAMPLES, seed=SEED, level=level)


def interval_cell(interval, digits: int = 3) -> str:
    """An interval as a table cell: ``+0.175 [+0.081, +0.272]``."""
    e, lo, hi = (f"{v:+.{digits}f}" for v in (interval.estimate, interval.low, interval.high))
    return f"{e} [{lo}, {hi}]"


def call(cmd: list[str], capture: bool = False) -> str:
    """Run one command; its failure ends the driver with its exit code (the command said why).
    Returns its standard output when ``capture``, else "" (the output went to the terminal)."""
    done = subprocess.run(cmd, stdout=subprocess.PIPE if capture else None, text=True)
    if done.returncode:
        sys.exit(f"failed (exit {done.returncode}): {' '.join(cmd)}")
    return done.stdout or ""


def parser(doc: str, topic: str, writes: str = "records and README.md") -> argparse.ArgumentParser:
    """The flags every driver takes; ``doc`` is the driver's module docstring."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--data-root", help="folder of the Fashion-MNIST files")
    p.add_argument("--quick", action="store_true", help="toy sizes (the smoke test)")
    p.add_argument("--out", help=f"where {writes} go (default: the study's folder; "
                                 f"--quick: runs/studies-quick/{topic})")
    return p


def start(argv, doc: str, here: Path, topic: str, runs) -> tuple:
    """A driver's flags parsed (the shared ones, ``--device`` and ``--only NAME ...`` of
    ``runs``) and where it writes prepared: (args, out, work, README path). ``work`` holds the
    trained models: ``runs/<topic>/`` (out of git), or ``out/work`` for ``--quick``."""
    p = parser(doc, topic)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    p.add_argument("--only", nargs="*", choices=sorted(runs), help="run only these")
    args = p.parse_args(argv)
    out = output_folder(args, here, topic)
    work = out / "work" if args.quick else ROOT / "runs" / topic
    (out / "records").mkdir(parents=True, exist_ok=True)
    return args, out, work, readme(out, here)


def quick_readme(here: Path, out: Path) -> str:
    """Run the driver in ``here`` with ``--quick`` into ``out`` (on Debian's Fashion-MNIST
    where it is installed) and return the README it wrote: what a smoke test reads."""
    data = "/usr/share/datasets/fashion-mnist"
    cmd = [sys.executable, str(here / "run.py"), "--quick", "--out", str(out),
           *(["--data-root", data] if Path(data).is_dir() else [])]
    subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    return (out / "README.md").read_text()


def output_folder(args, here: Path, topic: str) -> Path:
    """Where this call writes: ``--out``, else the quick folder, else the study's own."""
    if args.out:
        return Path(args.out)
    return ROOT / "runs" / "studies-quick" / topic if args.quick else here


def data_flags(args) -> list[str]:
    return ["--data-root", args.data_root] if args.data_root else []


def readme(out: Path, here: Path) -> Path:
    """The README whose generated blocks this call fills: the study's own, or a copy in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    doc = out / "README.md"
    if not doc.exists():
        shutil.copyfile(here / "README.md", doc)
    return doc


def splice_block(doc: Path, name: str, text: str) -> bool:
    """Replace the lines between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->`` of
    ``doc`` with ``text``; False (nothing written) when ``doc`` has no such block."""
    lines = doc.read_text(encoding="utf-8").splitlines(keepends=True)
    try:
        start = lines.index(f"<!-- report:{name} -->\n")
        end = lines.index(f"<!-- /report:{name} -->\n", start)
    except ValueError:
        return False
    doc.write_text("".join(lines[:start + 1]) + text + "".join(lines[end:]), encoding="utf-8")
    return True


def complete(path: Path, rows: int) -> bool:
    """Whether the record file at ``path`` holds at least ``rows`` rows (its header aside)."""
    return path.is_file() and sum(1 for _ in path.open()) > rows


def report_blocks(out: Path, doc: Path, blocks: dict) -> None:
    """``smoothcert report FILES FLAGS --into doc --block NAME`` for each NAME: (record file
    names under ``out``/records, report flags) of ``blocks`` whose files all exist."""
    for block, (names, flags) in blocks.items():
        files = [str(out / "records" / f"{name}.tsv") for name in names]
        if all(Path(f).is_file() for f in files):
            print(call([*SMOOTHCERT, "report", *files, *flags, "--into", str(doc),
                        "--block", block], capture=True), end="")


def write_verdicts(out: Path, doc: Path, verdicts) -> None:
    """The paired intervals of ``verdicts`` — (README block, norm or None, first, second,
    radii) — one table per block, where both record files exist."""
    rows: dict[str, list[str]] = {}
    for block, norm, first, second, radii in verdicts:
        a, b = (out / "records" / f"{n}.tsv" for n in (first, second))
        if a.is_file() and b.is_file():
            rows.setdefault(block, []).append(verdict_row(a, b, norm, radii))
    for block, lines in rows.items():
        head = ("| second − first | images | ACR | certified accuracy at r |\n"
                "| --- | ---: | --- | --- |\n")
        splice_block(doc, block, head + "".join(lines))


def verdict_row(first: Path, second: Path, norm, radii) -> str:
    """One row: the ACR and certified-accuracy differences (second − first, radii in ``norm``;
    None: each file's own) with 95% paired bootstrap intervals (RESAMPLES resamples, seed SEED)
    and the verdict each interval gives."""
    from smoothcert.evaluation.intervals import (
        acr_difference,
        certified_accuracy_difference,
        verdict,
    )
    from smoothcert.evaluation.norms import in_norm
    from smoothcert.runs.records import read_records

    a, b = (in_norm(read_records(path), norm) for path in (first, second))
    options = {"resamples": RESAMPLES, "seed": SEED}
    acr = acr_difference(a, b, **options)
    cells = [f"r={r:g}: {interval_cell(i)} {verdict(i)}" for r, i in
             ((r, certified_accuracy_difference(a, b, r, **options)) for r in radii)]
    return (f"| {second.stem} − {first.stem} | {acr.count} | {interval_cell(acr)} "
            f"{verdict(acr)} | {'; '.join(cells)} |\n")


def generated_block(doc: str, name: str) -> list[str]:
    """The lines between ``<!-- report:NAME -->`` and its end marker in the README text
    ``doc`` (what a driver's smoke test reads back)."""
    inside = doc.split(f"<!-- report:{name} -->\n")[1]
    return inside.split(f"<!-- /report:{name} -->")[0].splitlines()

