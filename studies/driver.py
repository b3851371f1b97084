"""What the study drivers share: one CLI call that stops the driver when it fails, the flags
every driver takes (--data-root, --quick, --out), and where a run writes.

A driver is a user of the library: it calls the ``smoothcert`` command line, and the Python API
only for what the command line does not print (the paired bootstrap intervals of its verdicts,
:func:`acr_interval`). Every verdict word a study writes (reproduced, not reproduced, tie,
underpowered) comes from one rule, :func:`judge`, applied to an interval and the claim's
smallest effect of interest. ``--quick`` writes under ``runs/studies-quick/<topic>/`` (or
``--out``), never over the committed records.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
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


# --------------------------------------------------------------------------- verdicts
VERDICT_WORDS = ("reproduced", "not reproduced", "tie", "underpowered")
CLAIMED = {"greater": ">", "less": "<", "equal": "≈"}  # of the difference second − first
# The smallest effect of interest where a study states no paper's effect: 2 points of certified
# accuracy, and 5% of the first file's ACR (ACR is in the radius's unit: ℓ2, ℓ∞, pixels ...).
# Ours, not a paper's; each README that uses them says so.
ACCURACY_EFFECT, ACR_SHARE = 0.02, 0.05


@dataclass(frozen=True)
class Verdict:
    """What the interval [``low``, ``high``] of a difference d = second − first (``estimate``
    its value on the sample, ``count`` its paired examples where the interval says) says about
    the claim ``claimed`` with smallest effect of interest ``effect`` (:func:`judge`, which
    defines ``word``)."""

    word: str
    estimate: float
    low: float
    high: float
    claimed: str
    effect: float
    count: int | None = None

    @property
    def detectable(self) -> float:
        """(high − low)/2: the smallest difference this sample could tell from 0 (:func:`judge`)."""
        return (self.high - self.low) / 2

    def cell(self, scale: float = 1.0, digits: int = 3) -> str:
        """``+0.015 [-0.005, +0.035] underpowered (detects ±0.020)``, values × ``scale``."""
        e, lo, hi = (f"{scale * v:+.{digits}f}" for v in (self.estimate, self.low, self.high))
        more = (f" (detects ±{scale * self.detectable:.{digits}f})"
                if self.word == "underpowered" else "")
        return f"{e} [{lo}, {hi}] {self.word}{more}"


def judge(interval, effect: float, claimed: str = "greater") -> Verdict:
    """The verdict word of a claim about d = second − first, from a two-sided confidence
    interval [L, H] of d (any object with ``estimate``, ``low``, ``high``: a paired bootstrap
    ``smoothcert.evaluation.intervals.Interval`` or another) and the claim's smallest effect of
    interest δ = ``effect`` ≥ 0 in d's units (the effect its paper reports, or a stated margin).

    ``claimed`` "greater" (d > 0), or "less" (d < 0: read [L, H] as [−H, −L] below):

    * **reproduced**: L > 0, the whole interval on the claimed side of 0;
    * **not reproduced**: H < 0, the whole interval on the other side;
    * **tie**: L ≤ 0 ≤ H with −δ < L and H < δ: 0 is inside, and a difference of δ either
      way is outside (equivalence at margin δ);
    * **underpowered**: L ≤ 0 ≤ H with L ≤ −δ or H ≥ δ: 0 is inside, and so is a difference
      as large as δ (the sample cannot tell them apart; δ = 0 never gives a tie).

    ``claimed`` "equal" (|d| < δ): **reproduced** where −δ < L and H < δ; **not reproduced**
    where the interval lies at or beyond δ (L ≥ δ or H ≤ −δ); else **underpowered**.

    The interval is closed (a bound at exactly 0 covers 0). ``Verdict.detectable`` = (H − L)/2
    is the smallest effect the sample could detect: an interval this wide centred on a
    difference e excludes 0 only where |e| exceeds it. Each verdict is at the interval's own
    level; a claim resting on several intervals holds where all of them do.
    """
    if claimed not in CLAIMED:
        raise ValueError(f"claimed must be one of {', '.join(CLAIMED)}, got {claimed!r}")
    low, high, effect = float(interval.low), float(interval.high), float(effect)
    if not (low <= high and effect >= 0):
        raise ValueError(f"need low <= high and effect >= 0, got [{low}, {high}], {effect}")
    inside = -effect < low and high < effect
    if claimed == "equal":
        beyond = low >= effect or high <= -effect
        word = "reproduced" if inside else "not reproduced" if beyond else "underpowered"
    else:
        sign = 1.0 if claimed == "greater" else -1.0
        lo, hi = sorted((sign * low, sign * high))
        word = ("reproduced" if lo > 0 else "not reproduced" if hi < 0
                else "tie" if inside else "underpowered")
    return Verdict(word, float(interval.estimate), low, high, claimed, effect,
                   getattr(interval, "count", None))


def summary(verdicts: Mapping[str, Verdict], scale: float = 1.0, digits: int = 3) -> str:
    """A claim's verdicts (label: verdict) grouped by word, an underpowered one with its
    half-width × ``scale``: ``reproduced at ACR, r=0.02; underpowered at r=0.005 (±0.020),
    r=0.01 (±0.035)``; the word alone where every label has it (but underpowered)."""
    words = [w for w in VERDICT_WORDS if any(v.word == w for v in verdicts.values())]
    if len(words) == 1 and words[0] != "underpowered":
        return words[0]
    parts = []
    for word in words:
        labels = [f"{label} (±{scale * v.detectable:.{digits}f})" if word == "underpowered"
                  else label for label, v in verdicts.items() if v.word == word]
        parts.append(f"{word} at {', '.join(labels)}")
    return "; ".join(parts)


def combine(verdicts, need: str = "all") -> str:
    """One claim's word from the verdicts of the intervals it rests on. ``need`` "all" (every
    interval must show it): not reproduced where any is, reproduced where all are, else
    underpowered where any is, else tie. "any" (one suffices; the intervals' levels carry the
    multiplicity correction): reproduced where any is, not reproduced where all are, else
    underpowered where any is, else tie. No verdicts: "—"."""
    words = {v.word for v in verdicts}
    if not words:
        return "—"
    if need not in ("all", "any"):
        raise ValueError(f"need must be all or any, got {need!r}")
    decided, other = (("not reproduced", "reproduced") if need == "all"
                      else ("reproduced", "not reproduced"))
    if decided in words:
        return decided
    if words == {other}:
        return other
    return "underpowered" if "underpowered" in words else "tie"


def side(interval, above: str, below: str) -> str:
    """Where an interval lies, for a description that is no claim's verdict: ``above`` (low >
    0), ``below`` (high < 0) or "covers 0"."""
    return above if interval.low > 0 else below if interval.high < 0 else "covers 0"


@dataclass(frozen=True)
class Comparison:
    """One verdict row: second − first (record names under records/) in ACR and in certified
    accuracy at ``radii`` (in ``norm``; None: each file's own radius), each judged by
    :func:`judge` against ``claimed`` with margin ``accuracy_effect`` (a fraction of the
    images) or, for ACR, ``acr_share`` × the first file's ACR on the paired images; ``at``
    maps a radius to its own (claimed, effect) where they differ."""

    block: str
    first: str
    second: str
    radii: tuple = ()
    norm: str | None = None
    claimed: str = "greater"
    accuracy_effect: float = ACCURACY_EFFECT
    acr_share: float = ACR_SHARE
    at: Mapping = field(default_factory=dict)

    def claim_at(self, radius: float) -> tuple[str, float]:
        return self.at.get(radius, (self.claimed, self.accuracy_effect))

    def margins(self, acr_effect: float) -> str:
        """The claim cell: ``> δ 0.02, ACR δ 0.046; r=0: > δ 0.008`` (two digits)."""
        cells = [f"{CLAIMED[self.claimed]} δ {self.accuracy_effect:.2g}, ACR δ {acr_effect:.2g}"]
        cells += [f"r={r:g}: {CLAIMED[c]} δ {e:.2g}" for r, (c, e) in self.at.items()]
        return "; ".join(cells)


def as_comparison(item) -> Comparison:
    """A :class:`Comparison`, or the older tuple (block, norm, first, second, radii) as one
    with the default claim (greater) and margins."""
    if isinstance(item, Comparison):
        return item
    block, norm, first, second, radii = item
    return Comparison(block, first, second, tuple(radii), norm)


def compare(out: Path, c: Comparison) -> tuple[int, float, dict[str, Verdict]] | None:
    """(paired images, ACR margin, {"ACR" or "r=R": verdict}) of ``c`` on the record files
    under ``out``/records; None where one is missing. Intervals: 95% paired bootstrap
    (RESAMPLES resamples, seed SEED)."""
    from smoothcert.evaluation.intervals import (
        acr_difference,
        certified_accuracy_difference,
        paired_values,
    )
    from smoothcert.evaluation.metrics import certified_radii
    from smoothcert.evaluation.norms import in_norm
    from smoothcert.runs.records import read_records

    paths = [out / "records" / f"{name}.tsv" for name in (c.first, c.second)]
    if not all(p.is_file() for p in paths):
        return None
    a, b = (in_norm(read_records(p), c.norm) for p in paths)
    options = {"resamples": RESAMPLES, "seed": SEED}
    acr = acr_difference(a, b, **options)
    acr_effect = c.acr_share * float(paired_values(a, b, certified_radii)[1].mean())
    found = {"ACR": judge(acr, acr_effect, c.claimed)}
    for r in c.radii:
        found[f"r={r:g}"] = judge(certified_accuracy_difference(a, b, r, **options),
                                  c.claim_at(r)[1], c.claim_at(r)[0])
    return acr.count, acr_effect, found


def write_verdicts(out: Path, doc: Path, verdicts) -> dict:
    """One table per README block of ``verdicts`` (:class:`Comparison` objects, or older tuples:
    :func:`as_comparison`), a row per comparison whose record files both exist: its margins
    and each interval with its verdict. Returns {(first, second): {label: Verdict}}."""
    rows: dict[str, list[str]] = {}
    found = {}
    for c in map(as_comparison, verdicts):
        result = compare(out, c)
        if result is None:
            continue
        count, acr_effect, judged = result
        found[c.first, c.second] = judged
        cells = [f"{label}: {v.cell()}" for label, v in judged.items() if label != "ACR"]
        rows.setdefault(c.block, []).append(
            f"| {c.second} − {c.first} | {count} | {c.margins(acr_effect)} | "
            f"{judged['ACR'].cell()} | {'; '.join(cells)} |\n")
    for block, lines in rows.items():
        head = ("| second − first | images | claimed, margin δ | ACR | certified accuracy at r |\n"
                "| --- | ---: | --- | --- | --- |\n")
        splice_block(doc, block, head + "".join(lines))
    return found


def generated_block(doc: str, name: str) -> list[str]:
    """The lines between ``<!-- report:NAME -->`` and its end marker in the README text
    ``doc`` (what a driver's smoke test reads back)."""
    inside = doc.split(f"<!-- report:{name} -->\n")[1]
    return inside.split(f"<!-- /report:{name} -->")[0].splitlines()

