"""Tables of record files: one row per file, generated from the records, never edited by hand.

Columns: name, n, clean accuracy, abstention rate, ACR, then certified accuracy at each radius
(``r=0.25``, ...). ``md`` and ``latex`` show accuracies in percent with one decimal and ACR with
three; ``csv`` and ``json`` keep full float precision as fractions in [0, 1]. PREDICT files (no
radius column) show their accuracy and abstention rate and leave the radius columns empty
(``–`` in md, ``--`` in LaTeX, empty in csv, null in json).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from .errors import SmoothcertError
from .metrics import Summary, parse_radii, summarize
from .records import distinct_labels, read_records
from .registry import Registry

Formatter = Callable[[Sequence[Summary], Sequence[float]], str]
FORMATS: Registry = Registry("report format")  # (summaries, radii) -> text
register_format = FORMATS.register


def get_format(name: str) -> Formatter:
    return FORMATS[name]


def report(paths: Iterable, radii, fmt: str = "md", plot=None) -> str:
    """Read each record file, summarize it at ``radii`` and return the table in format ``fmt``.

    ``paths`` is one path or several; ``radii`` is a sequence of floats or a string for
    :func:`~smoothcert.metrics.parse_radii`.
    If ``plot`` is a path, the certified-accuracy-vs-radius figure of the files is written there.
    """
    formatter = get_format(fmt)  # fail on a bad name before reading anything
    radii = parse_radii(radii) if isinstance(radii, str) else tuple(float(r) for r in radii)
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = list(paths)
    if not paths:
        raise SmoothcertError("report needs at least one record file")
    records = [dataclasses.replace(read_records(p), label=label)
               for p, label in zip(paths, distinct_labels(paths))]
    summaries = [summarize(r, radii) for r in records]
    if plot is not None:
        from .plots import plot_certified_accuracy

        plot_certified_accuracy(records, plot)
    return formatter(summaries, radii)


# --------------------------------------------------------------------------- cell values
def radius_label(r: float) -> str:
    """``r=0.25``: the shortest decimal that reads back as ``r`` (1.0 → ``r=1``)."""
    return "r=" + np.format_float_positional(float(r), trim="-")


def _values(s: Summary) -> list:
    """The row as numbers (fractions), None where a PREDICT file has no value."""
    cert = list(s.certified_accuracy) if s.has_radius else [None] * len(s.radii)
    return [s.clean_accuracy, s.abstention_rate, s.acr, *cert]


def _percent(x: float | None, missing: str, percent_sign: str) -> str:
    return missing if x is None else f"{100 * x:.1f}{percent_sign}"


def _display_row(s: Summary, missing: str, percent_sign: str) -> list[str]:
    clean, abstain, acr, *cert = _values(s)
    return [
        str(s.count),
        _percent(clean, missing, percent_sign),
        _percent(abstain, missing, percent_sign),
        missing if acr is None else f"{acr:.3f}",
        *(_percent(c, missing, percent_sign) for c in cert),
    ]


# --------------------------------------------------------------------------- formats
@register_format("md")
def format_markdown(summaries: Sequence[Summary], radii: Sequence[float]) -> str:
    """A GitHub markdown table; accuracies in percent."""
    header = ["name", "n", "clean acc", "abstain", "ACR", *map(radius_label, radii)]
    rows = [[_md_escape(s.name), *_display_row(s, "–", "%")] for s in summaries]
    align = ["---", *["---:"] * (len(header) - 1)]
    lines = ["| " + " | ".join(cells) + " |" for cells in [header, align, *rows]]
    return "\n".join(lines) + "\n"


@register_format("latex")
def format_latex(summaries: Sequence[Summary], radii: Sequence[float]) -> str:
    """A ``tabular`` with booktabs rules (``\\usepackage{booktabs}``); accuracies in percent."""
    header = ["name", "$n$", "clean acc", "abstain", "ACR"]
    header += [f"${radius_label(r)}$" for r in radii]
    rows = [[_latex_escape(s.name), *_display_row(s, "--", r"\%")] for s in summaries]
    lines = [
        r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
        r"\toprule",
        " & ".join(header) + r" \\",
        r"\midrule",
        *(" & ".join(cells) + r" \\" for cells in rows),
        r"\bottomrule",
        r"\end{tabular}",
    ]
    return "\n".join(lines) + "\n"


MACHINE_KEYS = ("name", "n", "clean_accuracy", "abstention_rate", "acr")


def _machine_row(s: Summary) -> dict:
    keys = [*MACHINE_KEYS, *map(radius_label, s.radii)]
    return dict(zip(keys, [s.name, s.count, *_values(s)]))


@register_format("csv")
def format_csv(summaries: Sequence[Summary], radii: Sequence[float]) -> str:
    """Comma-separated, header line first; fractions at full precision, empty when missing."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*MACHINE_KEYS, *map(radius_label, radii)])
    for s in summaries:
        writer.writerow(["" if v is None else _csv_cell(v) for v in _machine_row(s).values()])
    return out.getvalue()


def _csv_cell(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


@register_format("json")
def format_json(summaries: Sequence[Summary], radii: Sequence[float]) -> str:
    """A list of objects, one per file; fractions as floats, null when missing."""
    return json.dumps([_machine_row(s) for s in summaries], indent=2) + "\n"


# --------------------------------------------------------------------------- escaping
def _md_escape(text: str) -> str:
    return text.replace("|", r"\|")


_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text)
