"""Tables of record files (and of training runs), generated from files, never edited by hand.

Columns: name, n, clean accuracy, abstention rate, ACR, then certified accuracy at each radius
(``r=0.25``, ...). ``md`` and ``latex`` show accuracies in percent with one decimal and ACR with
three; ``csv`` and ``json`` keep full float precision as fractions in [0, 1]. PREDICT files (no
radius column) show their accuracy and abstention rate and leave the radius columns empty
(``–`` in md, ``--`` in LaTeX, empty in csv, null in json). ``envelope=True`` adds a row
``envelope``: the best certified accuracy over the files at each radius (the σ-envelope).
Data-dependent files add ``adjusted`` (certificates the memory changed) and, since their σ_x
varies over the rows, ``σ_x min``, ``σ_x mean``, ``σ_x max`` (keys ``sigma_min``, ...).

Attack record files (``smoothcert attack``; recognised by their ``success`` and ``distance``
columns, so hand-written and merged files work too) get their own table: name, attack, n, clean
accuracy, attacked (the fraction of the clean-correct examples whose smoothed prediction was
flipped), median and mean distance (:class:`~smoothcert.evaluation.metrics.AttackSummary` says how
failed
attacks count), then the attack curve at each distance (``d<=0.25``: fraction flipped within
0.25). Attack files and certification files cannot share one table.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import yaml

from ..errors import SmoothcertError
from ..io import read_tsv, write_text_atomic
from ..registry import Registry
from ..runs.records import distinct_labels, read_manifest, read_records
from .metrics import (
    Agreement,
    AttackSummary,
    Summary,
    average_certified_radius,
    certified_accuracy_envelope,
    certified_agreement,
    is_attack_records,
    parse_radii,
    summarize,
    summarize_attack,
)


@dataclasses.dataclass(frozen=True)
class Table:
    """A report table: raw values per row, and per column a key (csv/json), a header (md/latex)
    and a style saying how md/latex show the value (``text``, ``int``, ``percent``, ``float4``,
    ``float3``, ``float2``). Missing values are None."""

    keys: tuple
    headers: tuple
    styles: tuple
    rows: tuple


Formatter = Callable[[Table], str]
FORMATS: Registry = Registry("report format")  # Table -> text
register_format = FORMATS.register


def get_format(name: str) -> Formatter:
    return FORMATS[name]


def report(paths: Iterable, radii, fmt: str = "md", plot=None, *, envelope: bool = False,
           ecdf=None, sigma_hist=None, common: bool = False) -> str:
    """Read each record file, summarize it at ``radii`` and return the table in format ``fmt``.

    ``paths`` is one path or several; ``radii`` is a sequence of floats or a string for
    :func:`~smoothcert.evaluation.metrics.parse_radii`.
    If ``plot`` is a path, the certified-accuracy-vs-radius figure of the files is written there
    (the attack curves, for attack files). ``envelope`` adds the σ-envelope row (and curve);
    ``ecdf``, a path, receives the p̂_A ECDF figure of the files (Sun et al. 2024, Fig. 3);
    ``sigma_hist``, a path, the histogram of each file's per-example σ (its ``sigma`` column:
    σ_x for data-dependent files). When some file's σ varies over its rows, the table gets the
    columns ``σ_x min``, ``σ_x mean``, ``σ_x max`` (see :func:`certification_table`).
    ``common`` restricts every file to the examples (idx) that all of them hold, so files of
    different lengths over the same images are compared on the same images.
    """
    formatter = get_format(fmt)  # fail on a bad name before reading anything
    radii = _radii(radii)
    records = _labelled_records(paths)
    if common:
        records = common_examples(records)
    if _attack_files(records):
        if envelope or ecdf is not None or sigma_hist is not None:
            raise SmoothcertError("the envelope, the p̂_A ECDF and the σ histogram need CERTIFY "
                                  "record files, not attack records")
        return formatter(_attack_report(records, radii, plot))
    if envelope:
        _check_same_examples(records)
    summaries = [summarize(r, radii) for r in records]
    table = certification_table(summaries, radii)
    if envelope:
        best_clean = max(s.clean_accuracy for s in summaries)
        table = with_envelope(table, certified_accuracy_envelope(records, radii), best_clean)
    _figures(records, plot, envelope, ecdf, sigma_hist)
    return formatter(table)


def _figures(records: Sequence, plot, envelope: bool, ecdf, sigma_hist) -> None:
    """Write the figures asked for, after checking every file for all of them (so that a bad
    file leaves no figure written)."""
    from .metrics import pa_hat

    for r in records:
        if ecdf is not None:
            pa_hat(r)
        if sigma_hist is not None and "sigma" not in r:
            raise SmoothcertError(f"--sigma-hist needs a sigma column (σ per example); {r.path} "
                                  "has none")
    if plot is not None:
        from .plots import plot_certified_accuracy

        plot_certified_accuracy(records, plot, envelope=envelope)
    if ecdf is not None:
        from .plots import plot_pa_ecdf

        plot_pa_ecdf(records, ecdf)
    if sigma_hist is not None:
        from .plots import plot_sigma_histogram

        plot_sigma_histogram(records, sigma_hist)


def common_examples(records: Sequence) -> list:
    """Each file restricted to the idx every file holds (rows kept in file order)."""
    shared = set.intersection(*(set(r["idx"].tolist()) for r in records))
    if not shared:
        raise SmoothcertError("--common: the files share no example (idx)")
    out = []
    for r in records:
        keep = np.isin(r["idx"], sorted(shared))
        out.append(dataclasses.replace(r, data={k: v[keep] for k, v in r.data.items()}))
    return out


def _check_same_examples(records: Sequence) -> None:
    """The σ-envelope takes the best file at each radius, so every file must certify the same
    dataset split (as their manifests' identities say; files without a manifest, such as Cohen
    et al.'s, are taken on trust)."""
    seen = {}
    for r in records:
        identity = (r.manifest or {}).get("identity", {})
        if "dataset" in identity:
            seen.setdefault((identity["dataset"], identity.get("split")), r.path)
    if len(seen) > 1:
        (a, path_a), (b, path_b) = list(seen.items())[:2]
        raise SmoothcertError(
            f"--envelope combines files of one dataset split, but {path_a} is {a[0]} {a[1]} and "
            f"{path_b} is {b[0]} {b[1]}; report them without --envelope or in separate reports")


def agreement_report(paths: Iterable, radii, fmt: str = "md", *, common: bool = False) -> str:
    """Compare record files pairwise, example by example (1st with 2nd, 3rd with 4th, ...).

    One row per pair: the two names, n, the fraction of (example, radius) pairs on which they
    agree, ACR(second) − ACR(first) with its paired standard error, then per radius ``a/b``:
    the examples only the first certifies there / only the second (see
    :class:`~smoothcert.evaluation.metrics.Agreement`). ``common``: each pair is compared on the
    examples
    both files hold.
    """
    formatter = get_format(fmt)
    radii = _radii(radii)
    paths = _paths_and_labels(paths)[0]
    if len(paths) % 2:
        raise SmoothcertError(f"--agreement compares files in pairs; got {len(paths)} files")
    records = _labelled_records(paths)
    pairs = zip(records[::2], records[1::2])
    if common:
        pairs = (common_examples(pair) for pair in pairs)
    return formatter(agreement_table([certified_agreement(a, b, radii) for a, b in pairs]))


def agreement_table(agreements: Sequence[Agreement]) -> Table:
    radii = agreements[0].radii
    labels = [radius_label(r) for r in radii]
    return Table(
        keys=("first", "second", "n", "agreement", "acr_difference", "acr_difference_se",
              *labels),
        headers=("first", "second", "n", "agree", "ΔACR", "± SE", *labels),
        styles=("text", "text", "int", "percent", "signed3", "float3", *["text"] * len(radii)),
        rows=tuple((a.first, a.second, a.count, a.agreement, a.acr_difference,
                    a.acr_difference_se,
                    *(f"{f}/{s}" for f, s in zip(a.first_only, a.second_only)))
                   for a in agreements),
    )


def _radii(radii) -> tuple[float, ...]:
    """A sequence of floats, or a string for :func:`~smoothcert.evaluation.metrics.parse_radii`."""
    return parse_radii(radii) if isinstance(radii, str) else tuple(float(r) for r in radii)


def _labelled_records(paths) -> list:
    """Each file's records, named by :func:`~smoothcert.runs.records.distinct_labels`."""
    return [dataclasses.replace(read_records(p), label=label)
            for p, label in zip(*_paths_and_labels(paths))]


def _attack_files(records: Sequence) -> bool:
    """True if every file holds attack records, False if none; refuses a mixture."""
    kinds = [is_attack_records(r) for r in records]
    if any(kinds) and not all(kinds):
        attack = records[kinds.index(True)].path
        other = records[kinds.index(False)].path
        raise SmoothcertError(f"{attack} holds attack records but {other} does not; report "
                              "attack files and certification files separately")
    return all(kinds)


def _attack_report(records: Sequence, distances, plot) -> Table:
    table = attack_table([summarize_attack(r, distances) for r in records], distances)
    if plot is not None:
        from .plots import plot_attack_curve

        plot_attack_curve(records, plot)
    return table


def _paths_and_labels(paths, folders: bool = False) -> tuple[list, list[str]]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = list(paths)
    if not paths:
        raise SmoothcertError("report needs at least one file")
    return paths, distinct_labels(paths, strip_suffix=not folders)


def certification_table(summaries: Sequence[Summary], radii: Sequence[float]) -> Table:
    """One row per record file: name, n, clean acc, abstain, ACR, certified accuracy at radii.

    PREDICT files (no radius column) leave ACR and the radius columns empty. When a file comes
    from the memory-based certifier, an ``adjusted`` column counts the certificates it changed.
    When some file's σ varies over its rows (σ_x of data-dependent smoothing), the columns
    ``σ_x min``, ``σ_x mean``, ``σ_x max`` follow (a fixed-σ file: its σ three times; a file
    without a sigma column: empty); otherwise the table is as it was before those columns.
    """
    labels = [radius_label(r) for r in radii]
    table = Table(
        keys=("name", "n", "clean_accuracy", "abstention_rate", "acr", *labels),
        headers=("name", "n", "clean acc", "abstain", "ACR", *labels),
        styles=("text", "int", "percent", "percent", "float3", *["percent"] * len(radii)),
        rows=tuple((s.name, s.count, *_values(s)) for s in summaries),
    )
    if any(s.adjusted is not None for s in summaries):
        table = with_columns(table, [("adjusted", "adjusted", "int")],
                             [(s.adjusted,) for s in summaries])
    if any(s.sigma_varies for s in summaries):
        table = with_columns(table, SIGMA_COLUMNS, [s.sigma or (None,) * 3 for s in summaries])
    return table


SIGMA_COLUMNS = (("sigma_min", "σ_x min", "float4"), ("sigma_mean", "σ_x mean", "float4"),
                 ("sigma_max", "σ_x max", "float4"))
"""(key, header, style) of the per-example σ columns of :func:`certification_table` (four
decimals: at the paper's α_σ = 1e-4, σ_x often differs from σ only in the third)."""


def with_columns(table: Table, columns: Sequence[tuple], values: Sequence[tuple]) -> Table:
    """``table`` with ``columns`` ((key, header, style) each) appended; ``values[i]`` holds
    row i's values of them."""
    keys, headers, styles = zip(*columns)
    return Table(keys=(*table.keys, *keys), headers=(*table.headers, *headers),
                 styles=(*table.styles, *styles),
                 rows=tuple((*row, *extra) for row, extra in zip(table.rows, values)))


ENVELOPE = "envelope"  # the name of the σ-envelope row


def with_envelope(table: Table, envelope: Sequence[float], clean: float | None = None) -> Table:
    """``table`` (a :func:`certification_table`) plus the row ``envelope``: certified accuracy
    ``envelope[i]`` at each radius and ``clean``, the best clean accuracy over the files (for
    CERTIFY files, the envelope at radius 0); n, abstention and ACR stay empty (the envelope is
    not one classifier)."""
    row = (ENVELOPE, None, clean, None, None, *(float(v) for v in envelope))
    row += (None,) * (len(table.keys) - len(row))  # e.g. the memory certifier's ``adjusted``
    return dataclasses.replace(table, rows=(*table.rows, row))


def attack_table(summaries: Sequence[AttackSummary], distances: Sequence[float]) -> Table:
    """One row per attack record file: name, attack, n, clean acc, attacked, median and mean
    distance, and the attack curve (fraction of attacked examples flipped) at ``distances``."""
    keys = [distance_label(d) for d in distances]
    return Table(
        keys=("name", "attack", "n", "clean_accuracy", "attacked", "median_distance",
              "mean_distance", *keys),
        headers=("name", "attack", "n", "clean acc", "attacked", "median dist", "mean dist",
                 *(k.replace("<=", "≤") for k in keys)),
        styles=("text", "text", "int", "percent", "percent", "float3", "float3",
                *["percent"] * len(keys)),
        rows=tuple((s.name, s.attack, s.count, s.clean_accuracy, s.success_rate,
                    s.median_distance, s.mean_distance, *s.attacked_at) for s in summaries),
    )


# --------------------------------------------------------------------------- cell values
def radius_label(r: float) -> str:
    """``r=0.25``: the shortest decimal that reads back as ``r`` (1.0 → ``r=1``)."""
    return "r=" + np.format_float_positional(float(r), trim="-")


def distance_label(d: float) -> str:
    """``d<=0.25``: the attack-curve column of distance d."""
    return "d<=" + np.format_float_positional(float(d), trim="-")


def _values(s: Summary) -> list:
    """The row as numbers (fractions), None where a PREDICT file has no value."""
    cert = list(s.certified_accuracy) if s.has_radius else [None] * len(s.radii)
    return [s.clean_accuracy, s.abstention_rate, s.acr, *cert]


_STYLES = {
    "text": str,
    "int": lambda v: str(int(v)),
    "percent": lambda v: f"{100 * v:.1f}%",
    "float3": lambda v: f"{v:.3f}",
    "signed3": lambda v: f"{v:+.3f}",
    "float4": lambda v: f"{v:.4f}",
    "float2": lambda v: f"{v:.2f}",
}


def _display(table: Table, missing: str) -> list[list[str]]:
    """Cells as md/latex show them (the percent sign is added back by LaTeX's escaping)."""
    return [[missing if v is None else _STYLES[style](v) for v, style in zip(row, table.styles)]
            for row in table.rows]


# --------------------------------------------------------------------------- formats
@register_format("md")
def format_markdown(table: Table) -> str:
    """A GitHub markdown table; accuracies in percent."""
    rows = [[_md_escape(row[0]), *row[1:]] for row in _display(table, "–")]
    align = ["---" if style == "text" else "---:" for style in table.styles]
    lines = ["| " + " | ".join(cells) + " |" for cells in [list(table.headers), align, *rows]]
    return "\n".join(lines) + "\n"


@register_format("latex")
def format_latex(table: Table) -> str:
    """A ``tabular`` with booktabs rules (``\\usepackage{booktabs}``); accuracies in percent."""
    header = [_latex_header(h) for h in table.headers]
    rows = [[_latex_escape(cell) if cell != "--" else cell for cell in row]
            for row in _display(table, "--")]
    lines = [
        r"\begin{tabular}{" + "".join("l" if s == "text" else "r" for s in table.styles) + "}",
        r"\toprule",
        " & ".join(header) + r" \\",
        r"\midrule",
        *(" & ".join(cells) + r" \\" for cells in rows),
        r"\bottomrule",
        r"\end{tabular}",
    ]
    return "\n".join(lines) + "\n"


def _latex_header(header: str) -> str:
    if header.startswith("r=") or header == "n":
        return f"${header}$"
    if header.startswith("σ_x "):
        return f"$\\sigma_x$ {header[4:]}"
    if header.startswith("d≤"):
        return f"$d \\le {header[2:]}$"
    return _latex_escape(header)


@register_format("csv")
def format_csv(table: Table) -> str:
    """Comma-separated, header line first; fractions at full precision, empty when missing."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.keys)
    for row in table.rows:
        writer.writerow(["" if v is None else _csv_cell(v) for v in row])
    return out.getvalue()


def _csv_cell(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


@register_format("json")
def format_json(table: Table) -> str:
    """A list of objects, one per row; fractions as floats, null when missing."""
    rows = [dict(zip(table.keys, (_json_value(v) for v in row))) for row in table.rows]
    return json.dumps(rows, indent=2) + "\n"


def _json_value(value):
    """Plain JSON: numpy scalars as Python numbers; an infinite value (a median distance when
    most attacks failed) as null, since JSON has no infinity."""
    value = value.item() if isinstance(value, np.generic) else value
    return None if isinstance(value, float) and not math.isfinite(value) else value


# --------------------------------------------------------------------------- escaping
def _md_escape(text: str) -> str:
    return text.replace("|", r"\|")


_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text)


# --------------------------------------------------------------------------- training cost
@dataclasses.dataclass(frozen=True)
class TrainRun:
    """What a run folder says about the cost of its training (Jeong & Shin's Table 3 columns)."""

    name: str
    method: str
    num_hparams: int
    epochs: int
    seconds_per_epoch: float
    peak_mem_mb: float | None  # None for runs logged before memory was recorded
    acr: float | None  # of the first CERTIFY record file in the folder, if any


def read_run(run_dir, name: str | None = None) -> TrainRun:
    """Summarize a training run folder: log.tsv, the method from checkpoint.pt (or, where the
    checkpoint stays out of git, from the config.yaml the trainer writes beside it) and the ACR of
    the first CERTIFY record file in it."""
    run_dir = Path(run_dir)
    _check_run_folder(run_dir)
    log = _read_log(run_dir / "log.tsv")
    method, hparams, num_hparams = _run_method(run_dir)
    return TrainRun(
        name=name or run_dir.name,
        method=method,
        num_hparams=num_hparams if num_hparams is not None else len(hparams),
        epochs=len(log["seconds"]),
        seconds_per_epoch=float(np.mean(log["seconds"])),
        peak_mem_mb=float(np.max(log["peak_mem_mb"])) if "peak_mem_mb" in log else None,
        acr=_run_acr(run_dir),
    )


def _check_run_folder(run_dir: Path) -> None:
    if not ((run_dir / "checkpoint.pt").is_file() or (run_dir / "config.yaml").is_file()):
        raise SmoothcertError(
            f"{run_dir} is not a training run folder (no checkpoint.pt or config.yaml)")


def _run_method(run_dir: Path) -> tuple[str, dict, int | None]:
    """(method name, hyperparameters, recorded #HP or None) of a run folder."""
    if (run_dir / "checkpoint.pt").is_file():
        from ..models.checkpoint import load_checkpoint

        meta = load_checkpoint(run_dir / "checkpoint.pt").meta
        hparams = meta["method"].get("hparams", {})
        return meta["method"]["name"], hparams, meta.get("num_hparams")
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        return config["method"], dict(config.get("method_params") or {}), None
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        raise SmoothcertError(f"cannot read the method of {run_dir / 'config.yaml'}: {e}") from e


def _read_log(path: Path) -> dict:
    """The columns of a training log.tsv (it has the record-file layout, keyed by ``epoch``)."""
    try:
        lines = read_tsv(path)  # complete lines: not a row being written
    except OSError as e:
        raise SmoothcertError(f"cannot read training log {path}: {e.strerror}") from e
    header, rows = lines[0] if lines else [], [row for row in lines[1:] if row != [""]]
    if not rows:
        raise SmoothcertError(f"training log {path} has no completed epoch")
    return {k: np.array([float(r[i]) for r in rows]) for i, k in enumerate(header)}


def _run_acr(run_dir: Path) -> float | None:
    for path in sorted(run_dir.glob("*.tsv")):
        manifest = read_manifest(path)
        if manifest is not None and manifest.get("kind") == "certify":
            return average_certified_radius(read_records(path))
    return None


def training_table(runs: Sequence[TrainRun]) -> Table:
    return Table(
        keys=("name", "method", "num_hparams", "epochs", "seconds_per_epoch", "peak_mem_mb",
              "acr"),
        headers=("name", "method", "#HP", "epochs", "s/epoch", "peak MB", "ACR"),
        styles=("text", "text", "int", "int", "float2", "float2", "float3"),
        rows=tuple(dataclasses.astuple(r) for r in runs),
    )


def train_report(run_dirs: Iterable, fmt: str = "md") -> str:
    """The training-cost table of run folders: method, #HP, seconds per epoch, peak memory, ACR."""
    formatter = get_format(fmt)
    paths, labels = _paths_and_labels(run_dirs, folders=True)
    return formatter(training_table([read_run(p, label) for p, label in zip(paths, labels)]))


# --------------------------------------------------------------------------- generated blocks
def block_markers(name: str) -> tuple[str, str]:
    """The comment lines that open and close the generated block ``name`` of a Markdown file."""
    return f"<!-- report:{name} -->", f"<!-- /report:{name} -->"


def splice_block(doc, name: str, text: str) -> None:
    """Replace the lines between the markers of block ``name`` in ``doc`` by ``text``.

    Lets a hand-written document (docs/RESULTS.md) hold tables that are only ever written by
    ``smoothcert report``: regenerating them rewrites the blocks and leaves the prose alone. The
    document is rewritten atomically, so a failure leaves it as it was.
    """
    doc = Path(doc)
    lines, start, end = _block_span(doc, name)
    body = text if text.endswith("\n") else text + "\n"
    write_text_atomic(doc, "".join(lines[:start + 1]) + body + "".join(lines[end:]))


def check_block(doc, name: str) -> None:
    """Raise unless ``doc`` holds the block ``name`` exactly once (so a report fails before it
    computes anything)."""
    _block_span(Path(doc), name)


def _block_span(doc: Path, name: str) -> tuple[list[str], int, int]:
    if not re.fullmatch(r"[A-Za-z0-9_.]+", name):
        raise SmoothcertError(f"block name {name!r}: use letters, digits, '_' or '.'")
    if not doc.is_file():
        raise SmoothcertError(f"document {doc} does not exist")
    lines = doc.read_text(encoding="utf-8").splitlines(keepends=True)
    opening, closing = block_markers(name)
    starts = [i for i, line in enumerate(lines) if line.strip() == opening]
    ends = [i for i, line in enumerate(lines) if line.strip() == closing]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise SmoothcertError(
            f"{doc} must hold the block {name!r} once: a line {opening} followed by a line "
            f"{closing} (found {len(starts)} opening and {len(ends)} closing lines)")
    return lines, starts[0], ends[0]
